"""Step metrics that the papers' analyses read: group shares, rejection rates, multi-hop share."""
from types import SimpleNamespace

from coevo.core.types import Completion, EvidencePath, Hop, Verdict
from coevo.orchestrate.records import (
    rejection_rates,
    solve_rate_shares,
    solver_group_shares,
    step_metrics,
)
from proposer.pipeline import Candidate


def _ep(task: str, correctness: float) -> SimpleNamespace:
    return SimpleNamespace(task_id=task, correctness=correctness)


def test_solver_group_shares_by_hand():
    eps = [_ep("a", 1.0), _ep("a", 0.0), _ep("b", 1.0), _ep("b", 1.0), _ep("c", 0.0), _ep("c", 0.0),
           _ep("d", 0.5), _ep("d", 0.5)]  # F1 0.5 everywhere: neither all correct nor all wrong -> mixed
    assert solver_group_shares(eps) == {"n": 4, "mixed": 0.5, "all_correct": 0.25, "all_wrong": 0.25}
    assert solver_group_shares([]) == {"n": 0, "mixed": None, "all_correct": None, "all_wrong": None}


def _cand(target=None, target_ok=False, question=None, reason="pending", hops=0) -> Candidate:
    c = Candidate(0, "ref", 0, Completion([1], [2], "x", [-0.1], "eos"), target=target)
    c.target_verdict = Verdict(target_ok, "ok" if target_ok else "not_entity")
    c.question, c.reason = question, reason
    if hops:
        hop = Hop("a", "b", "a is b.", "p1", "a", 1.0, "relation")
        c.path = EvidencePath("b", (hop,) * hops)
    if reason == "accepted":
        c.stage = "accepted"
    return c


def test_rejection_rates_and_multi_hop_share_by_hand():
    cands = [
        _cand(),  # unparsed target: counts in neither denominator
        _cand("X", False, reason="not_entity"),
        _cand("Y", True, "Who is it?", "leaks_target", hops=1),
        _cand("Z", True, "Who was it?", "accepted", hops=2),
        _cand("W", True, "Where is it?", "accepted", hops=1),
    ]
    # validity: 1 of 4 parsed targets invalid; leakage: 1 of 3 parsed questions leaked
    assert rejection_rates(cands) == {"validity": 0.25, "leakage": 1 / 3}
    metrics = step_metrics(cands, [], [], top_k=3)
    assert metrics["multi_hop_share"] == 0.5  # one of the two accepted tasks has >= 2 hops
    assert metrics["groups"]["n"] == 0 and metrics["rejection"]["validity"] == 0.25


def test_solve_rate_shares_by_hand():
    assert solve_rate_shares([0.0, 0.25, 1.0, 0.0, 0.5]) == {"n": 5, "zero": 0.4, "between": 0.4, "one": 0.2}
    assert solve_rate_shares([]) == {"n": 0, "zero": None, "between": None, "one": None}
