"""Hand labels of accepted tasks, and the label-free question checks measured against them (docs/task-labels.md).

    .venv/bin/python -m bench.task_labels dump RUN_DIR --out FILE.jsonl
    .venv/bin/python -m bench.task_labels score FILE.jsonl [-- overrides]
    .venv/bin/python -m bench.task_labels merge A.jsonl B.jsonl --out FILE.jsonl
    .venv/bin/python -m bench.task_labels questions RUN_DIR --out FILE.jsonl

`dump` writes every accepted task of RUN_DIR/tasks/step_<n>.jsonl, in step order, one JSON line each:
{"id", "step", "question", "target", "answers", "sentences": ["<title>: <sentence>", …], "path": the
evidence path record, "label": null, "note": null}. The labeller sets `label` to "true", "false" or
"loose" by the rubric of docs/task-labels.md (and may write a reason in `note`). Corpus clozes of
`solver.extraction_mix` and rejected candidates are not tasks the proposer wrote: they are left out.

`score` runs each check of evidence/task_checks.py (the evidence stage's own code; no model, no corpus) on
every labelled task and prints ONE JSON line:
    {"labelled": n, "true": a, "loose": b, "false": c, "unlabelled": u,
     "f": {"strict": true share, "loose": (true + loose) share},
     "checks": {reason code: {"key": "evidence.<key>", "rejected": r, "rejected_false": x, "rejected_loose": y,
                              "precision": x / r, "recall": x / c}},   (also "any": every check together)
     "in_force": {"keys": [...], "kept": k, "f": {"strict", "loose"}},
     "distinct": {"tasks": d, "true", "loose", "false", "f": {"strict", "loose"}, "top": [[question, target, n], …]}}
Precision and recall are of a check's rejections against the `false` labels: a rejected `loose` task counts
against precision (it is not false). A share with a zero denominator is null. `in_force`: the checks the
config composed from the overrides switches on (e.g. `evidence.relation_support=true`), and f over the tasks
they all keep: what turning them on would leave. `distinct`: the labelled tasks counted once per (question, target)
(`bench.learning_stats.task_key`), each taking the lowest label it got (as `merge` does): a run that drew the same
reference question again accepts the same task again (a small reference pool cycles), and a repeated true task
raises the per-task f without widening what the proposer has learned to write; `top` lists the five most repeated.

`merge` joins two labellers' files of the same tasks (matched by `id`; each file must hold the same ids,
once each, every one labelled): each task takes the LOWER of its two labels (true > loose > false, the
rubric's rule for a doubt) and both notes ("A: …; B: …"), in A's order. It prints ONE JSON line:
{"tasks": n, "agree": a, "pairs": {"<A label>/<B label>": count, …}, "out": FILE}.

`questions` writes the run's accepted tasks as a `coevo.eval` question file (`data=FILE`, on the run's
corpus), one line each in dump order: {"id", "question", "answers", "gold_ids": the path's passages,
"dataset": "accepted"}; two solvers evaluated on it are paired question by question (bench.learning_stats).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

from bench import split_overrides
from bench.learning_stats import task_key
from coevo.core.config import compose
from coevo.core.io import atomic_write_jsonl, iter_jsonl, step_of
from evidence.task_checks import CHECKS

LABELS = ("true", "false", "loose")
RANK = {"false": 0, "loose": 1, "true": 2}  # merge keeps the lower


def _share(n: int, d: int) -> Optional[float]:
    return round(n / d, 4) if d else None


def step_files(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's task dumps, in step order; ValueError when there is none."""
    tasks = run_dir / "tasks"
    found = sorted((s, p) for p in tasks.glob("step_*.jsonl") if (s := step_of(p.name, ".jsonl")) is not None)
    if not found:
        raise ValueError(f"{tasks}: no step_<n>.jsonl task dump (expected a coevo.run directory)")
    return found


