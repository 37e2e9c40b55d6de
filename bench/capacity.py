"""Benchmark (not a test): what the untrained solver can answer when the answer is in the corpus.

    .venv/bin/python -m bench.capacity [--limit 70] [--data FILE] [--modes none,frozen,oracle]
        [--searches 1,2] [--rollout vllm|hf] [--out DIR] [--timeout S] [-- HYDRA_OVERRIDES...]

The ceiling the hop curriculum aims at. For each ranker mode in `--modes` and each search budget
in `--searches` it runs

    python -m coevo.eval experiment=small_learning mode=agent rollout=<--rollout> ranker.mode=<mode>
        solver.max_searches=<n> data=<--data> limit=<--limit> seed=0 out=<out>/<mode>-<n>.json [overrides]

on the first `--limit` questions of each dataset of `--data` (default
`$COEVO_SHARED_DATA/wiki_mini/questions_dev.jsonl`: every answer passage is in the eval's default
corpus wiki_mini; 70 per dataset = 212 questions), one cell after the other, each in its own
session (nothing it starts outlives it). `none` shows the first-stage order, `frozen` the
untrained ranker's, `oracle` puts answer-bearing passages first: the oracle row is the most the
solver could get from retrieval it controls only through its queries.

Per cell and dataset: `n`, `em`, `f1`, `cover_em` (from coevo.eval's result), and
`answer_in_observation`: the share of questions where a gold alias occurs (normalized, on token
boundaries) in an `<information>` block the solver read; `echo`: the share of well-formed
answers that repeat the question or one of the solver's own queries. A cell whose eval scored
fewer questions than it was given fails the bench (its denominators are checked).

Stdout is ONE JSON line, also written atomically to `<out>/capacity.json` after every cell:

    {"data", "limit", "rollout", "overrides", "wall_s", "failures" (empty: exit 0),
     "cells": [{"mode", "searches", "command", "eval_s", "error", "expected",
                "datasets": {name: {"n", "em", "f1", "cover_em", "answer_in_observation", "echo"}},
                "average": {same keys, macro over datasets; n pooled}}]}
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

from bench import split_overrides
from coevo.core.io import atomic_write_text
from coevo.core.scoring import echoes, normalize_answer
from coevo.core.stats import mean

_ROOT = Path(__file__).resolve().parents[1]

MODES = ("none", "frozen", "oracle")
SCORES = ("em", "f1", "cover_em", "answer_in_observation", "echo")
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.S)


def observations(output: str) -> list[str]:
    """The `<information>` blocks of an agent-mode transcript (what the solver read)."""
    return _INFORMATION.findall(output) if isinstance(output, str) else []


def answer_observed(record: dict[str, Any]) -> bool:
    """Whether some gold alias occurs, normalized and on token boundaries, in a block the solver read."""
    seen = [f" {normalize_answer(block)} " for block in observations(record.get("output", ""))]
    golds = [g for a in record.get("answers") or [] if isinstance(a, str) and (g := normalize_answer(a))]
    return any(f" {gold} " in block for gold in golds for block in seen)


def echoed(record: dict[str, Any]) -> bool:
    """A well-formed answer that repeats the question or one of the solver's own queries."""
    queries = [s.get("sub_query", "") for s in record.get("retrievals") or [] if isinstance(s, dict)]
    answer = record.get("prediction") or ""
    return bool(record.get("format_ok")) and echoes(answer, [record.get("question", ""), *queries])


