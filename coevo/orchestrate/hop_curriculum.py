"""The hop curriculum in a run (`proposer.curriculum`): each step's path length, the state after it, its checkpoint.

The arithmetic is proposer/curriculum.py's. `coevo.run` asks `step_hops` for the step's path
length (the level, or `evidence.hops` when the curriculum is off), feeds the step's accuracy
by hop count (`coevolution_step`'s `StepOutcome.hop_accuracy`) to `advance`, which adds `curriculum/level`
(the level the step played), `curriculum/next_level` and `curriculum/accuracy/<k>` (each
level's window mean) to the step's metrics, and keeps the state in the checkpoint's state.json
beside the data cursor (`checkpoint_state`, `saved_state`): a resumed run continues at the same
level with the same windows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from coevo.core.choices import PathLength, path_length
from coevo.core.config import CoevoConfig
from coevo.train.checkpoint import read_state
from proposer.curriculum import CurriculumRule, CurriculumState, next_state

CHECKPOINT_KEY = "curriculum"  # its key in a checkpoint's state.json


def rule(cfg: CoevoConfig) -> CurriculumRule:
    return CurriculumRule.from_config(cfg.proposer.curriculum, cfg.evidence.max_hops)


def start(cfg: CoevoConfig, saved: Optional[dict[str, Any]] = None) -> Optional[CurriculumState]:
    """None when the curriculum is off; else the saved state (a resume) or level 1 with empty windows.

    A checkpoint written without a curriculum state (by a run from before it existed) starts at level 1.
    """
    if not cfg.proposer.curriculum.enabled:
        return None
    return CurriculumState.from_record(saved, rule(cfg)) if saved is not None else CurriculumState()


def step_hops(cfg: CoevoConfig, state: Optional[CurriculumState]) -> PathLength | int:
    """The path length a step asks for: the curriculum's level, else `evidence.hops`."""
    return state.level if state is not None else path_length(cfg.evidence.hops, cfg.evidence.max_hops)


def advance(cfg: CoevoConfig, state: Optional[CurriculumState], metrics: dict[str, Any],
            accuracy_by_hops: Mapping[int, Optional[float]]) -> tuple[Optional[CurriculumState], dict[str, Any]]:
    """(state after the step, the step's metrics with the `curriculum` block); unchanged when off.

    `accuracy_by_hops`: the step's mean solver accuracy of accepted tasks by path length
    (`coevolution_step`'s `StepOutcome.hop_accuracy`; None or a missing k: no such task).
    """
    if state is None:
        return None, metrics
    new = next_state(state, accuracy_by_hops, rule(cfg))
    block = {"level": state.level, "next_level": new.level,
             "accuracy": {str(k): new.accuracy(k) for k, _ in new.windows}}
    return new, {**metrics, "curriculum": block}


def checkpoint_state(state: Optional[CurriculumState]) -> dict[str, Any]:
    """What goes into state.json (`save_step`'s `extra`): nothing when the curriculum is off."""
    return {} if state is None else {CHECKPOINT_KEY: state.to_record()}


def saved_state(ckpt: Optional[Path]) -> Optional[dict[str, Any]]:
    """The curriculum state a checkpoint holds (None: a fresh start, or none saved)."""
    return read_state(ckpt).get(CHECKPOINT_KEY) if ckpt is not None else None
