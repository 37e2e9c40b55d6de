"""Semantic grouping of ranker calls (docs/method.md §4.4) on hand-written calls."""
from coevo.core.config import RankerConfig
from solver.agent import Episode, Task
from solver.grouping import cluster_calls, group_calls, group_task
from solver.ranker import RankerCall


def call(sub_query, i_ans=True, rollout=0, turn=0, generated=True):
    return RankerCall(q0="q0", sub_query=sub_query, task_id="t", rollout_idx=rollout, turn=turn, mode="trainable",
                      candidate_ids=["a", "b"], chosen_ids=["a"], format_ok=True, reason="ok", i_ans=i_ans,
                      relevant=[i_ans, False], prompt_ids=[1], completion_ids=[2] if generated else [])


def episode(rollout, calls, format_ok=True):
    ep = Episode(task=Task("t", "q0", ["x"]), rollout_idx=rollout, token_ids=[], loss_mask=[], logprobs=None,
                 prompt_len=0, end_reason="answer" if format_ok else "no_action")
    ep.ranker_calls = calls
    return ep


def subs(groups):
    return [[(c.rollout_idx, c.turn, c.sub_query) for c in g] for g in groups]


def test_cluster_joins_first_group_at_delta_edge():
    # token F1: "capital france" vs "capital france paris" = 0.8 (joins, >= delta); vs "paris france" = 0.5
    calls = [call("capital france"), call("capital france paris"), call("paris france"), call("capital of france")]
    assert [[c.sub_query for c in g] for g in cluster_calls(calls, 0.8)] == [
        ["capital france", "capital france paris", "capital of france"], ["paris france"]]


def test_cluster_below_delta_founds_group():
    # "a1 b1 c1 d1" vs "a1 b1 c1 e1": F1 = 0.75 < 0.8
    groups = cluster_calls([call("a1 b1 c1 d1"), call("a1 b1 c1 e1")], 0.8)
    assert len(groups) == 2


def test_cluster_compares_with_representative_not_latest_member():
    # b joins a (F1 0.89); c is close to b (0.8) but not to the representative a (0.67): new group
    groups = cluster_calls([call("w1 w2 w3 w4"), call("w1 w2 w3 w4 w5"), call("w2 w3 w4 w5 w6")], 0.8)
    assert [[c.sub_query for c in g] for g in groups] == [["w1 w2 w3 w4", "w1 w2 w3 w4 w5"], ["w2 w3 w4 w5 w6"]]


def _episodes():
    return [
        episode(3, [call("capital of france", True, 3, 0), call("capital france", False, 3, 1),
                    call("river germany", False, 3, 2)]),
        episode(0, [call("capital france", True, 0, 0), call("river germany", False, 0, 1)]),
        episode(2, [call("capital france", True, 2, 0), call("river germany", False, 2, 1)], format_ok=False),
        episode(1, [call("capital france paris", True, 1, 0), call("river germany", False, 1, 1),
                    call("paris france", True, 1, 2), call("capital france", True, 1, 3, generated=False)]),
    ]


def test_group_task_semantic():
    episodes = _episodes()
    cfg = RankerConfig(preset="t", model="t", grouping="semantic", group_f1=0.8, min_group_size=3)
    groups = group_task(episodes, cfg)
    # f=0 rollout 2 dropped; I_ans split; singletons ("paris france", the I_ans=0 "capital france")
    # dropped by k_min=3; the non-generated call of rollout 1 never grouped.
    assert subs(groups) == [
        [(0, 0, "capital france"), (1, 0, "capital france paris"), (3, 0, "capital of france")],
        [(0, 1, "river germany"), (1, 1, "river germany"), (3, 2, "river germany")],
    ]
    assert [g[0].group_id for g in groups] == ["t/ans1/0", "t/ans0/0"]
    assert all(c.group_id == g[0].group_id for g in groups for c in g)
    dropped = [c for ep in episodes for c in ep.ranker_calls if c.group_id is None]
    assert sorted((c.rollout_idx, c.turn) for c in dropped) == [(1, 2), (1, 3), (2, 0), (2, 1), (3, 1)]


def test_group_task_k_min():
    cfg = RankerConfig(preset="t", model="t", min_group_size=1)
    assert len(group_task(_episodes(), cfg)) == 4  # 2 kept above + the two singletons
    cfg = RankerConfig(preset="t", model="t", min_group_size=4)
    assert group_task(_episodes(), cfg) == []


def test_by_question_is_one_group_of_all_kept_calls():
    cfg = RankerConfig(preset="t", model="t", grouping="by_question", min_group_size=3)
    (group,) = group_task(_episodes(), cfg)
    assert [(c.rollout_idx, c.turn) for c in group] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (3, 0), (3, 1),
                                                        (3, 2)]
    assert {c.group_id for c in group} == {"t/all"}


def test_by_question_keeps_k_min():
    calls = [call("a"), call("b")]
    assert group_calls(calls, "t", "by_question", min_group_size=3) == []
    assert all(c.group_id is None for c in calls)
    assert group_calls([], "t", "by_question", min_group_size=0) == []


def test_all_rollouts_format_invalid_gives_no_groups():
    cfg = RankerConfig(preset="t", model="t", min_group_size=1)
    assert group_task([episode(0, [call("x")], format_ok=False)], cfg) == []
    assert group_task([], cfg) == []
