"""The stage a run is in, published for an observer outside the process (bench/memory.py).

Opt-in: with `COEVO_STAGE_FILE` set in the environment, entering and leaving `stage(name)`
each append one JSON line `{"t": <time.time()>, "stage": "<path>"}` to that file, where
`<path>` joins the stages open after the transition with "/" (`"update/solver/logprobs"`;
`""` once the outermost one has closed). An observer that samples memory can then attribute
every sample to the stage that was open at its time, however short the stage. Without the
variable `stage` only reads the environment (no file is touched).

Stages are nested in one process's calling thread (the driver's loop, then `Policy.update`
inside it); the stack is per process, so an engine process that never enters a stage writes
nothing.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Iterator

from coevo.core.io import append_jsonl

STAGE_FILE_ENV = "COEVO_STAGE_FILE"
_open: list[str] = []  # names of the stages open in this process, outermost first


def _publish(path: str) -> None:
    append_jsonl(path, {"t": time.time(), "stage": "/".join(_open)})


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark the enclosed code as stage `name` (nested in the stages already open) for `COEVO_STAGE_FILE`."""
    if "/" in name or not name:
        raise ValueError(f"stage name {name!r} must be non-empty and without '/' (it separates nested stages)")
    path = os.environ.get(STAGE_FILE_ENV)
    if not path:
        yield
        return
    _open.append(name)
    _publish(path)
    try:
        yield
    finally:
        _open.pop()
        _publish(path)