def dump_record(rec: dict[str, Any], step: int) -> dict[str, Any]:
    """The labelling line of one accepted task record of a task dump."""
    path = rec.get("evidence_path") or {}
    hops = path.get("hops") or []
    return {"id": rec.get("task_id"), "step": step, "question": rec.get("question"), "target": rec.get("target"),
            "answers": rec.get("answers") or [],
            "sentences": [f"{h.get('title', '')}: {h.get('sentence', '')}" for h in hops],
            "path": path or None, "label": None, "note": None}


def accepted_records(run_dir: Path) -> list[tuple[int, dict[str, Any]]]:
    """(step, record) of every accepted task of the run's dumps, in step order."""
    return [(step, rec) for step, file in step_files(run_dir)
            for _, rec in iter_jsonl(file, objects=True) if rec.get("accepted") is True]


def dump(run_dir: Path, out: Path) -> int:
    """Write the labelling file of every accepted task of the run; returns how many."""
    rows = [dump_record(rec, step) for step, rec in accepted_records(run_dir)]
    atomic_write_jsonl(out, rows)
    return len(rows)


def eval_questions(run_dir: Path) -> list[dict[str, Any]]:
    """The `questions` lines (module docstring) of the run's accepted tasks with a question and answers."""
    return [{"id": rec["task_id"], "question": rec["question"], "answers": rec["answers"],
             "gold_ids": (rec.get("evidence_path") or {}).get("evidence_ids") or [], "dataset": "accepted"}
            for _, rec in accepted_records(run_dir)
            if rec.get("task_id") and rec.get("question") and rec.get("answers")]


def read_labels(path: Path) -> list[dict[str, Any]]:
    """The labelling file's lines; a label other than null, "true", "false", "loose" raises ValueError."""
    rows = []
    for line_no, rec in iter_jsonl(path, objects=True):
        if rec.get("label") not in (None, *LABELS):
            raise ValueError(f"{path}:{line_no}: label must be one of {LABELS} or null, got {rec.get('label')!r}")
        rows.append(rec)
    return rows


def lower(a: str, b: str) -> str:
    """The lower of two labels (true > loose > false): the rubric's rule for a doubt, and merge's."""
    return min(a, b, key=RANK.__getitem__)


def _label_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {lab: sum(r["label"] == lab for r in rows) for lab in LABELS}


def _f(rows: list[dict[str, Any]]) -> dict[str, Optional[float]]:
    true = sum(r["label"] == "true" for r in rows)
    loose = sum(r["label"] == "loose" for r in rows)
    return {"strict": _share(true, len(rows)), "loose": _share(true + loose, len(rows))}


def _rejects(row: dict[str, Any]) -> dict[str, bool]:
    return {reason: find(row.get("question"), row.get("target"), row.get("path")) is not None
            for _, reason, find in CHECKS}


def _check_row(key: str, rejected: list[dict[str, Any]], n_false: int) -> dict[str, Any]:
    hit = sum(r["label"] == "false" for r in rejected)
    return {"key": key, "rejected": len(rejected), "rejected_false": hit,
            "rejected_loose": sum(r["label"] == "loose" for r in rejected),
            "precision": _share(hit, len(rejected)), "recall": _share(hit, n_false)}


def distinct(labelled: list[dict[str, Any]]) -> dict[str, Any]:
    """Labelled rows counted once per normalized (question, target), each with the lowest label it got."""
    label: dict[tuple[str, str], str] = {}
    copies: Counter[tuple[str, str]] = Counter()
    for r in labelled:
        key = task_key(r.get("question"), r.get("target"))
        label[key] = lower(label.get(key, "true"), r["label"])
        copies[key] += 1
    rows = [{"label": lab} for lab in label.values()]
    return {"tasks": len(rows), **_label_counts(rows), "f": _f(rows),
            "top": [[q, t, n] for (q, t), n in copies.most_common(5) if n > 1]}


