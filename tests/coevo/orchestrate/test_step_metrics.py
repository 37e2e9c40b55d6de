"""One step-metrics vocabulary: `coevo.run`'s and `coevo.solve`'s metric paths give the same solver and
ranker figures on the same episodes, each over the population the builder's docstring states."""
from types import SimpleNamespace

import pytest

from coevo.orchestrate.records import step_metrics
from coevo.orchestrate.solve_loop import rollout_metrics
from coevo.orchestrate.step_metrics import answer_rates, hit_rates
from solver.agent import Episode, Task
from solver.ranker import RankerCall

FRANCE = Task("t1", "Which city is the capital of France?", ["Paris"])
HAMLET = Task("t2", "Who wrote Hamlet, Shakespeare or Marlowe?", ["Shakespeare"])


def _call(chosen, relevant_ids, generated=True, format_ok=True, reward=0.0, group_id=None) -> RankerCall:
    candidates = ["a", "b", "c", "d"]
    return RankerCall("q", "sub", "t1", 0, 0, "trainable", candidates, chosen, format_ok, "ok",
                      i_ans=bool(relevant_ids), relevant=[pid in relevant_ids for pid in candidates],
                      completion_ids=[7] * (3 if generated else 0), group_id=group_id, reward=reward)


def _episode(task, answer, reward, n_generated, queries=(), calls=(), guided=False, read=False) -> Episode:
    return Episode(task, 0, [1, 2], [0, 1], None, 1, answer=answer, end_reason="answer" if answer else "no_action",
                   n_searches=len(calls), sub_queries=list(queries), ranker_calls=list(calls),
                   n_generated=n_generated, reward=reward, guided=guided, read_answer=read)


def hand_made():
    grouped = _call(["b", "a", "c"], {"b"}, reward=2.0, group_id="g1")  # relevant first: hit@1 and hit@3
    malformed = _call(["a", "d", "b"], {"d"}, format_ok=False, reward=-0.2)  # relevant 2nd: hit@3 only
    replayed = _call(["a", "b", "c"], set(), generated=False, reward=0.5)  # ranker mode none: nothing written
    episodes = [
        _episode(FRANCE, "Paris", 1.0, 10, ["capital of France"], [grouped], read=True),
        _episode(FRANCE, "Lyon", 0.0, 8, ["France capital"], [malformed]),
        _episode(FRANCE, None, -0.2, 5),  # no well-formed answer
        _episode(FRANCE, "Paris", 1.0, 2, ["capital of France"], [replayed], guided=True, read=True),
        _episode(HAMLET, "Shakespeare", 0.0, 4),  # right, but the question named it: an echo
    ]
    return episodes, [[grouped]]


def test_run_and_solve_write_the_same_solver_and_ranker_figures():
    episodes, groups = hand_made()
    run = step_metrics([], episodes, groups, top_k=3)
    solve = rollout_metrics(episodes, groups, top_k=3)
    assert {k: v for k, v in run["solver"].items() if k != "accuracy"} == solve["solver"]
    assert run["ranker"] == solve["ranker"]
    assert {k: v for k, v in run["reward"].items() if k != "proposer"} == solve["reward"]
    # solver: the 4 sampled rollouts (the guided replay counted apart)
    solver = solve["solver"]
    assert (solver["format_valid"], solver["em"], solver["em_no_echo"], solver["f1"]) == (0.75, 0.5, 0.25, 0.5)
    assert (solver["mean_searches"], solver["end_reasons"]) == (0.5, {"answer": 3, "no_action": 1})
    assert (solver["gen_tokens"], solver["guided"], solver["guided_read"]) == (29, 1, 1)  # tokens: every episode
    assert (solver["echo_rate"], solver["answer_in_observation"]) == (pytest.approx(1 / 3), 0.25)
    assert solve["reward"]["solver"] == pytest.approx(0.8 / 4)  # sampled: 1, 0, -0.2, 0
    assert solve["reward"]["ranker"] == pytest.approx(0.9)  # generated calls: 2, -0.2
    # ranker: 3 calls; format over the 2 generated; hit@k and r_rel over the 2 with a relevant candidate
    assert solve["ranker"] == {"calls": 3, "generated": 2, "format_valid": 0.5, "i_ans": pytest.approx(2 / 3),
                               "hit@1": 0.5, "hit@3": 1.0, "r_rel": 0.75, "gen_tokens": 6, "groups": 1,
                               "group_sizes": {1: 1}, "grouped_share": 0.5, "group_size": 1.0}
    assert (solve["questions"], solve["episodes"]) == (2, 5)


def test_no_episodes_gives_absent_figures():
    figures = rollout_metrics([], [], top_k=1)
    assert figures["solver"]["em"] is None and figures["reward"] == {"solver": None, "ranker": None}
    assert figures["ranker"]["hit@1"] is None and figures["ranker"]["format_valid"] is None
    assert hit_rates([[False, True]], 3) == {"hit@1": 0.0, "hit@3": 1.0}


def _answered(answer, queries=(), shown=(), question="Which city hosts the Louvre?",
              observations=()) -> SimpleNamespace:
    # shown: per search, whether each passage it showed holds a gold answer; observations: the text each search showed
    return SimpleNamespace(task=SimpleNamespace(question=question), answer=answer, format_ok=answer is not None,
                           sub_queries=list(queries), read_answer=any(any(rel) for rel in shown),
                           observations=list(observations))


def test_answer_rates_by_hand():
    eps = [_answered("Paris", ["Louvre museum"], [[False, True]]),  # answer shown in the 2nd search's top
           _answered("the Louvre", ["Louvre museum"], [[False, False]]),  # echoes the question and its query
           _answered("Louvre museum", ["Louvre museum"], []),  # echoes its own query; no search shown anything
           _answered(None, ["x"], [[True]])]  # no answer: not in the echo denominator, but it saw the answer
    assert answer_rates(eps) == {"echo_rate": 2 / 3, "answer_in_observation": 0.5}
    assert answer_rates([]) == {"echo_rate": None, "answer_in_observation": None}
    # read "Paris" in its first observation, then searched it to verify: not an echo (the reward's rule)
    verified = _answered("Paris", ["Louvre city", "Paris"], [[True], [True]], observations=["Louvre, Paris", "Paris"])
    assert answer_rates([verified, eps[2]]) == {"echo_rate": 1 / 2, "answer_in_observation": 1 / 2}
