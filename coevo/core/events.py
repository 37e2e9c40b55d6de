"""A run's progress for programs that follow it: `events.jsonl` in run.dir, one JSON object a line.

The terminal and run.log are worded for people and change with them (a console made quieter
once left bench/faults.py waiting for a line that no longer came). A supervisor (the fault
benchmark, a cluster's health check) reads this file instead. Every line is

    {"event": <name>, "pid": <the driver's pid>, "time": <unix seconds>, ...fields}

- `ready`   the actors are up; `start` is the first step this attempt runs, `last` the last one.
- `begin`   step `step` starts (before anything of it runs).
- `save`    step `step`'s checkpoint starts being written (its outputs follow, then its `step` event).
- `step`    step `step`'s outputs are written whole (task dump, metrics line, checkpoint when due).

Each attempt of a run (a fresh start, then each resume) appends to the same file; `pid` tells
them apart. A line is appended by one `write` on an `O_APPEND` descriptor, so a kill leaves
whole lines behind (at worst a torn last line, which readers skip: `read_events`).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Optional

EVENTS_NAME = "events.jsonl"
READY, BEGIN, SAVE, STEP = "ready", "begin", "save", "step"


def emit(run_dir: str | os.PathLike, event: str, **fields: Any) -> None:
    """Append one event line to `<run_dir>/events.jsonl` (see the module docstring)."""
    line = json.dumps({"event": event, "pid": os.getpid(), "time": round(time.time(), 3), **fields}) + "\n"
    fd = os.open(Path(run_dir) / EVENTS_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_events(path: str | os.PathLike, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """The whole event lines after byte `offset` of `path`, and the offset after the last whole line.

    A missing file holds no events; an unfinished last line is left for the next read; a line
    that is not a JSON object with a string `event` is skipped (this reader never raises on content).
    """
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    whole = data[:data.rfind(b"\n") + 1]
    events = [e for e in map(_parse, whole.splitlines()) if e is not None]
    return events, offset + len(whole)


def _parse(line: bytes) -> Optional[dict[str, Any]]:
    try:
        event = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None
