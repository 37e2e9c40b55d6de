"""Per-step series of a run, from its metrics.jsonl lines and task dumps (README "Outputs").

One implementation for `coevo.inspect --html` / `--compare` and `bench/learning.py`.

- `extract_series(metrics, records)`: one entry per metrics line (a finished step), keys in
  bench/learning.py's docstring (`task_acceptance`, `solver_format_valid`, `hit@1`, `hit@K`, …);
- `step_funnels(records)`: per dumped step, how many candidates passed each stage of `FUNNEL`;
- `step_reasons`, `step_accuracies`, `step_hops`: per dumped step, the rejection reason codes,
  the solver accuracy of each accepted task (the difficulty histogram) and its hop count;
- `last_quarter(values)`: the mean over the last quarter of the steps (the issue's targets).

Dumps and metrics lines may be hand-edited: a value that is not a number is left out of
means and charts rather than failing, and a metrics line without an integer `step` is skipped.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from coevo.core.stats import correctness_shares, mean
from coevo.evaluate.report import hop_count, label, load_run, number

# series name -> path of keys in a metrics.jsonl line (coevo.orchestrate.records.step_metrics; the solver and
# ranker keys, and the population each is over: coevo.orchestrate.step_metrics)
METRIC_KEYS: dict[str, tuple[str, ...]] = {
    "steps": ("step",), "candidates": ("candidates",), "accepted": ("accepted",),
    "task_acceptance": ("acceptance", "task"), "target_acceptance": ("acceptance", "target"),
    "path_acceptance": ("acceptance", "path"), "reasons": ("reasons",),
    "proposer_reward": ("reward", "proposer"), "solver_reward": ("reward", "solver"),
    "ranker_reward": ("reward", "ranker"), "solver_format_valid": ("solver", "format_valid"),
    "accuracy": ("solver", "accuracy"), "mean_searches": ("solver", "mean_searches"),
    "ranker_calls": ("ranker", "calls"), "ranker_format_valid": ("ranker", "format_valid"),
    **{f"hit@{k}": ("ranker", f"hit@{k}") for k in range(1, 6)},  # the cutoffs a step records (solver.reward)
    "echo_rate": ("solver", "echo_rate"), "answer_in_observation": ("solver", "answer_in_observation"),
    **{f"solve_rate_{part}": ("solve_rate", part) for part in ("zero", "between", "one")},
    **{f"accuracy_{k}hop": ("hops", "accuracy", str(k)) for k in range(1, 5)},  # evidence.max_hops ≤ 4
    "curriculum_level": ("curriculum", "level"),
}


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


# The acceptance funnel of a step's candidates: (key, label, passed). Each stage is reached only
# through the one before it in the proposer pipeline (docs/method.md §3), so the counts never rise.
FUNNEL: tuple[tuple[str, str, Callable[[dict], bool]], ...] = (
    ("candidates", "candidates", lambda r: True),
    ("parsed_target", "parsed target", lambda r: r.get("target") is not None),
    ("valid_target", "valid target", lambda r: _dict(r.get("target_verdict")).get("ok") is True),
    ("path", "evidence path", lambda r: bool(r.get("evidence_path"))),
    ("parsed_question", "parsed question", lambda r: r.get("question") is not None),
    ("accepted", "accepted", lambda r: bool(r.get("accepted"))),
)


def _at(record: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        if not isinstance(record, dict):
            return None
        record = record.get(key)
    return record


def step_key(m: dict) -> Optional[int]:
    """A metrics line's step when it is an integer (JSON bools are not steps)."""
    step = m.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def by_step(records: Sequence[dict]) -> dict[int, list[dict]]:
    """Dump records grouped by their `step` (as `load_run` sets it), in step order."""
    out: dict[int, list[dict]] = {}
    for r in records:
        out.setdefault(r.get("step", -1), []).append(r)
    return dict(sorted(out.items()))


def group_shares(records: Sequence[dict]) -> dict[str, Any]:
    """Solver groups of one step's dump (accepted tasks with rollouts): count and mixed/all-correct/all-wrong shares.

    Over the sampled rollouts: a guided one (`solver.guided_rollouts`) is correct by construction and
    would make every group look mixed."""
    groups = [[number(ro.get("correctness")) or 0.0 for ro in r.get("rollouts") or [] if not ro.get("guided")]
              for r in records if r.get("accepted")]
    shares = correctness_shares(groups)
    return {"solver_groups": shares["n"], "mixed_groups": shares["mixed"],
            "all_correct_groups": shares["all_correct"], "all_wrong_groups": shares["all_wrong"]}


def update_sizes(metrics_line: dict) -> dict[str, int]:
    """{role: sequences in its GRPO update}: 0 for a skipped (frozen or empty) update."""
    updates = _dict(metrics_line.get("update"))
    return {role: 0 if _dict(u).get("skipped") else int(number(_dict(u).get("n_seqs")) or 0)
            for role, u in updates.items()}


