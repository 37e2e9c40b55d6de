"""Shared cache entries under `$COEVO_CACHE`: built once, under a per-entry lock, never seen half-made.

Parallel jobs and Ray actors share one cache (converted models, retrieval indexes, entity
annotations). `cache_entry(entry, build, what)` makes sure the directory `entry` is
complete, building it with `build(tmp_dir)` only when it is not.

Why this is correct on Linux (local filesystems, and NFS, where flock is emulated with
byte-range locks):
- An entry appears by one rename(2) of a fully written, fsynced temp dir onto a name that
  does not exist at that moment. rename is atomic, so a reader finds no entry or a whole one.
- Readers trust an entry only when it holds `MARKER`, written last inside the temp dir: a
  directory without it (a partial copy by hand, say) is rebuilt, not read.
- coevo never modifies, replaces or removes a complete entry, so a reader that found the
  marker reads the files without any lock and they cannot change under it.
- Builders take an exclusive `flock` on `.<name>.lock` beside the entry; the kernel releases
  it when the holder exits however it exits (kill -9 included), so a dead builder never
  blocks the next. Under the lock a builder re-checks (another may have finished meanwhile:
  it then just uses the entry), removes its entry's temp dirs left by dead builders (only
  lock holders create them), and replaces an incomplete entry by moving it aside first.
- Lock files stay (a few bytes each): deleting one that another process has open would let
  a third process lock a new file of the same name while the second still builds.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from coevo.core.io import is_sibling_of, unique_sibling

MARKER = ".complete"


def is_complete(entry: str | os.PathLike) -> bool:
    """Whether `entry` is a finished cache entry (readers check this before reading)."""
    return (Path(entry) / MARKER).is_file()


def lock_path(entry: Path) -> Path:
    return entry.with_name(f".{entry.name}.lock")


@contextmanager
def entry_lock(entry: Path, what: str) -> Iterator[None]:
    """Hold the entry's exclusive lock; when another process holds it, say so once and wait."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    writable = True
    try:
        fd = os.open(lock_path(entry), os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file in a shared cache: flock needs no write access
        fd, writable = os.open(lock_path(entry), os.O_RDONLY), False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            print(f"coevo: waiting for {holder}, which is building {what} in {entry}", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        # Who holds it, for the message above (read by waiters; the lock is the flock, not this).
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root`, so a crash after the rename finds the data."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_leftovers(entry: Path) -> None:
    """Temp dirs of `entry` from builders that died (called with the lock held)."""
    for child in entry.parent.iterdir():
        if is_sibling_of(child.name, entry):
            shutil.rmtree(child, ignore_errors=True)


def _install(tmp: Path, entry: Path) -> None:
    """Rename the finished `tmp` to `entry` (lock held); an incomplete `entry` goes first."""
    if entry.exists() or entry.is_symlink():
        print(f"coevo: cache entry {entry} is incomplete (no {MARKER}); replacing it", file=sys.stderr, flush=True)
        aside = unique_sibling(entry)
        os.rename(entry, aside)
        os.rename(tmp, entry)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, entry)
    fd = os.open(entry.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)


def _marker_text(what: str, **extra: object) -> str:
    return json.dumps({"what": what, "built_by": f"pid {os.getpid()} on {socket.gethostname()}", **extra}) + "\n"


def cache_entry(entry: str | os.PathLike, build: Callable[[Path], None], what: str) -> bool:
    """Make `entry` a complete cache entry; True when this call built it, False when it was there.

    `build(tmp)` writes the entry's files into the fresh directory `tmp`; if it raises, `tmp`
    is removed and the error propagates (the next caller tries again). A second caller
    arriving while the first builds waits for it (saying so once) and then uses its entry.
    """
    entry = Path(entry)
    if is_complete(entry):
        return False
    with entry_lock(entry, what):
        if is_complete(entry):
            return False
        _remove_leftovers(entry)
        tmp = unique_sibling(entry)
        os.mkdir(tmp)
        os.chmod(tmp, 0o755)  # whatever the umask: the cache is shared between jobs and users
        try:
            t0 = time.perf_counter()
            build(tmp)
            (tmp / MARKER).write_text(_marker_text(what, build_s=round(time.perf_counter() - t0, 3)),
                                      encoding="utf-8")
            _fsync_tree(tmp)
            _install(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return True
