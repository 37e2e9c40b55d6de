"""Run inspection behind `python -m coevo.inspect <run_dir>`: audit a run's curriculum from its dumps
(docs/method.md §6).

Loading (`load_run`: task dumps and metrics lines, old dump keys renamed), filters and the
terminal summary: acceptance per stage with reason-code counts, accuracy (difficulty) and
hop histograms, searches per solved task, reward trends, example tasks. Reads runs that are
still going or were killed (torn last lines are skipped). The HTML pages are
`coevo.evaluate.report_page`, their per-step series `coevo.evaluate.series`.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from coevo.core.io import iter_jsonl, step_of
from coevo.core.stats import mean


def _check_structure(rec: dict, where: str) -> None:
    """The nested parts inspection walks must have their documented shapes (README "Outputs")."""
    for key in ("target_verdict", "question_verdict", "evidence_path"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            raise ValueError(f"{where}: {key!r} must be an object or null, got {type(rec[key]).__name__}")
    hops = (rec.get("evidence_path") or {}).get("hops", [])
    if not isinstance(hops, list):
        raise ValueError(f"{where}: 'evidence_path.hops' must be a list, got {type(hops).__name__}")
    rollouts = rec.get("rollouts") or []
    if not isinstance(rollouts, list) or not all(isinstance(ro, dict) for ro in rollouts):
        raise ValueError(f"{where}: 'rollouts' must be a list of objects")
    for i, ro in enumerate(rollouts):
        calls = ro.get("ranker_calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ValueError(f"{where}: 'rollouts[{i}].ranker_calls' must be a list of objects")


def _read_records(path: Path) -> list[dict]:
    """Objects of a run's JSONL output; a torn last line (a killed writer) is skipped."""
    return [rec for _, rec in iter_jsonl(path, objects=True, skip_torn_last=True)]


def load_run(run_dir: Path, step: Optional[int] = None) -> tuple[list[dict], list[dict]]:
    """(task records with their step, metrics lines) of a run directory; old dump keys are renamed. The corpus
    clozes `solver.extraction_mix` adds to a dump (`"kind": "extraction"`) are not task records: left out.

    A line that is not a JSON object, or a record whose nested parts have the wrong shape,
    is an error naming file and line; leaf values (accuracy, texts) are shown as they are.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {run_dir} does not exist")
    records = []
    dumps = sorted((n, f) for f in (run_dir / "tasks").glob("step_*.jsonl")
                   if (n := step_of(f.name, ".jsonl")) is not None)
    for n, f in dumps:
        if step is None or n == step:
            for line_no, r in iter_jsonl(f, objects=True, skip_torn_last=True):
                if r.get("kind") == "extraction":  # a mixed corpus cloze, not a candidate: its figures are
                    continue  # the metrics' extraction block (coevo/orchestrate/extraction_mix.py)
                _check_structure(r, f"{f}:{line_no}")
                records.append({**r, "step": n})
    metrics_path = run_dir / "metrics.jsonl"
    metrics = _read_records(metrics_path) if metrics_path.exists() else []
    return records, metrics


def number(x: Any) -> Optional[float]:
    """`x` as a float when it is a finite JSON number (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def label(x: Any) -> str:
    """A dump value as a histogram key (a hand-edited dump may hold any JSON there)."""
    return x if isinstance(x, str) else json.dumps(x)


def hop_count(rec: dict) -> Optional[int]:
    path = rec.get("evidence_path") or {}
    return len(path.get("hops", [])) if path else None


def filter_records(records: list[dict], verdict: Optional[str] = None, reason: Optional[str] = None,
                   hops: Optional[int] = None) -> list[dict]:
    """verdict: accepted | rejected; reason: a reason code; hops: evidence-path length."""
    out = records
    if verdict == "accepted":
        out = [r for r in out if r.get("accepted")]
    elif verdict == "rejected":
        out = [r for r in out if not r.get("accepted")]
    if reason:
        out = [r for r in out if r.get("reason") == reason]
    if hops is not None:
        out = [r for r in out if hop_count(r) == hops]
    return out


def summarize(records: list[dict]) -> dict[str, Any]:
    """Counts and histograms shown in the terminal and the HTML report.

    An accuracy that is not a number (a hand-edited or foreign dump) is not binned; it is
    counted in `accuracy_invalid`.
    """
    n = len(records)
    stages = Counter(label(r.get("stage", "?")) for r in records)
    reasons = Counter(label(r.get("reason", "?")) for r in records if not r.get("accepted"))
    accepted = [r for r in records if r.get("accepted")]
    accuracies = [r["accuracy"] for r in accepted if r.get("accuracy") is not None]
    acc_hist = Counter(round(a, 2) for x in accuracies if (a := number(x)) is not None)
    hop_hist = Counter(h for r in records if (h := hop_count(r)) is not None)
    solved_searches = [number(ro.get("n_searches", 0)) for r in accepted for ro in r.get("rollouts", [])
                       if (number(ro.get("correctness")) or 0.0) > 0]
    return {
        "candidates": n,
        "target_valid": sum(1 for r in records if (r.get("target_verdict") or {}).get("ok") is True),
        "with_path": sum(1 for r in records if r.get("evidence_path")),
        "accepted": len(accepted),
        "stage_counts": dict(stages),
        "reason_counts": dict(reasons.most_common()),
        "accuracy_hist": dict(sorted(acc_hist.items())),
        "accuracy_invalid": len(accuracies) - sum(acc_hist.values()),
        "hop_hist": dict(sorted(hop_hist.items())),
        "mean_searches_solved": mean(x for x in solved_searches if x is not None),
    }


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.1f}%)" if b else f"{a}/0"


