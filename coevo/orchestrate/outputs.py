"""What a run writes for its user (docs/method.md §6): task dumps, metrics.jsonl, TensorBoard or W&B, config.

Task dumps are written whole and atomically per step; metrics.jsonl gets one line per step.
On resume, lines and dumps of steps after the checkpoint are dropped (atomically), and the
TensorBoard events rebuilt from the lines kept, so a re-run step never appears twice.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable, Optional

from coevo.core.config import CoevoConfig
from coevo.core.io import (
    append_jsonl,
    atomic_dir,
    atomic_write_jsonl,
    atomic_write_text,
    iter_jsonl,
    step_name,
    step_of,
)
from coevo.orchestrate.loggers import open_logger
from coevo.train.memory import Term, estimate_text
from coevo.train.preflight import ModelSource


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
    """metrics.jsonl (one line per step) plus every numeric leaf to the `run.logger` (loggers.py).

    `start`: the first step this run will log. Records of steps >= `start` (logged by an earlier
    run that got further than its last checkpoint) are dropped from metrics.jsonl, and the
    TensorBoard directory is rebuilt from what remains, so no step is ever logged twice.
    """

    def __init__(self, run_dir: Path, logger: str = "tensorboard", project: str = "coevo",
                 config: Optional[dict[str, Any]] = None, start: Optional[int] = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.tb_dir = Path(run_dir) / "tensorboard"
        if start is not None:
            self.truncate_after(start - 1)
            if logger == "tensorboard" and self.tb_dir.exists():
                self._rebuild_tensorboard()
        self.writer = open_logger(logger, Path(run_dir), project, config)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = _finite({"step": step, **metrics})
        append_jsonl(self.path, record)
        if self.writer is not None:
            self.writer.log(_scalars(record), step)

    def truncate_after(self, step: int) -> None:
        """Drop lines of steps > `step` (they belong to a step that will be re-run)."""
        if self.path.exists():
            keep = [r for r in read_jsonl(self.path) if r.get("step", -1) <= step]
            atomic_write_jsonl(self.path, keep)

    def _rebuild_tensorboard(self) -> None:
        """Replace the event files with the scalars of metrics.jsonl (event files can only be appended to)."""
        from torch.utils.tensorboard import SummaryWriter

        records = read_jsonl(self.path) if self.path.exists() else []
        with atomic_dir(self.tb_dir) as tmp:
            writer = SummaryWriter(log_dir=str(tmp))
            for record in records:
                _add_scalars(writer, record)
            writer.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numeric leaves of a metrics record, named `group/key` (the step itself excluded)."""
    return {key: value for key, value in _flatten(record).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step"}


def _add_scalars(writer: Any, record: dict[str, Any]) -> None:
    for key, value in _scalars(record).items():
        writer.add_scalar(key, value, record["step"])


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _share(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"


def step_headline(m: dict[str, Any]) -> str:
    """The headline metrics of one step for its terminal line: acceptance (co-evolution) or questions
    (`coevo.solve`), solver reward and format-valid share, ranker format-valid share ("-": no value)."""
    first = (f"accepted {m['accepted']}/{m['candidates']}" if "accepted" in m else f"questions {m['questions']}")
    return (f"{first} | solver reward {_share(m['reward']['solver'])} format {_share(m['solver']['format_valid'])}"
            f" | ranker format {_share(m['ranker']['format_valid'])}")


def start_line(prog: str, cfg: CoevoConfig, sources: list[ModelSource], terms: Optional[list[Term]]) -> str:
    """The line an entry point starts with once its preflight passed: models, run dir, estimated memory."""
    models = ", ".join(f"{s.role} {s.preset}" + (f" ({s.detail})" if s.kind == "download" else "") for s in sources)
    memory = f"; memory: {estimate_text(terms)}" if terms else ""
    return f"{prog}: {cfg.experiment_name}: {models}; run dir {cfg.run.dir} (log: run.log){memory}"


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
