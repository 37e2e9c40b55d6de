"""Task-dump records and per-step metrics (SPEC §6) built from one step's results."""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional, Sequence

from coevo.core.scoring import echoes
from coevo.core.stats import correctness_shares, mean
from proposer.pipeline import Candidate
from solver.agent import Episode
from solver.reward import hit_at_k, hit_cutoffs


def candidate_record(cand: Candidate, task_id: Optional[str], episodes: Sequence[Episode],
                     timings: dict[str, float], decode: Optional[Callable[[list[int]], str]] = None) -> dict[str, Any]:
    """One line of tasks/step_<n>.jsonl: the candidate with its rollouts (keys: README "Outputs").

    Each record type serializes itself (`Candidate`, `Episode`, `RankerCall`, `Verdict`,
    `EvidencePath` `.to_record`), so every dump key is defined in one place.
    """
    return cand.to_record(task_id, [ep.to_record(decode) for ep in episodes], timings)


def _rate(n: int, d: int) -> Optional[float]:
    return n / d if d else None


def step_metrics(cands: Sequence[Candidate], episodes: Sequence[Episode], groups: Sequence[Sequence[Any]],
                 top_k: int) -> dict[str, Any]:
    """Acceptance by stage, difficulty histogram, searches, rewards, ranker Hit@k, group sizes,
    and what shows substance: echoed answers, answers in the observation, solve rates of accepted tasks."""
    n = len(cands)
    sampled = [ep for ep in episodes if not ep.guided]  # what the policy did: guided replays left out
    target_ok = sum(1 for c in cands if c.target_verdict.ok)
    with_path = sum(1 for c in cands if c.path is not None)
    accepted = [c for c in cands if c.accepted]
    calls = [call for ep in episodes for call in ep.ranker_calls]
    hits = {f"hit@{k}": mean([hit_at_k(c.ranked_relevant(), k) for c in calls if c.i_ans]) for k in hit_cutoffs(top_k)}
    return {
        "candidates": n, "accepted": len(accepted),
        "acceptance": {"target": _rate(target_ok, n), "path": _rate(with_path, n), "task": _rate(len(accepted), n)},
        "reasons": dict(Counter(c.reason for c in cands if not c.accepted)),
        "accuracy_hist": dict(Counter(f"{c.accuracy:.2f}" for c in accepted if c.accuracy is not None)),
        "solver": {"mean_searches": mean([ep.n_searches for ep in sampled]),
                   "format_valid": mean([float(ep.format_ok) for ep in sampled]),
                   "accuracy": mean([c.accuracy for c in accepted if c.accuracy is not None]),
                   "guided": sum(1 for ep in episodes if ep.guided),
                   "guided_read": sum(1 for ep in episodes if ep.guided and ep.read_answer),  # the ones trained
                   **answer_rates(sampled)},
        "reward": {"proposer": mean([c.reward for c in cands if c.reward is not None]),
                   "solver": mean([ep.reward for ep in episodes]),
                   "ranker": mean([c.reward for c in calls if c.reward is not None])},
        "ranker": {"calls": len(calls), "format_valid": mean([float(c.format_ok) for c in calls]),
                   "i_ans": mean([float(c.i_ans) for c in calls]), **hits,
                   "group_sizes": dict(Counter(len(g) for g in groups))},
        "groups": solver_group_shares(sampled),  # guided replays are correct by construction
        "solve_rate": solve_rate_shares([c.accuracy for c in accepted if c.accuracy is not None]),
        "rejection": rejection_rates(cands),
        "multi_hop_share": _rate(sum(1 for c in accepted if c.path is not None and len(c.path) >= 2), len(accepted)),
        "hops": hop_metrics(accepted),
    }


def hop_metrics(accepted: Sequence[Candidate]) -> dict[str, dict[str, Any]]:
    """Accepted tasks and their mean solver accuracy by path length (`hops/tasks/<k>`, `hops/accuracy/<k>`);
    the hop curriculum reads the accuracies (coevo/orchestrate/hop_curriculum.py)."""
    by_hops: dict[int, list[Candidate]] = {}
    for cand in accepted:
        if cand.path is not None:
            by_hops.setdefault(len(cand.path), []).append(cand)
    ks = sorted(by_hops)
    return {"tasks": {str(k): len(by_hops[k]) for k in ks},
            "accuracy": {str(k): mean([c.accuracy for c in by_hops[k] if c.accuracy is not None]) for k in ks}}


def answer_rates(episodes: Sequence[Episode]) -> dict[str, Optional[float]]:
    """`echo_rate`: share of well-formed answers that repeat the question or one of the rollout's own
    queries (`coevo.core.scoring.echoes`; measured whether or not `solver.reward.echo_guard` is on);
    `answer_in_observation`: share of rollouts shown a passage holding a gold answer (`read_answer`),
    the ceiling of their accuracy."""
    answered = [ep for ep in episodes if ep.format_ok and ep.answer is not None]
    echoed = sum(1 for ep in answered if echoes(ep.answer, [ep.task.question, *ep.sub_queries]))
    seen = sum(1 for ep in episodes if ep.read_answer)
    return {"echo_rate": _rate(echoed, len(answered)), "answer_in_observation": _rate(seen, len(episodes))}


def solve_rate_shares(accuracies: Sequence[float]) -> dict[str, Optional[float]]:
    """Shares of accepted tasks whose solve rate p is 0, strictly between 0 and 1, or 1: only the
    middle ones give the proposer's difficulty reward and the solver's GRPO groups a signal."""
    n = len(accuracies)
    zero, one = sum(1 for p in accuracies if p <= 0), sum(1 for p in accuracies if p >= 1)
    return {"n": n, "zero": _rate(zero, n), "between": _rate(n - zero - one, n), "one": _rate(one, n)}


def solver_group_shares(episodes: Sequence[Episode]) -> dict[str, Optional[float]]:
    """`correctness_shares` of the step's solver groups (one task's rollouts each: the caller passes the sampled)."""
    by_task: dict[str, list[float]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task_id, []).append(ep.correctness)
    return correctness_shares(list(by_task.values()))


def rejection_rates(cands: Sequence[Candidate]) -> dict[str, Optional[float]]:
    """Validity: parsed targets rejected by target validation; leakage: parsed questions rejected
    for naming the target (`leaks_target`, `leaks_target_token`)."""
    parsed_targets = [c for c in cands if c.target is not None]
    parsed_questions = [c for c in cands if c.question is not None]
    invalid = sum(1 for c in parsed_targets if not c.target_verdict.ok)
    leaked = sum(1 for c in parsed_questions if c.reason.startswith("leaks_target"))
    return {"validity": _rate(invalid, len(parsed_targets)), "leakage": _rate(leaked, len(parsed_questions))}
