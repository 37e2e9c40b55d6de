"""bench/faults.py's checks of a run dir whose run has ended: lost steps, corrupt files, duplicate steps.

Pure functions of the files (tests/bench/test_faults.py builds run dirs by hand); the meaning of
each check is in bench/faults.py's docstring.
"""
from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from coevo.core.io import step_of
from coevo.train.checkpoint import verify_checkpoint

try:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
except ImportError:  # bench/faults.py reports it: the checks then read metrics.jsonl only
    EventFileLoader = masked_crc32c = None


def parse_jsonl(path: Path, need_step: bool = False) -> tuple[list[Any], Optional[str]]:
    """The records of a JSONL file and, if any line is bad, `"<name>: <n> bad lines, first: <why>"`."""
    records, bad = [], []
    data = path.read_bytes()
    lines = data.split(b"\n")
    for no, raw in enumerate(lines[:-1], 1):
        try:
            rec = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            bad.append(f"line {no}: {type(e).__name__}: {e}")
            continue
        if need_step and not (isinstance(rec, dict) and type(rec.get("step")) is int):
            bad.append(f"line {no}: not an object with an integer step")
            continue
        records.append(rec)
    if lines[-1]:  # every writer ends each line: a kill in mid-write leaves this
        bad.append(f"line {len(lines)}: no line end (torn write)")
    return records, (f"{path.name}: {len(bad)} bad lines, first: {bad[0]}" if bad else None)


def tfrecord_problem(path: Path) -> Optional[str]:
    """What is wrong with the record framing of a TensorBoard event file (length, checksums), or None."""
    data, pos, n = path.read_bytes(), 0, 0
    while pos < len(data):
        if len(data) - pos < 12:
            return f"record {n} at byte {pos}: torn header"
        header, (header_crc,) = data[pos:pos + 8], struct.unpack("<I", data[pos + 8:pos + 12])
        if masked_crc32c(header) != header_crc:
            return f"record {n} at byte {pos}: header checksum mismatch"
        end = pos + 12 + struct.unpack("<Q", header)[0] + 4
        if end > len(data):
            return f"record {n} at byte {pos}: torn (needs {end} bytes, the file has {len(data)})"
        if masked_crc32c(data[pos + 12:end - 4]) != struct.unpack("<I", data[end - 4:end])[0]:
            return f"record {n} at byte {pos}: data checksum mismatch"
        pos, n = end, n + 1
    return None


def tensorboard_points(tb_dir: Path) -> list[tuple[str, int]]:
    """(tag, step) of every scalar in every event file under `tb_dir`, read with tensorboard's loader."""
    points = []
    for path in sorted(tb_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            points.extend((v.tag, event.step) for v in event.summary.value)
    return points


def leftover_temp_files(run_dir: Path) -> list[str]:
    """Temp files of interrupted writes (atomic_dir's `.tmp-*`/`.old-*`, atomic_write_text's `.*.tmp`)."""
    found = []
    for folder in (run_dir, run_dir / "checkpoints", run_dir / "tasks"):
        if folder.is_dir():
            found += [f"{p.relative_to(run_dir)}" for p in sorted(folder.iterdir())
                      if p.name.startswith((".tmp-", ".old-")) or (p.name.startswith(".") and p.name.endswith(".tmp"))]
    return found


def _checkpoint_problems(run_dir: Path) -> tuple[list[str], set[int]]:
    root, corrupt, good = run_dir / "checkpoints", [], set()
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if (n := step_of(path.name)) is not None:
            why = verify_checkpoint(path)
            corrupt += [f"checkpoints/{path.name}: {why}"] if why else []
            good |= set() if why else {n}
    return corrupt, good


def check_run_dir(run_dir: Path, steps: int, tensorboard: bool, dumps: bool = True) -> dict[str, list]:
    """Problems of a run dir whose run of `steps` steps has ended: lost steps, corrupt files, duplicates.

    dumps: whether the run writes a task dump per step (coevo.run does, coevo.solve does not).
    """
    run_dir = Path(run_dir)
    corrupt, have = _checkpoint_problems(run_dir)
    metrics = run_dir / "metrics.jsonl"
    records, why = parse_jsonl(metrics, need_step=True) if metrics.is_file() else ([], None)
    corrupt += [why] if why else []
    logged = Counter(r["step"] for r in records)
    dumped = set()
    for path in sorted((run_dir / "tasks").glob("*.jsonl")):
        if (n := step_of(path.name, ".jsonl")) is not None:
            dumped.add(n)
            corrupt += [f"tasks/{w}"] if (w := parse_jsonl(path)[1]) else []
    duplicates = {n for n, c in logged.items() if c > 1}
    tb_steps: Optional[set[int]] = None
    if tensorboard:
        events = sorted((run_dir / "tensorboard").glob("events.out.tfevents.*"))
        corrupt += [f"tensorboard/{p.name}: {w}" for p in events if (w := tfrecord_problem(p))]
        points = Counter(tensorboard_points(run_dir / "tensorboard"))
        duplicates |= {step for (_, step), c in points.items() if c > 1}
        tb_steps = {step for _, step in points}
    lost = []
    for n in range(steps):
        missing = [what for what, present in (("dump", not dumps or n in dumped), ("metrics", n in logged),
                                              ("tensorboard", tb_steps is None or n in tb_steps),
                                              ("checkpoint", n != steps - 1 or n in have)) if not present]
        lost += [{"step": n, "missing": missing}] if missing else []
    return {"lost": lost, "corrupt": corrupt, "duplicates": sorted(duplicates),
            "leftovers": leftover_temp_files(run_dir)}
