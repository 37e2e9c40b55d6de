"""Hand-computed solver and ranker rewards (docs/method.md §4.2, §4.5), and property tests of their ranges."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coevo.core.config import RankerConfig
from coevo.core.scoring import echo_sources
from evidence.corpus import Passage
from solver.agent import Episode, Task, episode_echo_sources
from solver.ranker import RankerCall
from solver.reward import (
    correctness,
    hit_at_k,
    hit_cutoffs,
    ranker_reward,
    relevance_labels,
    relevance_reward,
    score_ranker_call,
    solver_rewards,
)

EPS = 1e-12  # float slack of c * (1 - lambda * fraction)


def approx(values):
    return pytest.approx(values, abs=1e-9)


# --- tool-aware solver reward -------------------------------------------------------------

def test_correct_rollouts_pay_for_extra_searches():
    # s = 1, 2, 3 among correct rollouts: fraction 0, 0.5, 1 -> 1 - 0.2 * fraction
    assert solver_rewards([1, 1, 1], [1, 2, 3], [True] * 3, tool_cost=0.2) == approx([1.0, 0.9, 0.8])


def test_wrong_rollout_gets_zero_and_does_not_set_the_range():
    # The wrong rollout searched 0 times; s_min stays 2 (correct rollouts only) -> 1.0, 0.8, 0
    assert solver_rewards([1, 1, 0], [2, 4, 0], [True] * 3, tool_cost=0.2) == approx([1.0, 0.8, 0.0])


def test_format_violation_is_minus_alpha_even_if_correct():
    assert solver_rewards([1, 0, 1], [1, 1, 3], [True, False, False], 0.2, 0.2) == approx([1.0, -0.2, -0.2])


def test_ties_all_equal_searches_give_full_reward():
    assert solver_rewards([1, 1, 1, 1], [2, 2, 2, 2], [True] * 4) == approx([1.0] * 4)


def test_single_correct_rollout_has_no_range():
    assert solver_rewards([0, 1, 0, 0], [0, 3, 1, 2], [True] * 4) == approx([0.0, 1.0, 0.0, 0.0])


def test_all_wrong_is_zero():
    assert solver_rewards([0, 0, 0], [1, 2, 3], [True] * 3) == approx([0.0, 0.0, 0.0])


def test_f1_correctness_scales_and_partial_rollouts_count_as_correct():
    # c = 0.5 with s=1 (s_min), c = 1 with s=3 (s_max): 0.5 * 1, 1 * (1 - 0.2)
    assert solver_rewards([0.5, 1.0], [1, 3], [True, True]) == approx([0.5, 0.8])


def test_tool_cost_lambda_is_used():
    assert solver_rewards([1, 1], [0, 2], [True, True], tool_cost=0.5) == approx([1.0, 0.5])


def test_length_mismatch_raises():
    with pytest.raises(ValueError):
        solver_rewards([1], [1, 2], [True])


def test_echo_guard_scores_an_echoed_query_wrong_and_content_f1_pays_partial_credit():
    gold = ["Abuja"]
    assert correctness("Abuja", gold, "em", echo_of=["Nigeria capital", "Abuja"]) == 0.0  # echoes its own query
    assert correctness("Abuja", gold, "em", echo_of=["What is the capital of Nigeria?", "Nigeria capital"]) == 1.0
    assert correctness("The capital is Abuja", gold, "f1_content") == pytest.approx(2 / 3)
    assert correctness("The capital is Abuja", gold, "f1") == pytest.approx(0.5)
    with pytest.raises(ValueError, match="expected one of \\['em', 'f1', 'f1_content'\\]"):
        correctness("x", gold, "acc")


PLAY = "Which play did Shakespeare write about a Danish prince?"
READ = "\n<information>Doc 1 (Title: Hamlet) Hamlet is a tragedy by William Shakespeare.</information>\n"
MISSED = "\n<information>Doc 1 (Title: Macbeth) Macbeth is a tragedy by William Shakespeare.</information>\n"


def _answered(question, queries, observations, answer="Hamlet") -> Episode:
    return Episode(Task("t1", question, ["Hamlet"]), 0, [], [], None, 0, answer=answer, end_reason="answer",
                   n_searches=len(queries), sub_queries=list(queries), observations=list(observations))


@pytest.mark.parametrize("question,queries,observations,guarded", [
    (PLAY, ["Shakespeare Danish prince play", "Hamlet"], [READ, READ], 1.0),  # read in obs 1, verified in query 2
    (PLAY, ["Shakespeare Danish prince play"], [READ], 1.0),  # read, answered
    ("What is the Danish prince play Hamlet by?", ["Hamlet author"], [READ], 0.0),  # answer in the question
    (PLAY, ["Hamlet", "Hamlet tragedy"], [READ, READ], 0.0),  # guessed in query 1 before any observation held it
    (PLAY, ["Shakespeare tragedy", "Hamlet"], [MISSED, READ], 0.0),  # searched before it was read
])
def test_the_echo_guard_pays_read_then_verify_and_not_a_copy(question, queries, observations, guarded):
    ep = _answered(question, queries, observations)
    assert correctness(ep.answer, ep.task.answers, "em", echo_of=episode_echo_sources(ep)) == guarded
    assert correctness(ep.answer, ep.task.answers, "em") == 1.0  # without the guard nothing is an echo


def test_content_f1_correctness_does_not_pay_a_shared_name_head():
    assert correctness("Mount Fuji", ["Mount Kilimanjaro"], "f1_content") == 0.0
    assert correctness("Mount Fuji", ["Kilimanjaro", "Fuji"], "f1_content") == pytest.approx(2 / 3)
    assert correctness("Mount Fuji", ["Mount Kilimanjaro"], "f1") == pytest.approx(0.5)  # plain F1 still does


def test_correctness_em_f1_and_no_answer():
    assert correctness("The Paris", ["paris"], "em") == 1.0
    assert correctness("Paris France", ["paris"], "em") == 0.0
    assert correctness("Paris France", ["paris"], "f1") == pytest.approx(2 / 3)
    assert correctness(None, ["paris"], "f1") == 0.0
    with pytest.raises(ValueError):
        correctness("x", ["x"], "bleu")


# --- composite ranker reward --------------------------------------------------------------

@pytest.mark.parametrize("top_k,expected", [(1, [1]), (2, [1, 2]), (3, [1, 3]), (4, [1, 3, 4]),
                                            (5, [1, 3, 5]), (10, [1, 3, 5])])
def test_hit_cutoffs_are_capped_and_deduplicated(top_k, expected):
    assert hit_cutoffs(top_k) == expected


def test_hit_at_k():
    assert hit_at_k([False, True, False], 1) == 0.0
    assert hit_at_k([False, True, False], 2) == 1.0
    assert hit_at_k([], 3) == 0.0


@pytest.mark.parametrize("ranked,top_k,expected", [
    ([True, False, False], 3, 1.0),        # Hit@1 = Hit@3 = 1
    ([False, False, True], 3, 0.5),        # Hit@1 = 0, Hit@3 = 1
    ([False, False, False], 3, 0.0),
    ([False, True, False, False, False], 5, 2 / 3),  # Hit@1 0, Hit@3 1, Hit@5 1
    ([False, False, False, True, False], 5, 1 / 3),  # only Hit@5
])
def test_relevance_reward(ranked, top_k, expected):
    assert relevance_reward(ranked, top_k) == pytest.approx(expected)


@pytest.mark.parametrize("format_ok,i_ans,r_rel,r_main,expected", [
    (False, True, 1.0, 1.0, -0.2),   # malformed -> -alpha whatever else
    (False, False, 0.0, 1.0, -0.2),
    (True, True, 0.5, 1.0, 0.5),     # r_rel <= gamma (boundary) -> r_rel only
    (True, True, 0.0, 1.0, 0.0),
    (True, True, 1.0, 1.0, 2.0),     # r_rel > gamma -> r_rel + r_main
    (True, True, 1.0, 0.4, 1.4),
    (True, True, 2 / 3, 0.0, 2 / 3),
    (True, False, 0.0, 0.7, 0.7),    # I_ans = 0 -> r_main
    (True, False, 0.0, 0.0, 0.0),
])
def test_ranker_reward_table(format_ok, i_ans, r_rel, r_main, expected):
    assert ranker_reward(format_ok, i_ans, r_rel, r_main, gamma=0.5, format_penalty=0.2) == pytest.approx(expected)


def test_relevance_labels_modes():
    passages = [Passage("a", "Paris", "The capital."), Passage("b", "X", "It is in Paris, France."),
                Passage("c", "Y", "Comparison text."), Passage("d", "Z", "Unrelated.")]
    answers, evidence = ["paris"], ["c", "b"]
    assert relevance_labels(passages, answers, evidence, "answer") == [True, True, False, False]
    assert relevance_labels(passages, answers, evidence, "evidence") == [False, True, True, False]
    assert relevance_labels(passages, answers, evidence, "both") == [True, True, True, False]
    with pytest.raises(ValueError):
        relevance_labels(passages, answers, evidence, "bogus")


def test_answer_relevance_is_token_aligned():
    assert relevance_labels([Passage("a", "T", "A big party.")], ["art"], [], "answer") == [False]


def test_score_ranker_call_fills_r_rel_and_reward():
    call = RankerCall(q0="q", sub_query="s", task_id="t", rollout_idx=0, turn=0, mode="trainable",
                      candidate_ids=["a", "b", "c", "d"], chosen_ids=["b", "c", "a"], format_ok=True, reason="ok",
                      i_ans=True, relevant=[False, False, True, False])
    cfg = RankerConfig(preset="t", model="t", top_k=3, gamma=0.5)
    # relevant "c" at rank 2: Hit@1 0, Hit@3 1 -> r_rel 0.5 <= gamma -> reward = r_rel
    assert score_ranker_call(call, r_main=1.0, cfg=cfg) == 0.5 and call.r_rel == 0.5
    call.chosen_ids = ["c", "a", "b"]  # Hit@1 1 -> r_rel 1 > gamma -> 1 + r_main
    assert score_ranker_call(call, r_main=0.25, cfg=cfg) == 1.25
    call.format_ok = False
    assert score_ranker_call(call, r_main=1.0, cfg=cfg) == -0.2


# --- reward ranges (property tests) -------------------------------------------------------

unit = st.floats(0.0, 1.0)
correctness_values = st.one_of(st.sampled_from([0.0, 1.0]), unit)  # EM or token F1
rollouts = st.lists(st.tuples(correctness_values,
                              st.integers(0, 8), st.booleans()),  # searches, format_ok
                    min_size=1, max_size=8)


@given(rollouts, unit, unit)
def test_solver_reward_is_minus_alpha_or_within_its_correctness_band(group, tool_cost, alpha):
    c, s, ok = zip(*group)
    rewards = solver_rewards(c, s, ok, tool_cost, alpha)
    for ci, si, oki, r in zip(c, s, ok, rewards):
        if not oki:
            assert r == -alpha
        else:
            assert ci * (1 - tool_cost) - EPS <= r <= ci + EPS
    # within a group, of two valid rollouts equally correct the one that searched more never earns more
    for i in range(len(group)):
        for j in range(len(group)):
            if ok[i] and ok[j] and c[i] == c[j] and s[i] <= s[j]:
                assert rewards[i] >= rewards[j] - EPS


@given(rollouts, st.integers(0, 7), st.integers(1, 5), unit, unit)
def test_solver_reward_never_rises_with_more_searches(group, which, extra, tool_cost, alpha):
    c, s, ok = (list(x) for x in zip(*group))
    i = which % len(group)
    before = solver_rewards(c, s, ok, tool_cost, alpha)[i]
    s[i] += extra
    assert solver_rewards(c, s, ok, tool_cost, alpha)[i] <= before + EPS


@st.composite
def ranker_calls(draw):
    n = draw(st.integers(0, 8))
    top_k = draw(st.integers(1, 6))
    relevant = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ids = [f"p{i}" for i in range(n)]
    chosen = draw(st.permutations(ids))[: min(top_k, n)]
    call = RankerCall(q0="q", sub_query="s", task_id="t", rollout_idx=0, turn=0, mode="trainable",
                      candidate_ids=ids, chosen_ids=chosen, format_ok=draw(st.booleans()), reason="x",
                      i_ans=any(relevant), relevant=relevant)
    return call, top_k


@given(ranker_calls(), correctness_values, unit, unit)
def test_ranker_reward_is_within_minus_alpha_and_two(drawn, r_main, gamma, alpha):
    call, top_k = drawn
    cfg = RankerConfig(preset="t", model="t", top_k=top_k, gamma=gamma, format_penalty=alpha)
    reward = score_ranker_call(call, r_main, cfg)
    assert 0.0 <= call.r_rel <= 1.0 and -alpha <= reward <= 2.0
    if not call.format_ok:
        assert reward == -alpha
    else:
        assert reward >= 0.0 and (call.i_ans or reward == r_main)


text = st.text(max_size=30)


@given(st.one_of(st.none(), text), st.lists(text, max_size=3), st.sampled_from(["em", "f1", "f1_content"]),
       text, st.lists(text, max_size=3), st.lists(text, max_size=3))
def test_correctness_is_within_zero_and_one_on_any_text(answer, golds, mode, question, queries, observations):
    echo_of = echo_sources(answer or "", question, queries, observations)
    assert 0.0 <= correctness(answer, golds, mode, echo_of) <= 1.0