def score(rows: list[dict[str, Any]], keys_in_force: Sequence[str] = ()) -> dict[str, Any]:
    """The figures `score` prints (module docstring) for labelling rows; `keys_in_force`: `evidence.*` keys."""
    labelled = [r for r in rows if r.get("label") in LABELS]
    n_false = sum(r["label"] == "false" for r in labelled)
    rejects = [_rejects(r) for r in labelled]
    checks = {reason: _check_row(f"evidence.{key}", [r for r, rej in zip(labelled, rejects) if rej[reason]], n_false)
              for key, reason, _ in CHECKS}
    checks["any"] = _check_row("all checks", [r for r, rej in zip(labelled, rejects) if any(rej.values())], n_false)
    force = [reason for key, reason, _ in CHECKS if key in keys_in_force]
    kept = [r for r, rej in zip(labelled, rejects) if not any(rej[c] for c in force)]
    return {"labelled": len(labelled), **_label_counts(labelled),
            "unlabelled": len(rows) - len(labelled), "f": _f(labelled), "checks": checks,
            "in_force": {"keys": [f"evidence.{k}" for k, _, _ in CHECKS if k in keys_in_force], "kept": len(kept),
                         "f": _f(kept)},
            "distinct": distinct(labelled)}


def _by_id(path: Path) -> dict[Any, dict[str, Any]]:
    rows: dict[Any, dict[str, Any]] = {}
    for row in read_labels(path):
        if row.get("label") is None:
            raise ValueError(f"{path}: task {row.get('id')!r} is not labelled (merge needs every task labelled)")
        if row.get("id") in rows:
            raise ValueError(f"{path}: task {row.get('id')!r} appears twice")
        rows[row.get("id")] = row
    return rows


def merge(a: Path, b: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The merged rows and the agreement figures of two labellers' files (module docstring)."""
    first, second = _by_id(a), _by_id(b)
    if set(first) != set(second):
        odd = sorted(map(str, set(first) ^ set(second)))[:3]
        raise ValueError(f"{a} and {b} do not label the same tasks (e.g. {', '.join(odd)})")
    rows, pairs = [], {}
    for task_id, row in first.items():
        la, lb = row["label"], second[task_id]["label"]
        pairs[f"{la}/{lb}"] = pairs.get(f"{la}/{lb}", 0) + 1
        rows.append({**row, "label": lower(la, lb),
                     "note": f"A: {row.get('note') or ''}; B: {second[task_id].get('note') or ''}"})
    agree = sum(n for k, n in pairs.items() if len(set(k.split("/"))) == 1)
    return rows, {"tasks": len(rows), "agree": agree, "pairs": dict(sorted(pairs.items()))}


def keys_in_force(overrides: Sequence[str]) -> list[str]:
    """The `CHECKS` keys the config composed from `overrides` switches on."""
    evidence = compose(list(overrides)).evidence
    return [key for key, _, _ in CHECKS if bool(evidence[key])]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`dump`, `score`, `merge` or `questions` (module docstring); 2 with a message on stderr for bad input."""
    options, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench.task_labels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="accepted tasks of a run, to label")
    d.add_argument("run_dir", type=Path)
    d.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("score", help="each check's precision and recall against the labels")
    s.add_argument("file", type=Path)
    m = sub.add_parser("merge", help="two labellers' files: the lower label of each task, and their agreement")
    m.add_argument("a", type=Path)
    m.add_argument("b", type=Path)
    m.add_argument("--out", type=Path, required=True)
    q = sub.add_parser("questions", help="accepted tasks as a coevo.eval question file")
    q.add_argument("run_dir", type=Path)
    q.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(options)
    if args.command != "score" and overrides:
        parser.error(f"{args.command} takes no overrides")
    try:
        if args.command == "dump":
            print(json.dumps({"tasks": dump(args.run_dir, args.out), "out": str(args.out)}))
        elif args.command == "questions":
            rows = eval_questions(args.run_dir)
            atomic_write_jsonl(args.out, rows)
            print(json.dumps({"questions": len(rows), "out": str(args.out)}))
        elif args.command == "merge":
            rows, figures = merge(args.a, args.b)
            atomic_write_jsonl(args.out, rows)
            print(json.dumps({**figures, "out": str(args.out)}))
        else:
            print(json.dumps(score(read_labels(args.file), keys_in_force(overrides))))
    except (OSError, ValueError) as e:
        print(f"bench.task_labels: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