def format_summary(summary: dict[str, Any], metrics: list[dict], examples: list[dict]) -> str:
    """Plain-text tables for the terminal."""
    n = summary["candidates"]
    lines = ["== acceptance by stage ==",
             f"  target valid    {_pct(summary['target_valid'], n)}",
             f"  evidence path   {_pct(summary['with_path'], n)}",
             f"  task accepted   {_pct(summary['accepted'], n)}",
             "== rejection reasons =="]
    lines += [f"  {k:<28} {v}" for k, v in summary["reason_counts"].items()] or ["  (none)"]
    lines.append("== solver accuracy on accepted tasks (difficulty) ==")
    lines += [f"  p={k:<5} {'#' * v} {v}" for k, v in summary["accuracy_hist"].items()] or ["  (none)"]
    if summary["accuracy_invalid"]:
        lines.append(f"  ({summary['accuracy_invalid']} accepted tasks with a non-numeric accuracy)")
    lines.append("== evidence-path hops ==")
    lines += [f"  {k} hops  {v}" for k, v in summary["hop_hist"].items()] or ["  (none)"]
    ms = summary["mean_searches_solved"]
    lines.append(f"== searches per solved rollout: {ms:.2f}" if ms is not None
                 else "== searches per solved rollout: n/a")
    if metrics:
        lines.append("== reward trends (per step) ==")
        lines.append("  step  proposer  solver  ranker  acceptance")
        for m in metrics:
            r = _dict(m.get("reward"))
            lines.append(f"  {str(m.get('step')):>4}  {_fmt(r.get('proposer'))}  {_fmt(r.get('solver'))}  "
                         f"{_fmt(r.get('ranker'))}  {_fmt(_dict(m.get('acceptance')).get('task'))}")
    lines.append("== examples ==")
    for r in examples:
        lines.append(f"  [step {r.get('step')}] {r.get('reason')}: target={r.get('target')!r} "
                     f"question={r.get('question')!r} accuracy={r.get('accuracy')}")
    return "\n".join(lines)


def _fmt(x: Any) -> str:
    return f"{x:8.3f}" if (x := number(x)) is not None else f"{'-':>8}"


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}