def extract_series(metrics: Sequence[dict], records: Sequence[dict]) -> dict[str, list]:
    """Per-step series of one run: `metrics` = its metrics.jsonl lines, `records` = its dump
    records each with its `step` (as `coevo.evaluate.report.load_run` returns them)."""
    lines = sorted((m for m in metrics if step_key(m) is not None), key=step_key)
    steps = by_step(records)
    series: dict[str, list] = {name: [_at(m, keys) for m in lines] for name, keys in METRIC_KEYS.items()}
    series["reasons"] = [r if isinstance(r, dict) else {} for r in series["reasons"]]
    shares = [group_shares(steps.get(m["step"], [])) for m in lines]
    for key in ("solver_groups", "mixed_groups", "all_correct_groups", "all_wrong_groups"):
        series[key] = [s[key] for s in shares]
    series["accepted_hops"] = [accepted_hops(steps.get(m["step"], [])) for m in lines]
    series["updates"] = [update_sizes(m) for m in lines]
    series["zero_var_groups"] = [{role: _dict(u).get("zero_var_groups") for role, u in _dict(m.get("update")).items()}
                                 for m in lines]
    series["step_s"] = [round(sum(number(v) or 0.0 for v in _dict(m.get("time_s")).values()), 3) for m in lines]
    series["hit@K"] = [top_hit(_dict(m.get("ranker"))) for m in lines]
    return series


def top_hit(ranker: dict) -> Any:
    """Hit@K at the largest cutoff a step recorded: K = ranker.top_k, capped at 5 (solver.reward.hit_cutoffs)."""
    cutoffs = sorted(int(key[4:]) for key in ranker if key.startswith("hit@") and key[4:].isdigit())
    return ranker[f"hit@{cutoffs[-1]}"] if cutoffs else None


def funnel(records: Sequence[dict]) -> dict[str, int]:
    """{stage key: candidates that passed it} over `records` (see `FUNNEL`)."""
    return {key: sum(1 for r in records if passed(r)) for key, _, passed in FUNNEL}


def step_funnels(records: Sequence[dict]) -> dict[int, dict[str, int]]:
    return {step: funnel(recs) for step, recs in by_step(records).items()}


def step_reasons(records: Sequence[dict]) -> dict[int, dict[str, int]]:
    """Per step, {reason code: rejected candidates}, most frequent first."""
    return {step: dict(Counter(label(r.get("reason", "?")) for r in recs if not r.get("accepted")).most_common())
            for step, recs in by_step(records).items()}


def accuracies(records: Sequence[dict]) -> list[float]:
    """Solver accuracy of each accepted task that has a numeric one."""
    return [a for r in records if r.get("accepted") and (a := number(r.get("accuracy"))) is not None]


def accepted_hops(records: Sequence[dict]) -> list[int]:
    """Evidence-path hop count of each accepted task that has a path."""
    return [h for r in records if r.get("accepted") and (h := hop_count(r)) is not None]


def step_accuracies(records: Sequence[dict]) -> dict[int, list[float]]:
    return {step: accuracies(recs) for step, recs in by_step(records).items()}


def step_hops(records: Sequence[dict]) -> dict[int, list[int]]:
    return {step: accepted_hops(recs) for step, recs in by_step(records).items()}


DECILE_SEP = "\u2013"  # en dash: an exact label may hold a minus sign (a hand-edited accuracy)


def accuracy_bin(a: float, exact: bool) -> str:
    """Histogram label of an accuracy: the value itself (k/G of EM rollouts) or its tenth (F1)."""
    if exact:
        return f"{a:.2f}"
    lo = min(math.floor(min(max(a, 0.0), 1.0) * 10), 9) / 10  # outside [0, 1] (hand-edited): the end bins
    return f"{lo:.1f}{DECILE_SEP}{lo + 0.1:.1f}"


def accuracy_bins(values: Sequence[float], max_exact: int = 11) -> list[str]:
    """Ordered histogram labels for these accuracies: exact values when there are at most
    `max_exact` distinct ones (EM accuracies are multiples of 1/G), else ten equal bins."""
    exact = len(set(round(a, 2) for a in values)) <= max_exact
    if exact:
        return sorted({accuracy_bin(a, True) for a in values}, key=float)
    return [accuracy_bin(i / 10, False) for i in range(10)]


def histogram(values: Sequence[float], bins: Sequence[str]) -> list[int]:
    """Counts of `values` per label of `bins` (as `accuracy_bins` made them)."""
    exact = not bins or DECILE_SEP not in bins[0]
    counts = Counter(accuracy_bin(a, exact) for a in values)
    return [counts.get(b, 0) for b in bins]


def last_quarter(values: Sequence[Any]) -> Optional[float]:
    """Mean of the numbers among the last ceil(n/4) entries of a per-step series (None when none)."""
    if not values:
        return None
    k = max(1, math.ceil(len(values) / 4))
    return mean([x for v in values[-k:] if (x := number(v)) is not None])


@dataclass
class RunData:
    """One run as the HTML report shows it: its dumps and metrics lines and what is computed from them."""

    label: str
    run_dir: Path
    records: list[dict]
    metrics: list[dict]
    series: dict[str, list]
    funnels: dict[int, dict[str, int]]
    reasons: dict[int, dict[str, int]]
    accuracies: dict[int, list[float]]
    hops: dict[int, list[int]]

    @cached_property
    def total_funnel(self) -> dict[str, int]:
        return funnel(self.records)


def run_data(run_dir: Path, name: Optional[str] = None, step: Optional[int] = None) -> RunData:
    """Load a run directory (`load_run`; `step` keeps one step's dump) and compute its per-step views."""
    records, metrics = load_run(Path(run_dir), step)
    return RunData(name or Path(run_dir).name or str(run_dir), Path(run_dir), records, metrics,
                   extract_series(metrics, records), step_funnels(records), step_reasons(records),
                   step_accuracies(records), step_hops(records))
