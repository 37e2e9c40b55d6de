"""Checkpoints and resume (docs/method.md §5.3).

`<run_dir>/checkpoints/step_<n>/` holds one directory per trainable policy (written by its
actor, optimizer state included: an HF model directory + `optimizer.pt`, or a sharded role's
shards, coevo/train/sharded_io.py), `state.json` (step, data cursor, driver RNG states,
and the run's other state such as the hop curriculum's) and a `COMPLETE` marker listing the
size and SHA-256 of every other file. The directory is assembled under a temp name and
renamed in one step, so a run killed at any moment leaves either a complete checkpoint or a
`.tmp-*` leftover, which `remove_partial_checkpoints` deletes at the next start; pruning
renames a checkpoint to `.old-*` before deleting it, likewise.

Resume trusts nothing it has not checked: `resumable_checkpoint` verifies the newest
checkpoint against its marker (a file missing, truncated or changed since the save fails)
and falls back to older ones, reporting each one it skipped and why.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from coevo.core.io import atomic_dir, atomic_write_text, step_name, step_of, unique_sibling

MARKER = "COMPLETE"
OPTIMIZER_FILE = "optimizer.pt"  # in each role's directory (every role a checkpoint holds is trainable)
# Marks a sharded role's directory (coevo/train/sharded_io.py), whose shards hold its optimizer state instead.
SHARDED_MANIFEST = "sharded.json"
MARKER_FORMAT = 1  # version of the marker's JSON (`{"format": 1, "files": {path: {"size", "sha256"}}}`)
_CHUNK = 1 << 20


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


def save_checkpoint(run_dir: Path, step: int, cursor: int, save_policy: Callable[[str, Path], None],
                    roles: list[str], extra: Optional[dict[str, Any]] = None) -> Path:
    """Write checkpoint `step` atomically; `save_policy(role, dir)` writes one policy.

    `extra`: more of the run's state for state.json (JSON values; e.g. the hop curriculum's under
    "curriculum"); it cannot replace the keys this function writes.
    """
    target = Path(run_dir) / "checkpoints" / step_name(step)
    with atomic_dir(target) as tmp:
        for role in roles:
            save_policy(role, tmp / role)
        state = {**(extra or {}), "step": step, "cursor": cursor, "roles": roles, "rng": rng_state()}
        atomic_write_text(tmp / "state.json", json.dumps(state))
        # Written last: its presence says every file it lists was written whole.
        atomic_write_text(tmp / MARKER, json.dumps({"format": MARKER_FORMAT, "files": file_manifest(tmp)}, indent=1))
    return target


def file_digest(path: Path) -> str:
    """SHA-256 of a file in 1 MiB chunks (the fastest hashlib digest here: ~1.5 GB/s a core, page cache warm)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_digests(paths: list[Path]) -> list[str]:
    """`file_digest` of each path, in order, one thread a core: hashlib releases the GIL over large
    buffers, so a checkpoint's files (3 roles x model + optimizer state, 4.8 GB for SmolLM2-135M) hash
    on every core instead of one."""
    if len(paths) < 2:
        return [file_digest(p) for p in paths]
    with ThreadPoolExecutor(max_workers=min(len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(file_digest, paths))


def file_manifest(root: Path) -> dict[str, dict[str, Any]]:
    """`{relative path: {"size", "sha256"}}` of every file under `root` but the marker."""
    files = sorted(p for p in Path(root).rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MARKER)
    return {p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": digest}
            for p, digest in zip(files, file_digests(files))}


def _read_marker(checkpoint: Path) -> dict[str, dict[str, Any]]:
    """The marker's file list; ValueError saying what is wrong with it."""
    try:
        listed = json.loads((checkpoint / MARKER).read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        raise ValueError("no COMPLETE marker (its save never finished)") from None
    except (OSError, ValueError, KeyError, TypeError):
        listed = None
    if not isinstance(listed, dict) or not all(
            isinstance(m, dict) and isinstance(m.get("size"), int) and isinstance(m.get("sha256"), str)
            for m in listed.values()):
        raise ValueError("its COMPLETE marker lists no files with sizes and checksums (unreadable, or written "
                         "before checkpoints recorded them)")
    return listed


def _file_problems(checkpoint: Path, listed: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with each file the marker lists, in its order: missing, another size, or (the files
    that pass both, hashed together by `file_digests`) another checksum."""
    found: dict[str, Optional[str]] = {}
    for name, meta in listed.items():
        path = checkpoint / name
        if not path.is_file():
            found[name] = f"{name} is missing"
        elif (size := path.stat().st_size) != meta["size"]:
            found[name] = f"{name} has {size} bytes, the marker records {meta['size']}"
    hashed = [name for name in listed if name not in found]
    for name, digest in zip(hashed, file_digests([checkpoint / name for name in hashed])):
        found[name] = None if digest == listed[name]["sha256"] else f"{name} does not match its checksum"
    return [problem for name in listed if (problem := found[name])]


def verify_checkpoint(checkpoint: Path) -> Optional[str]:
    """None when `checkpoint` is complete and every file matches its marker; otherwise what is wrong."""
    checkpoint = Path(checkpoint)
    try:
        listed = _read_marker(checkpoint)
    except ValueError as e:
        return str(e)
    problems = _file_problems(checkpoint, listed)
    if not problems:
        try:
            state = read_state(checkpoint)
        except RuntimeError as e:
            return str(e)
        # A sharded role's optimizer state is in its shards, which its manifest's presence vouches for.
        problems = [f"it holds no optimizer state of role {role} ({role}/{OPTIMIZER_FILE})"
                    for role in state.get("roles", [])
                    if f"{role}/{OPTIMIZER_FILE}" not in listed and f"{role}/{SHARDED_MANIFEST}" not in listed]
        if state.get("step") != step_of(checkpoint.name):
            problems.append(f"its state.json says step {state.get('step')}")
    if not problems:
        return None
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def resumable_checkpoint(run_dir: Path) -> tuple[Optional[Path], list[tuple[Path, str]]]:
    """The newest checkpoint that verifies (None if none does), and each newer one skipped with its reason."""
    root = Path(run_dir) / "checkpoints"
    found = sorted(((n, c) for c in root.iterdir() if (n := step_of(c.name)) is not None and c.is_dir()),
                   reverse=True) if root.is_dir() else []
    skipped = []
    for _, path in found:
        reason = verify_checkpoint(path)
        if reason is None:
            return path, skipped
        skipped.append((path, reason))
    return None, skipped


def remove_partial_checkpoints(run_dir: Path) -> list[str]:
    """Delete the temp dirs a killed save (`.tmp-*`) or prune (`.old-*`) left in `checkpoints/`; their names.

    Each can be a full copy of every model. Only safe while the run holds its directory's lock.
    """
    root = Path(run_dir) / "checkpoints"
    leftovers = sorted(p for p in root.iterdir() if p.name.startswith((".tmp-", ".old-"))) if root.is_dir() else []
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return [p.name for p in leftovers]


def drop_checkpoints_after(run_dir: Path, step: int) -> list[str]:
    """Delete checkpoints of steps > `step` (skipped on resume, they will be written again); their names."""
    root = Path(run_dir) / "checkpoints"
    children = root.iterdir() if root.is_dir() else []
    later = sorted(c for c in children if (n := step_of(c.name)) is not None and n > step)
    for path in later:
        shutil.rmtree(path)
    return [p.name for p in later]


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Every `checkpoints/step_<n>` with a marker and a state file, oldest first, unverified."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        n = step_of(child.name)
        if n is not None and (child / MARKER).exists() and (child / "state.json").exists():
            steps.append((n, child))
    return [path for _, path in sorted(steps)]


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    """Newest `checkpoints/step_<n>` with a marker, unverified (resume uses `resumable_checkpoint`)."""
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The `state.json` of a checkpoint, with a clear error when it is unreadable."""
    path = Path(checkpoint) / "state.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RuntimeError(f"checkpoint state {path} is unreadable: {e}") from e


def prune_checkpoints(run_dir: Path, keep: int = 2) -> None:
    """Delete all but the newest `keep` complete checkpoints (never the latest one).

    Each is renamed to an `.old-*` name first (one atomic step), then deleted: a run killed
    meanwhile leaves a leftover that `remove_partial_checkpoints` deletes at the next start, never
    a `step_<n>` whose marker went first (it would never be pruned again nor verify).
    """
    root = Path(run_dir) / "checkpoints"
    done = sorted((n, c) for c in root.iterdir()
                  if (n := step_of(c.name)) is not None and (c / MARKER).exists())
    for _, path in done[:-keep] if keep > 0 else []:
        doomed = unique_sibling(path, "old")
        path.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)
