"""What a run writes for its user (SPEC §6): task dumps, metrics.jsonl, TensorBoard or W&B, config.

Task dumps are written whole and atomically per step; metrics.jsonl gets one line per step.
On resume, lines and dumps of steps after the checkpoint are dropped (atomically), so a
re-run step never appears twice.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Optional

from coevo.core.io import (
    append_jsonl,
    atomic_write_jsonl,
    atomic_write_text,
    iter_jsonl,
    iter_lines,
    package_path,
    parse_json_line,
    step_name,
    step_of,
)
from coevo.orchestrate.loggers import open_logger


def dump_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "tasks" / step_name(step, ".jsonl")


def write_task_dump(run_dir: Path, step: int, records: Iterable[dict]) -> Path:
    """`tasks/step_<n>.jsonl`, one record per proposed candidate, written atomically."""
    path = dump_path(run_dir, step)
    atomic_write_jsonl(path, records)
    return path


def read_jsonl(path: Path) -> list[dict]:
    """Records of a run's JSONL output; a torn last line (killed writer) is skipped, others must parse."""
    return [rec for _, rec in iter_jsonl(path, skip_torn_last=True)]


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: write them as null so every reader can parse the line."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


class MetricsLog:
    """metrics.jsonl (one line per step) plus every numeric leaf to the `run.logger` (loggers.py)."""

    def __init__(self, run_dir: Path, logger: str = "tensorboard", project: str = "coevo",
                 config: Optional[dict[str, Any]] = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.writer = open_logger(logger, Path(run_dir), project, config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = _finite({"step": step, **metrics})
        append_jsonl(self.path, record)
        if self.writer is not None:
            self.writer.log({key: value for key, value in _flatten(record).items()
                             if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step"},
                            step)

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps > `step` (they belong to a step that will be re-run)."""
        if self.path.exists():
            keep = [r for r in read_jsonl(self.path) if r.get("step", -1) <= step]
            atomic_write_jsonl(self.path, keep)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def drop_dumps_after(run_dir: Path, step: int) -> None:
    """Remove task dumps of steps > `step` (a resumed run re-creates them)."""
    tasks = Path(run_dir) / "tasks"
    if tasks.is_dir():
        for f in tasks.iterdir():
            n = step_of(f.name, ".jsonl")
            if n is not None and n > step:
                f.unlink()


def write_config(run_dir: Path, yaml_text: str, name: str = "config.yaml") -> None:
    atomic_write_text(Path(run_dir) / name, yaml_text)


def load_reference_questions(path: Optional[str]) -> list[str]:
    """Reference questions: text (one per line) or JSONL with `question`; default: bundled set."""
    p = package_path("proposer", "data/reference_questions.txt") if path is None else Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"run.reference_questions: file {p} does not exist")
    questions = []
    for i, line in iter_lines(p):
        if p.suffix in (".jsonl", ".json") or line.lstrip().startswith("{"):
            rec = parse_json_line(line, f"{p}:{i}")
            if not isinstance(rec, dict) or not isinstance(rec.get("question"), str):
                raise ValueError(f"{p}:{i}: expected an object with a string 'question'")
            questions.append(rec["question"].strip())
        else:
            questions.append(line.strip())
    if not questions:
        raise ValueError(f"run.reference_questions: {p} holds no questions")
    return questions
