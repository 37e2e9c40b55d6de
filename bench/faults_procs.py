"""bench/faults.py's view of a run's processes: what a dead driver left alive, and which process is an actor.

The meaning of each count is in bench/faults.py's docstring; tests/bench/test_faults.py runs these
on fake drivers (no model is loaded).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from coevo.core.lifetime import TOKENS_ENV, Proc, carries_token, descendants, kill, process_table, read_proc_file

ORPHAN_GRACE_S = 30.0
ENGINE_PREFIX = b"VLLM::"  # the command lines vLLM gives its EngineCore and Worker processes


def names_run_dir(cmdline: bytes, run_dir: Path) -> bool:
    """Whether an argument of a NUL-separated command line is `run_dir`, ends in `=run_dir` or lies under it."""
    target = os.fsencode(run_dir)
    return any(arg == target or arg.endswith(b"=" + target) or target + b"/" in arg for arg in cmdline.split(b"\0"))


def run_tokens(pids: Sequence[int], own: set[str]) -> set[str]:
    """The reaper tokens the processes `pids` carry, but the benchmark's own (`own`)."""
    tokens: set[str] = set()
    for pid in pids:
        for entry in read_proc_file(f"/proc/{pid}/environ").split(b"\0"):
            if entry.startswith(TOKENS_ENV.encode() + b"="):
                tokens.update(t for t in entry.decode().partition("=")[2].split(":") if t)
    return tokens - own


def engine_processes(pids: Sequence[int]) -> int:
    """How many of `pids` are vLLM engine processes (EngineCore, Worker)."""
    return sum(read_proc_file(f"/proc/{pid}/cmdline").startswith(ENGINE_PREFIX) for pid in pids)


def survivors(tracked: dict[int, Proc], tokens: set[str], run_dir: Path) -> dict[int, Proc]:
    """Live processes of a dead driver: tracked ones (same start time), token carriers, those naming its run dir."""
    table = process_table()
    mine = descendants(table, [os.getpid()]) | {os.getpid()}
    alive = {pid: table[pid] for pid, p in tracked.items() if pid in table and table[pid].start == p.start}
    alive.update({pid: p for pid, p in table.items() if any(carries_token(pid, t) for t in tokens)
                  or names_run_dir(read_proc_file(f"/proc/{pid}/cmdline"), run_dir)})
    return {pid: p for pid, p in alive.items() if pid not in mine}


def orphans_after(ended: float, tracked: dict[int, Proc], tokens: set[str], run_dir: Path,
                  grace_s: float = ORPHAN_GRACE_S) -> list[str]:
    """`"<pid> <name>"` of each process of the driver still alive `grace_s` after it ended (then killed)."""
    while (left := survivors(tracked, tokens, run_dir)) and time.monotonic() < ended + grace_s:
        time.sleep(0.5)
    names = [f"{pid} {read_proc_file(f'/proc/{pid}/comm').decode(errors='replace').strip()}" for pid in sorted(left)]
    for proc in left.values():
        kill(proc)
    return names
