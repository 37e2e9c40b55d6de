"""Processes that die with the process that started them, even after a SIGKILL or an OOM kill.

A killed driver runs no cleanup code, and its children are reparented to pid 1: after an OOM
kill, vLLM's EngineCore and Worker processes stayed alive holding ~6 GB (EngineCore even
ignores SIGTERM). Nothing inside the dying process can help, so `ensure_reaper()` starts one
small watcher process (the *reaper*) for the calling process (the *owner*):

- every `POLL_S` it records the owner's descendants (pid and start time, from /proc);
- every process started after `ensure_reaper()` inherits the owner's token in `TOKENS_ENV`,
  which finds what the record misses: processes started just before the kill, or whose parent
  died first (a Ray worker's engines), already reparented to pid 1;
- when the owner is gone (the reaper is its child, so its parent pid changes; the pipe only
  the owner holds closes and wakes it at once) it SIGKILLs both sets and their descendants,
  at once after a kill; after a normal exit (the owner writes `CLEAN_EXIT` into the pipe at
  exit) only what is still alive `SHUTDOWN_GRACE_S` later, since Ray's workers end by
  themselves, a moment after `ray.shutdown()` returns, and are no orphans;
  deletes the paths registered with `remove_on_exit` (the engines' tmpfs staging directories),
  and exits. multiprocessing's resource tracker and nested reapers (a Ray actor's) are spared
  for `LINGER_GRACE_S`: they exit by themselves once the others are gone, after unlinking the
  shared memory the engines leaked, or deleting their own owner's paths.

The reaper runs in its own session, so Ctrl-C or a signal to the run's process group leaves
it in place to clean up. A normal exit goes the same way (what the owner stopped is already
gone). Processes of an external Ray cluster never carry the token and are left alone; the
engines our actors start there have their actor's own reaper. Linux only (it reads /proc):
elsewhere `ensure_reaper` returns None.

Why not `prctl(PR_SET_PDEATHSIG)` in the children (Ray sets it for the raylet and GCS it
starts): it must be set inside each child, and vLLM's spawned EngineCore and Workers run no
code of ours first; it fires when the forking *thread* ends, not the process; and it reaches
only direct children, while the driver's engines in Ray mode are its great-grandchildren.

Stopping cleanly on Ctrl-C or SIGTERM is coevo/core/stopping.py's.

    python -m coevo.core.lifetime OWNER_PID TOKEN   # the reaper itself (started by ensure_reaper)
"""
from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

TOKENS_ENV = "COEVO_REAPER_TOKENS"  # ":"-separated tokens of every reaper whose owner started this process
POLL_S = 1.0  # how often the reaper records the owner's descendants (a /proc scan: ~3 ms for 80 processes)
LINGER_GRACE_S = 5.0  # how long the resource tracker and nested reapers may outlive the others
KILL_ROUNDS = 40  # sweeps after the owner died (0.1 s apart): children forked meanwhile are caught too
SHUTDOWN_GRACE_S = 10.0  # after a normal exit, how long what the owner started may take to end by itself
CLEAN_EXIT = b"clean exit\n"  # what the owner writes into the reaper's pipe as it exits normally
_REAPER_MODULE = "coevo.core.lifetime"
# Command lines (NUL-separated arguments) of the processes `reap` lets linger a while.
_LINGERING = (b"\0-c\0from multiprocessing.resource_tracker import main", f"\0-m\0{_REAPER_MODULE}\0".encode())


@dataclass(frozen=True)
class Proc:
    """One /proc entry: enough to follow parent links and to tell a reused pid from the original."""

    pid: int
    ppid: int
    state: str  # Z (zombie) and X (dead) hold no memory and are left to their new parent
    start: int  # clock ticks after boot: (pid, start) names a process for its whole life


def read_proc(pid: int) -> Optional[Proc]:
    """The /proc/<pid>/stat fields we use, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # plain open: this runs for every process, every POLL_S
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    rest = data[data.rindex(b")") + 2:].split()
    return Proc(pid, int(rest[1]), rest[0].decode(), int(rest[19]))


def process_table() -> dict[int, Proc]:
    """Every live (not zombie) process by pid."""
    table: dict[int, Proc] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None and proc.state not in ("Z", "X"):
                table[proc.pid] = proc
    return table


def descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    """Pids below `roots` in `table` (the roots themselves excluded)."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def read_proc_file(path: str) -> bytes:
    """The bytes of a /proc file; b"" when the process is gone or belongs to another user."""
    try:
        return Path(path).read_bytes()
    except OSError:  # gone, or another user's process
        return b""


