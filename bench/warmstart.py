"""Benchmark summary (not a test): the extraction warm-start of the solver, trained against a control.

    .venv/bin/python -m bench.warmstart --trained RUN --control RUN [--eval-trained FILE] [--eval-control FILE]
        [--window 10] [--out FILE.json] [--png FILE.png]

Reads two `coevo.solve` run directories trained on the same extraction tasks with the same seed
(docs/learning.md "Extraction warm-start" has the commands): `trained`, and `control` with
`solve.train=false` (the same rollouts, never updated). Per step, from metrics.jsonl: the sampled
rollouts' format-valid share, EM and F1 (guided replays are not in them), the share of searches whose
results held an answer passage (`i_ans`), searches per rollout, and the seconds of the staged work
(`stage_s`: solve + update, the line's `time_s`; the checkpoint write comes after the line is logged,
so a step's wall time, the console's, is a few seconds more) and of the update alone. Windows of
`--window` steps average each of them; `correct` counts the sampled rollouts that answered right
(EM × sampled rollouts, summed), against `sampled`, the rollouts scored (its own denominator).
`--eval-*`: coevo.eval result files of each arm's solver, summarized as bench.learning does.

Prints ONE JSON line, also written atomically to `--out` (a PNG of the curves to `--png`):
    {"window": W, "arms": {arm: {"run_dir", "steps", "sampled", "correct", "stage_s_median",
     "update_s_median", "series": {"steps": [...], key: [...]}, "windows": [{"steps": [a, b], key: mean}],
     "eval": {...} | null}}}
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from bench.learning import eval_summary
from bench.learning_plot import plot
from coevo.core.io import atomic_write_text
from coevo.evaluate.report import load_run, number

ARMS = ("trained", "control")
KEYS = ("format_valid", "em", "f1", "i_ans", "mean_searches", "stage_s", "update_s")
PANELS = [("format_valid", "solver format-valid (sampled)"), ("em", "EM (sampled rollouts)"),
          ("f1", "F1 (sampled rollouts)"), ("i_ans", "searches showing an answer passage"),
          ("mean_searches", "searches per rollout"), ("stage_s", "solve + update seconds")]


def step_row(line: dict) -> dict[str, Any]:
    """One metrics.jsonl line of coevo.solve as the KEYS (None where the line lacks one)."""
    solver, ranker, times = line.get("solver") or {}, line.get("ranker") or {}, line.get("time_s") or {}
    seconds = [number(v) for v in times.values()]
    return {"format_valid": number(solver.get("format_valid")), "em": number(solver.get("em")),
            "f1": number(solver.get("f1")), "i_ans": number(ranker.get("i_ans")),
            "mean_searches": number(solver.get("mean_searches")),
            "stage_s": sum(s for s in seconds if s is not None) if seconds else None,
            "update_s": number(times.get("update")),
            "sampled": int(line.get("episodes") or 0) - int(solver.get("guided") or 0)}


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return round(statistics.fmean(present), 4) if present else None


def _median(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize_arm(run_dir: Path, window: int) -> dict[str, Any]:
    """The per-step series, window means and denominators of one coevo.solve run directory."""
    _, metrics = load_run(run_dir)
    if not metrics:
        raise ValueError(f"{run_dir}/metrics.jsonl: no steps recorded; expected a coevo.solve run directory")
    rows = [step_row(m) for m in metrics]
    steps = [int(m["step"]) for m in metrics]
    series: dict[str, list] = {"steps": steps, **{k: [r[k] for r in rows] for k in KEYS}}
    windows = [{"steps": [steps[i], steps[min(i + window, len(steps)) - 1]],
                **{k: _mean(series[k][i:i + window]) for k in KEYS}} for i in range(0, len(steps), window)]
    correct = sum(round((r["em"] or 0.0) * r["sampled"]) for r in rows)
    return {"run_dir": str(run_dir), "steps": len(steps), "sampled": sum(r["sampled"] for r in rows),
            "correct": correct, "stage_s_median": _median(series["stage_s"]),
            "update_s_median": _median(series["update_s"]),
            "series": series, "windows": windows}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.warmstart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for arm in ARMS:
        parser.add_argument(f"--{arm}", type=Path, required=True, help=f"the {arm} arm's coevo.solve run dir")
        parser.add_argument(f"--eval-{arm}", type=Path, default=None, help=f"coevo.eval result of the {arm} arm")
    parser.add_argument("--window", type=int, default=10, help="steps per window mean")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window must be >= 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    arms = {}
    for arm in ARMS:
        arms[arm] = summarize_arm(getattr(args, arm), args.window)
        eval_file = getattr(args, f"eval_{arm}")
        result = json.loads(eval_file.read_text(encoding="utf-8")) if eval_file else None
        arms[arm]["eval"] = {**eval_summary(result), "file": str(eval_file)} if result is not None else None
    line = json.dumps({"window": args.window, "arms": arms}, allow_nan=False)
    if args.out:
        atomic_write_text(args.out, line + "\n")
    if args.png:
        plot(arms, args.png, title="extraction warm-start: trained vs control (solve.train=false)", panels=PANELS)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