def dataset_scores(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """n, EM, F1, cover-EM (coevo.eval's per-question scores), answer-in-observation and echo shares."""
    answered = [r for r in records if r.get("format_ok")]
    return {"n": len(records), "em": mean([float(r.get("em", 0.0)) for r in records]),
            "f1": mean([float(r.get("f1", 0.0)) for r in records]),
            "cover_em": mean([float(r.get("cover_em", 0.0)) for r in records]),
            "answer_in_observation": mean([float(answer_observed(r)) for r in records]),
            "echo": mean([float(echoed(r)) for r in answered]) if answered else None}


def cell_scores(result: dict[str, Any]) -> dict[str, Any]:
    """Per-dataset scores of one coevo.eval result and their macro average (n pooled)."""
    by_dataset: dict[str, list[dict]] = {}
    for record in result.get("predictions") or []:
        by_dataset.setdefault(str(record.get("dataset")), []).append(record)
    datasets = {name: dataset_scores(recs) for name, recs in sorted(by_dataset.items())}
    average: dict[str, Any] = {"n": sum(d["n"] for d in datasets.values())}
    for key in SCORES:
        average[key] = mean([d[key] for d in datasets.values() if d[key] is not None])
    return {"datasets": datasets, "average": average}


def expected_questions(data: Path, limit: Optional[int]) -> int:
    """How many questions coevo.eval selects from `data`: the first `limit` of each dataset."""
    counts = Counter(json.loads(line).get("dataset") for line in data.read_text(encoding="utf-8").splitlines()
                     if line.strip())
    return sum(min(c, limit) if limit else c for c in counts.values())


def run_cell(mode: str, searches: int, args: argparse.Namespace) -> dict[str, Any]:
    """One coevo.eval run; its scores, or its error (exit code and output tail)."""
    path = args.out / f"{mode}-{searches}.json"
    cmd = [sys.executable, "-m", "coevo.eval", "experiment=small_learning", "mode=agent", f"rollout={args.rollout}",
           f"ranker.mode={mode}", f"solver.max_searches={searches}", f"data={args.data}", f"limit={args.limit}",
           "seed=0", f"out={path}", *args.overrides]
    shown = shlex.join(["python", *cmd[1:]])
    print(f"== {shown}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(args.out / f"{mode}-{searches}.log", "w", encoding="utf-8") as log:
        try:
            proc = subprocess.run(cmd, cwd=_ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout,
                                  start_new_session=True)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -9
    cell = {"mode": mode, "searches": searches, "command": shown, "eval_s": round(time.perf_counter() - t0, 1),
            "expected": args.expected, "error": None}
    if rc != 0 or not path.exists():
        tail = (args.out / f"{mode}-{searches}.log").read_text(encoding="utf-8", errors="replace").splitlines()[-3:]
        return {**cell, "error": f"coevo.eval exited with code {rc}: " + " | ".join(tail)}
    return {**cell, **cell_scores(json.loads(path.read_text(encoding="utf-8")))}


def failures(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Why the bench fails: a cell that errored or scored other than the questions it was given."""
    out = []
    for c in cells:
        if c["error"]:
            out.append(f"{c['mode']}-{c['searches']}: {c['error']}")
        elif c["average"]["n"] != c["expected"]:
            out.append(f"{c['mode']}-{c['searches']}: scored {c['average']['n']} of {c['expected']} questions")
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    options, overrides = split_overrides(argv)
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--limit", type=int, default=70, help="questions per dataset")
    p.add_argument("--data", type=Path, default=Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data"))
                   / "wiki_mini" / "questions_dev.jsonl")
    p.add_argument("--modes", default=",".join(MODES), help="ranker modes, comma-separated")
    p.add_argument("--searches", default="1,2", help="solver.max_searches values, comma-separated")
    p.add_argument("--rollout", choices=("vllm", "hf"), default="vllm")
    p.add_argument("--out", type=Path, default=None, help="default runs/capacity-<stamp>")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per cell")
    args = p.parse_args(options)
    args.overrides = overrides
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: expected a comma-separated subset of {','.join(MODES)}")
    try:
        args.searches = [int(n) for n in args.searches.split(",") if n]
    except ValueError:
        p.error("--searches: expected comma-separated integers, e.g. 1,2")
    if args.limit < 1 or not args.searches or min(args.searches) < 1:
        p.error("--limit and every --searches value must be >= 1")
    args.data = args.data.expanduser().resolve()
    if not args.data.is_file():
        p.error(f"--data {args.data}: no such file")
    args.out = (args.out or Path("runs") / f"capacity-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.expected = expected_questions(args.data, args.limit)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"data": str(args.data), "limit": args.limit, "rollout": args.rollout,
                              "overrides": args.overrides, "cells": []}
    for mode in args.modes:
        for searches in args.searches:
            result["cells"].append(run_cell(mode, searches, args))
            result.update(wall_s=round(time.perf_counter() - t0, 1), failures=failures(result["cells"]))
            atomic_write_text(args.out / "capacity.json", json.dumps(result) + "\n")
    print(json.dumps(result), flush=True)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
