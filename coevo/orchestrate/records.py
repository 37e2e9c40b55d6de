"""Task-dump records and per-step metrics (docs/method.md §6) built from one step's results."""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional, Sequence

from coevo.core.stats import correctness_shares, mean
from coevo.orchestrate.step_metrics import rollout_figures
from proposer.pipeline import Candidate
from solver.agent import Episode


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
    """Acceptance by stage, difficulty histogram, proposer reward, group shares, rejection rates and hops,
    beside the solver and ranker figures every command writes alike (`step_metrics.rollout_figures`,
    whose docstring states each key's population); `solver/accuracy` is the mean over accepted tasks."""
    n = len(cands)
    sampled = [ep for ep in episodes if not ep.guided]  # what the policy did: guided replays left out
    target_ok = sum(1 for c in cands if c.target_verdict.ok)
    with_path = sum(1 for c in cands if c.path is not None)
    accepted = [c for c in cands if c.accepted]
    figures = rollout_figures(episodes, groups, top_k)
    return {
        "candidates": n, "accepted": len(accepted),
        "acceptance": {"target": _rate(target_ok, n), "path": _rate(with_path, n), "task": _rate(len(accepted), n)},
        "reasons": dict(Counter(c.reason for c in cands if not c.accepted)),
        "accuracy_hist": dict(Counter(f"{c.accuracy:.2f}" for c in accepted if c.accuracy is not None)),
        "solver": {**figures["solver"], "accuracy": mean([c.accuracy for c in accepted if c.accuracy is not None])},
        "reward": {"proposer": mean([c.reward for c in cands if c.reward is not None]), **figures["reward"]},
        "ranker": figures["ranker"],
        "groups": solver_group_shares(sampled),  # guided replays are correct by construction
        "solve_rate": solve_rate_shares([c.accuracy for c in accepted if c.accuracy is not None]),
        "rejection": rejection_rates(cands),
        "multi_hop_share": _rate(sum(1 for c in accepted if c.path is not None and len(c.path) >= 2), len(accepted)),
        "hops": hop_metrics(accepted),
    }


def hop_accuracy(accepted: Sequence[Candidate]) -> dict[int, Optional[float]]:
    """Mean solver accuracy of the accepted tasks by path length (hops -> accuracy; None: none scored):
    what the hop curriculum is fed (`hop_curriculum.advance`), and what `hops/accuracy/<k>` logs."""
    by_hops: dict[int, list[Candidate]] = {}
    for cand in accepted:
        if cand.path is not None:
            by_hops.setdefault(len(cand.path), []).append(cand)
    return {k: mean([c.accuracy for c in by_hops[k] if c.accuracy is not None]) for k in sorted(by_hops)}


def hop_metrics(accepted: Sequence[Candidate]) -> dict[str, dict[str, Any]]:
    """Accepted tasks and their mean solver accuracy by path length (`hops/tasks/<k>`, `hops/accuracy/<k>`)."""
    counts = Counter(len(c.path) for c in accepted if c.path is not None)
    return {"tasks": {str(k): counts[k] for k in sorted(counts)},
            "accuracy": {str(k): acc for k, acc in hop_accuracy(accepted).items()}}


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
