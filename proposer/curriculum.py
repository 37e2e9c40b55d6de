"""Hop curriculum (`proposer.curriculum`): each step's path length follows the solver's accuracy (not ZEST).

State arithmetic only, in the style of coevo/core/grpo.py: `next_state(state, accuracy_by_hops,
rule)` returns the state after one step and changes nothing. The run keeps the state between
steps and in each checkpoint (coevo/orchestrate/hop_curriculum.py), so a resumed run continues
at the same level with the same windows.

- The run starts at level 1; the level is the step's fixed path length (`evidence.hops` = level).
- After a step, each hop count k with accepted tasks appends the mean solver accuracy of those
  tasks to level k's window, which keeps the last `window` steps. A step with no task of k hops
  adds nothing to that window: no tasks is no evidence, not accuracy 0.
- Once the current level's window is full: a mean of at least `up` moves one level up (at most
  `max_level` = evidence.max_hops), a mean of at most `down` one level down (at least 1).
- Entering a level clears its window, so the decision there waits for `window` steps played at
  it: the steps that moved the run up from a level cannot send it straight back up after a fall.

Each step's entry is that step's mean over its tasks, so every step in the window weighs the
same whatever its number of accepted tasks ("the last N steps").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from coevo.core.role_config import CurriculumConfig
from coevo.core.stats import mean


@dataclass(frozen=True)
class CurriculumRule:
    """When the level moves: `proposer.curriculum`'s keys, with evidence.max_hops as the top level."""

    window: int = 5
    up: float = 0.6
    down: float = 0.2
    max_level: int = 3

    @classmethod
    def from_config(cls, cfg: CurriculumConfig, max_level: int) -> "CurriculumRule":
        return cls(window=cfg.window, up=cfg.up, down=cfg.down, max_level=max_level)


Windows = tuple[tuple[int, tuple[float, ...]], ...]  # (level, its last step accuracies, oldest first), by level


@dataclass(frozen=True)
class CurriculumState:
    """The level the next step plays and every level's accuracy window."""

    level: int = 1
    windows: Windows = ()

    def window(self, level: int) -> tuple[float, ...]:
        return dict(self.windows).get(level, ())

    def accuracy(self, level: int) -> Optional[float]:
        """Mean solver accuracy over the level's window; None when it is empty."""
        return mean(self.window(level))

    def to_record(self) -> dict[str, Any]:
        """JSON form (checkpoint state.json): `{"level": 2, "windows": {"1": [0.5, 0.75]}}`."""
        return {"level": self.level, "windows": {str(k): list(w) for k, w in self.windows}}

    @classmethod
    def from_record(cls, record: Mapping[str, Any], rule: CurriculumRule) -> "CurriculumState":
        """Inverse of `to_record`; the level is kept within 1..rule.max_level and each window to its last
        rule.window entries (ValueError when the record is not a state)."""
        try:
            level = int(record["level"])
            windows = {int(k): tuple(float(a) for a in w) for k, w in dict(record["windows"]).items()}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a curriculum state: {record!r}") from e
        level = min(max(level, 1), rule.max_level)
        return cls(level, tuple(sorted((k, w[-rule.window:]) for k, w in windows.items() if w)))


def _move(level: int, window: tuple[float, ...], rule: CurriculumRule) -> int:
    """The level after a step whose current-level window is `window`."""
    accuracy = mean(window)
    if len(window) < rule.window or accuracy is None:
        return level
    if accuracy >= rule.up and level < rule.max_level:
        return level + 1
    if accuracy <= rule.down and level > 1:
        return level - 1
    return level


def next_state(state: CurriculumState, accuracy_by_hops: Mapping[int, Optional[float]],
               rule: CurriculumRule) -> CurriculumState:
    """The state after a step whose accepted tasks of k hops had mean solver accuracy `accuracy_by_hops[k]`
    (None, or a missing k: no such task)."""
    windows = dict(state.windows)
    for hops, accuracy in accuracy_by_hops.items():
        if accuracy is not None:
            windows[hops] = (windows.get(hops, ()) + (float(accuracy),))[-rule.window:]
    level = _move(state.level, windows.get(state.level, ()), rule)
    if level != state.level:
        windows.pop(level, None)  # fresh evidence at the level entered
    return CurriculumState(level, tuple(sorted(windows.items())))
