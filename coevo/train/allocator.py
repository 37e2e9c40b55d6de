"""Host (CPU) allocator setting for processes that train a policy (glibc only).

glibc serves an allocation from its heap unless it is larger than the mmap threshold; that
threshold starts at 128 KiB but rises to the size of each large block freed, up to 32 MiB.
After the first backward frees its activations, every tensor up to 32 MiB (a 135M model's
per-layer activations at 4 x 1024 tokens are 3 to 25 MiB) comes from the heap, and freed
heap memory mostly stays with the process. Measured on SmolLM2-135M, 4 x 1024 tokens per
micro-batch: one update of 8 sequences left the process at 10.2 GB resident for 2.6 GB of
live tensors, and resident memory grew with the number of micro-batches.

Pinning the threshold sends every larger block to mmap, which returns it to the system on
free, so resident memory is live tensors at all times. Measured alternatives, 3 forward +
backward passes of one such micro-batch: dynamic threshold 10.1 GB peak; `malloc_trim`
between passes 9.8 GB; pinned 8.6 GB, paid with ~5% more CPU time in page faults.

vLLM's engine processes (EngineCore, Worker) are started by vLLM, not by us, so they are
pinned through the environment variable glibc reads when a process starts
(`children_pin_mmap_threshold` around the engine's start). Without it a CPU Worker's
private memory rose ~27 MB per generation round of 8 prompts of 100-1,200 tokens
(SmolLM2-135M; 2.28 -> 2.34 GB over 3 rounds); pinned, ~3 MB (2.29 -> 2.30 GB).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from typing import Iterator

_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h
MMAP_THRESHOLD = 128 << 10  # glibc's own starting value; 1 MiB still let key/value tensors pile up


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `nbytes` for this process; False where libc is not glibc.

    Process-wide, idempotent, and only affects later allocations. Setting the threshold
    explicitly is what turns its dynamic rise off.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # musl and others: mallopt differs or is absent
        return False
    return bool(libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(int(nbytes))))


MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's start-up setting; setting it also turns the rise off


@contextlib.contextmanager
def children_pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> Iterator[str]:
    """Processes started inside this block run with glibc's mmap threshold fixed at `nbytes`.

    Yields the value in effect: one the user exported is kept. The variable is removed again on
    exit, so later children (and this process, which read it long ago) are unaffected.
    """
    if MMAP_THRESHOLD_ENV in os.environ:
        yield os.environ[MMAP_THRESHOLD_ENV]
        return
    os.environ[MMAP_THRESHOLD_ENV] = str(int(nbytes))
    try:
        yield os.environ[MMAP_THRESHOLD_ENV]
    finally:
        os.environ.pop(MMAP_THRESHOLD_ENV, None)