def carries_token(pid: int, token: str) -> bool:
    """Whether process `pid` started with `token` among its TOKENS_ENV tokens."""
    prefix = TOKENS_ENV.encode() + b"="
    for entry in read_proc_file(f"/proc/{pid}/environ").split(b"\0"):
        if entry.startswith(prefix):
            return token.encode() in entry[len(prefix):].split(b":")
    return False


def kill(proc: Proc) -> bool:
    """SIGKILL `proc` unless its pid now names another process; True when the signal was sent."""
    try:
        fd = os.pidfd_open(proc.pid)  # a pidfd pins the process: no pid reuse between check and kill
    except OSError:
        return False
    try:
        now = read_proc(proc.pid)
        if now is None or now.start != proc.start:
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def paths_file(token: str) -> Path:
    """Where the paths to delete after reaper `token` has reaped are listed, one per line."""
    return Path(tempfile.gettempdir()) / f"coevo-reaper-{token}.paths"


def remove_on_exit(path: str | os.PathLike) -> None:
    """Delete `path` (a file or a directory tree) after this process is gone, however it ends.

    Registered with every reaper whose token this process carries: should a Ray actor's own
    reaper be gone first (Ray may kill it with the actor), the driver's still deletes it.
    """
    for token in filter(None, os.environ.get(TOKENS_ENV, "").split(":")):
        try:
            with open(paths_file(token), "a") as f:  # appends of one short line do not interleave
                f.write(os.fspath(path) + "\n")
        except OSError:  # best effort: an unwritable temp dir must not stop the caller
            pass


def watch(owner: int, wakeup: Optional[int], poll_s: float = POLL_S) -> tuple[dict[int, Proc], bool]:
    """Record the owner's descendants until the owner is gone; also whether it said it exits normally.

    The reaper is the owner's child: its parent pid changes the moment the owner exits, and
    the `wakeup` pipe (our stdin, whose other end only the owner holds) closes then too,
    which ends the wait without a poll delay. What the owner wrote into it (`CLEAN_EXIT`)
    stays readable after it closed.
    """
    me = os.getpid()
    tracked: dict[int, Proc] = {}
    said = b""
    while os.getppid() == owner:
        table = process_table()
        # Kept after they leave the owner's tree (reparented when their parent died) while alive.
        tracked = {pid: p for pid, p in tracked.items() if pid in table and table[pid].start == p.start}
        tracked.update({pid: table[pid] for pid in descendants(table, [owner]) - {me}})
        if wakeup is None:
            time.sleep(poll_s)
        elif select.select([wakeup], [], [], poll_s)[0]:
            said += (data := os.read(wakeup, 4096))
            wakeup = wakeup if data else None  # closed: from now on only the parent pid tells
    while wakeup is not None and select.select([wakeup], [], [], 0)[0] and (data := os.read(wakeup, 4096)):
        said += data
    return tracked, CLEAN_EXIT in said


def _left(token: str, tracked: dict[int, Proc]) -> set[int]:
    """Pids of what the owner left that does not end by itself (`_lingers` excluded): tracked or token carriers."""
    table = process_table()
    roots = {pid for pid, p in tracked.items() if pid in table and table[pid].start == p.start}
    roots |= {pid for pid in table if carries_token(pid, token)}
    return {pid for pid in (roots | descendants(table, roots)) - {os.getpid()} if not _lingers(pid)}


def await_shutdown(token: str, tracked: dict[int, Proc], grace_s: float = SHUTDOWN_GRACE_S) -> None:
    """Wait until what a normally exiting owner left has ended by itself, or `grace_s` passed."""
    deadline = time.monotonic() + grace_s
    while _left(token, tracked) and time.monotonic() < deadline:
        time.sleep(0.1)


def _lingers(pid: int) -> bool:
    """Processes that exit by themselves once the others are gone, after useful cleanup: the
    resource tracker unlinks leaked shared memory, a nested reaper deletes its owner's paths."""
    cmdline = read_proc_file(f"/proc/{pid}/cmdline")
    return any(marker in cmdline for marker in _LINGERING)


