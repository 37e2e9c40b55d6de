"""Checkpoints and resume (SPEC §5.3).

`<run_dir>/checkpoints/step_<n>/` holds one HF directory per trainable policy (written by
its actor), `state.json` (step, data cursor, driver RNG states) and a `COMPLETE` marker.
The directory is assembled under a temp name and renamed in one step, so a run killed at
any moment leaves either a complete checkpoint or none; temp leftovers are ignored.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from coevo.core.io import atomic_dir, atomic_write_text, step_name, step_of

MARKER = "COMPLETE"


def rng_state() -> dict[str, Any]:
    """Driver RNG states in a JSON-friendly form."""
    py = random.getstate()
    np_state = np.random.get_state()
    return {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state().tolist(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    """Inverse of `rng_state`."""
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def save_checkpoint(run_dir: Path, step: int, cursor: int,
                    save_policy: Callable[[str, Path], None], roles: list[str]) -> Path:
    """Write checkpoint `step` atomically; `save_policy(role, dir)` writes one policy."""
    target = Path(run_dir) / "checkpoints" / step_name(step)
    with atomic_dir(target) as tmp:
        for role in roles:
            save_policy(role, tmp / role)
        state = {"step": step, "cursor": cursor, "roles": roles, "rng": rng_state()}
        atomic_write_text(tmp / "state.json", json.dumps(state))
        atomic_write_text(tmp / MARKER, "ok\n")
    return target


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    """Newest complete `checkpoints/step_<n>` (temp dirs and markerless dirs are skipped)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    steps = []
    for child in root.iterdir():
        n = step_of(child.name)
        if n is not None and (child / MARKER).exists() and (child / "state.json").exists():
            steps.append((n, child))
    return max(steps)[1] if steps else None


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The `state.json` of a checkpoint, with a clear error when it is unreadable."""
    path = Path(checkpoint) / "state.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RuntimeError(f"checkpoint state {path} is unreadable: {e}") from e


def prune_checkpoints(run_dir: Path, keep: int = 2) -> None:
    """Delete all but the newest `keep` complete checkpoints (never the latest one)."""
    import shutil

    root = Path(run_dir) / "checkpoints"
    done = sorted((n, c) for c in root.iterdir()
                  if (n := step_of(c.name)) is not None and (c / MARKER).exists())
    for _, path in done[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
