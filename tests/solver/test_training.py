"""GRPO batches of the solver and the ranker: which sequences they hold (`keep_zero_advantage`)."""
from types import SimpleNamespace

import pytest

from coevo.core.grpo import GroupStats
from solver.training import ranker_sequences, solver_sequences


def _episode(task_id, reward, n_generated=2):
    # prompt of 3 tokens (mask 0), then n_generated solver tokens (mask 1)
    return SimpleNamespace(task_id=task_id, reward=reward, token_ids=[1, 2, 3] + [4] * n_generated,
                           loss_mask=[0, 0, 0] + [1] * n_generated, logprobs=None, n_generated=n_generated,
                           guided=False, read_answer=False)


EPISODES = [
    # t1 rewards [1.0, 0.5, 0.0]: mean 0.5, unbiased std 0.5 -> advantages [1, 0, -1]
    _episode("t1", 1.0), _episode("t1", 0.5), _episode("t1", 0.0),
    # t2 rewards [0.2, 0.2]: zero variance -> advantages [0, 0]; the second generated nothing
    _episode("t2", 0.2), _episode("t2", 0.2, n_generated=0),
]


def test_solver_batch_drops_zero_advantage_by_default():
    batch, info = solver_sequences(EPISODES)
    assert [round(s.advantage, 4) for s in batch] == [1.0, -1.0]
    assert info == GroupStats(groups=2, zero_var_groups=1, members=5)
    assert info.to_metrics() == {"groups": 2, "zero_var_groups": 1, "zero_var_share": 0.5, "mean_group_size": 2.5}
    assert sum(sum(s.loss_mask) for s in batch) == 4  # the token-mean denominator


def test_solver_batch_keeps_zero_advantage_when_asked():
    batch, info = solver_sequences(EPISODES, keep_zero=True)
    # the zero-advantage t1 rollout and the t2 rollout that generated tokens; never an empty one
    assert [round(s.advantage, 4) for s in batch] == [1.0, 0.0, -1.0, 0.0]
    assert info.zero_var_groups == 1
    assert sum(sum(s.loss_mask) for s in batch) == 8  # 4 sequences * 2 generated tokens


def _call(reward, n_completion=3):
    return SimpleNamespace(reward=reward, prompt_ids=[9, 9], completion_ids=[5] * n_completion,
                           logprobs=[-0.1] * n_completion)


def test_ranker_batch_keep_zero_advantage():
    # group 0 rewards [2.0, 0.0]: mean 1.0, unbiased std 1.4142 -> advantages +-0.7071
    # group 1 rewards [1.0, 1.0, 1.0]: zero variance
    groups = [[_call(2.0), _call(0.0)], [_call(1.0), _call(1.0), _call(1.0)]]
    dropped, info = ranker_sequences(groups)
    assert [round(s.advantage, 4) for s in dropped] == [0.7071, -0.7071]
    assert info == GroupStats(groups=2, zero_var_groups=1, members=5)
    assert ranker_sequences([]) == ([], GroupStats(0, 0, 0))  # no groups: no share, no mean size (None, not 0)
    assert GroupStats(0, 0, 0).to_metrics() == {"groups": 0, "zero_var_groups": 0, "zero_var_share": None,
                                                "mean_group_size": None}
    kept, _ = ranker_sequences(groups, keep_zero=True)
    assert [round(s.advantage, 4) for s in kept] == [0.7071, -0.7071, 0.0, 0.0, 0.0]
    for seq in kept:  # prompt masked out, completion trained, old logprobs aligned
        assert seq.loss_mask == [0, 0, 1, 1, 1] and seq.old_logprobs == pytest.approx([0.0, 0.0, -0.1, -0.1, -0.1])


def _rollout(answer, queries, searches=1, observations=()):
    task = SimpleNamespace(id="t1", question="Which city is the capital of Nigeria?",
                           answers=["Abuja, Nigeria", "Abuja"])
    return SimpleNamespace(task=task, task_id="t1", answer=answer, format_ok=True, sub_queries=queries, guided=False,
                           n_searches=searches, correctness=None, reward=None, observations=list(observations))


@pytest.mark.parametrize("guard, expected", [(False, [1.0, 1.0, 0.0, 1.0]), (True, [0.0, 1.0, 0.0, 1.0])])
def test_the_echo_guard_scores_an_answer_that_repeats_its_query_wrong(guard, expected):
    from coevo.core.role_config import SolverConfig, SolverRewardConfig
    from solver.training import score_solver

    eps = [_rollout("Abuja", ["Abuja"]),  # searched for the answer itself, then repeated it
           _rollout("Abuja", ["capital of Nigeria"]),  # found it: the head alias scores it correct
           _rollout("Lagos", ["Nigeria"]),
           # read it in its first search's results, then searched it to verify: not an echo
           _rollout("Abuja", ["capital of Nigeria", "Abuja"], 2, ["Doc 1 (Title: Abuja) capital of Nigeria", "Abuja"])]
    cfg = SolverConfig(reward=SolverRewardConfig(echo_guard=guard))
    accuracy = score_solver(eps, cfg)
    assert [ep.correctness for ep in eps] == expected
    assert accuracy == {"t1": pytest.approx(sum(expected) / 4)}


def test_a_guided_rollout_is_rewarded_but_leaves_the_solve_rate_to_the_sampled_ones():
    from coevo.core.role_config import SolverConfig
    from solver.training import score_solver

    guided = _rollout("Abuja", ["Nigeria"])
    guided.guided = True
    eps = [_rollout("Lagos", ["Nigeria"]), _rollout("Abuja", ["capital of Nigeria"]), guided]
    accuracy = score_solver(eps, SolverConfig())
    assert [ep.correctness for ep in eps] == [0.0, 1.0, 1.0] and guided.reward > eps[0].reward
    assert accuracy == {"t1": 0.5}  # 1 of the 2 sampled rollouts, not 2 of 3


def test_a_guided_rollout_that_never_read_the_answer_joins_no_group():
    # t1: sampled rewards [1, 0] and a guided replay rewarded 1 whose searches showed no gold
    eps = [_episode("t1", 1.0), _episode("t1", 0.0), _episode("t1", 1.0)]
    eps[2].guided = True
    batch, info = solver_sequences(eps)
    assert [round(s.advantage, 4) for s in batch] == [0.7071, -0.7071]  # mean 0.5, unbiased std 0.7071
    eps[2].read_answer = True  # it read the answer: trained, and the baseline moves to 2/3
    batch, _ = solver_sequences(eps)
    assert [s.advantage for s in batch] == pytest.approx([3 ** -0.5, -2 * 3 ** -0.5, 3 ** -0.5], abs=1e-4)
    assert info == GroupStats(groups=1, zero_var_groups=0, members=2)  # the replay is no member
