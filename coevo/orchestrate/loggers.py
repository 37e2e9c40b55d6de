"""Scalar loggers behind `run.logger`: TensorBoard (default), Weights & Biases, or none.

`outputs.MetricsLog` always writes metrics.jsonl and hands each step's numeric leaves, named
`group/key` (`reward/solver`, `update/ranker/loss`), to the logger chosen here.

Weights & Biases is an optional package (`pip install 'coevo[wandb]'`): with
`run.logger=wandb` and no package, opening the logger raises ImportError saying what to
install, before any model is loaded; there is no silent fallback to another logger. It runs
offline (files under `<run.dir>/wandb`, uploaded later with `wandb sync`) unless the user set
`WANDB_MODE`, so a run never needs a network. Each process is one W&B run named after
`run.dir`; a resumed run is a new W&B run that starts at the resumed step.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Protocol

WANDB_MISSING = ("run.logger=wandb needs the Weights & Biases client, which is not installed: "
                 "install it with `pip install 'coevo[wandb]'` (or `pip install wandb`), "
                 "or choose run.logger=tensorboard or run.logger=none")


class ScalarLogger(Protocol):
    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class TensorBoardLogger:
    """Event files in `<run_dir>/tensorboard`, flushed every step (a killed run keeps its curves)."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def import_wandb() -> ModuleType:
    """The `wandb` module, or ImportError naming what to install."""
    try:
        import wandb
    except ImportError as e:
        raise ImportError(WANDB_MISSING) from e
    return wandb


class WandbLogger:
    """One Weights & Biases run per process, offline unless WANDB_MODE says otherwise."""

    def __init__(self, run_dir: Path, project: str, config: Optional[dict[str, Any]] = None) -> None:
        wandb = import_wandb()
        mode = os.environ.get("WANDB_MODE") or "offline"
        self.run = wandb.init(project=project, name=Path(run_dir).resolve().name, dir=str(run_dir),
                              config=config or {}, mode=mode)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def open_logger(kind: str, run_dir: Path, project: str = "coevo",
                config: Optional[dict[str, Any]] = None) -> Optional[ScalarLogger]:
    """The logger of `run.logger` (`tensorboard`, `wandb` or `none`: no logger)."""
    if kind == "tensorboard":
        return TensorBoardLogger(run_dir)
    if kind == "wandb":
        return WandbLogger(run_dir, project, config)
    if kind == "none":
        return None
    raise ValueError(f"run.logger={kind!r}: expected one of tensorboard, wandb, none")