def reap(token: str, tracked: dict[int, Proc], rounds: int = KILL_ROUNDS, pause_s: float = 0.1,
         grace_s: float = LINGER_GRACE_S) -> dict[int, str]:
    """SIGKILL what the owner left: `tracked` processes still alive, `token` carriers, all their descendants.

    Repeated until a sweep finds nothing (a process forked during a sweep is caught by the next);
    `_lingers` processes are spared for `grace_s`. Returns the name of every process killed, by pid.
    """
    me, killed = os.getpid(), {}
    deadline = time.monotonic() + grace_s
    for _ in range(rounds):
        table = process_table()
        roots = {pid for pid, p in tracked.items() if pid in table and table[pid].start == p.start}
        roots |= {pid for pid in table if carries_token(pid, token)}
        victims = (roots | descendants(table, roots)) - {me}
        if not victims:
            break
        if time.monotonic() < deadline:
            victims -= {pid for pid in victims if _lingers(pid)}
        for pid in sorted(victims):
            name = read_proc_file(f"/proc/{pid}/comm").decode(errors="replace").strip()
            if kill(table[pid]):  # a process still exiting from the last sweep is signalled again
                killed.setdefault(pid, name)
        time.sleep(pause_s)
    return killed


def remove_registered(token: str) -> None:
    """Delete every path registered for `token` (`remove_on_exit`), then the list itself."""
    listing = paths_file(token)
    for path in dict.fromkeys(read_proc_file(str(listing)).decode(errors="replace").splitlines()):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif path:
            Path(path).unlink(missing_ok=True)
    listing.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    """The reaper: `OWNER_PID TOKEN`; stdin is the pipe that closes when the owner exits."""
    owner, token = int(argv[0]), argv[1]
    for sig in (signal.SIGINT, signal.SIGHUP):  # outlive the terminal the run was started from
        signal.signal(sig, signal.SIG_IGN)
    tracked, clean = watch(owner, sys.stdin.fileno())
    if clean:
        await_shutdown(token, tracked)
    killed = reap(token, tracked)
    remove_registered(token)
    if killed:
        names = ", ".join(f"{n} {name}" for name, n in sorted(Counter(killed.values()).items()))
        try:
            print(f"coevo: process {owner} is gone; killed the {len(killed)} processes it left ({names})",
                  file=sys.stderr, flush=True)
        except OSError:  # nobody reads the run's stderr any more
            pass
    return 0


@dataclass
class Reaper:
    """The owner's handle on its reaper."""

    process: subprocess.Popen  # its stdin pipe stays open for as long as the owner lives
    token: str  # this reaper's entry in TOKENS_ENV
    owner: int  # pid of the process it watches


_REAPER: Optional[Reaper] = None
_START_LOCK = threading.Lock()


def ensure_reaper() -> Optional[Reaper]:
    """Start this process's reaper unless it runs already (one per process; a forked child gets its own).

    Call it before starting the processes it must cover: only those started afterwards carry
    its token. None where /proc or pidfds are missing (not Linux).
    """
    global _REAPER
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        return None
    with _START_LOCK:
        if _REAPER is None or _REAPER.owner != os.getpid() or _REAPER.process.poll() is not None:
            _REAPER = _start_reaper()
            # atexit runs its handlers last in, first out: this one after ray.init's ray.shutdown (registered later).
            atexit.register(_tell_clean_exit, _REAPER)
        return _REAPER


def _tell_clean_exit(reaper: Reaper) -> None:
    """At a normal exit (atexit: never after a kill), tell the reaper (`CLEAN_EXIT`, see `watch`)."""
    if reaper.owner != os.getpid():  # a forked child inherited the handler; its reaper is its own
        return
    try:
        reaper.process.stdin.write(CLEAN_EXIT)
        reaper.process.stdin.flush()
    except (OSError, ValueError):  # the reaper is gone, or the pipe already closed
        pass


def reap_with_owner(*paths: str | os.PathLike) -> None:
    """Start this process's reaper (`ensure_reaper`) and have `paths` deleted once the process is gone."""
    if ensure_reaper() is not None:
        for path in paths:
            remove_on_exit(path)


def _start_reaper() -> Reaper:
    token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    inherited = [t for t in os.environ.get(TOKENS_ENV, "").split(":") if t]
    os.environ[TOKENS_ENV] = ":".join(inherited + [token])
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    process = subprocess.Popen([sys.executable, "-m", _REAPER_MODULE, str(os.getpid()), token],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env,
                               start_new_session=True)
    return Reaper(process, token, os.getpid())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
