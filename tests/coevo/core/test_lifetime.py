"""The reaper (coevo/core/lifetime.py): what an owner leaves behind dies with it, whatever kills it."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from coevo.core.lifetime import TOKENS_ENV, Proc, carries_token, descendants, read_proc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc")
ROOT = Path(__file__).resolve().parents[3]

# An owner that leaves every kind of process behind, prints their pids, then waits to be killed.
OWNER = textwrap.dedent("""
    import os, subprocess, sys, time
    from coevo.core.lifetime import TOKENS_ENV, ensure_reaper, reap_with_owner
    reaper = ensure_reaper()
    reap_with_owner(sys.argv[1])
    # Like a Ray actor starting an engine: a child with its own reaper and scratch directory.
    nested = "import sys, time; from coevo.core.lifetime import reap_with_owner; reap_with_owner(sys.argv[1]); " \
             "time.sleep(300)"
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    quiet = dict(stdout=subprocess.DEVNULL)  # the test reads our stdout up to the pids line
    procs = [
        subprocess.Popen(["sleep", "300"], **quiet),  # a plain child
        subprocess.Popen(["sh", "-c", "sleep 300 & sleep 301 & wait"], **quiet),  # grandchildren
        subprocess.Popen([sys.executable, "-c", stubborn], **quiet),  # ignores SIGTERM, like vLLM's EngineCore
        # Own session and no token: only the descendant record finds it.
        subprocess.Popen(["sleep", "302"], start_new_session=True, **quiet,
                         env={k: v for k, v in os.environ.items() if k != TOKENS_ENV}),
        subprocess.Popen([sys.executable, "-c", nested, sys.argv[3]], **quiet),
    ]
    # Its parent exits at once: reparented to pid 1 before the reaper can see it; the token finds it.
    subprocess.run(["sh", "-c", "sleep 303 & echo $!"], stdout=open(sys.argv[2], "w"))
    time.sleep(2.5)  # let the reaper record the tree (it looks every POLL_S)
    print(" ".join(str(p.pid) for p in procs), reaper.process.pid, flush=True)
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    proc = read_proc(pid)
    return proc is not None and proc.state not in ("Z", "X")


def _tree(pid: int) -> set[int]:
    from coevo.core.lifetime import process_table

    return descendants(process_table(), [pid])


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_everything_the_owner_started_dies_with_it(tmp_path, sig):
    scratch, nested_scratch = tmp_path / "scratch", tmp_path / "nested"
    for d in (scratch, nested_scratch):
        d.mkdir()
        (d / "weights").write_bytes(b"x" * 1000)
    orphan_file = tmp_path / "orphan.pid"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(scratch), str(orphan_file), str(nested_scratch)],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True, start_new_session=True)
    victims: set[int] = set()
    try:
        pids = [int(p) for p in owner.stdout.readline().split()]
        orphan = int(orphan_file.read_text())
        victims = _tree(owner.pid) | set(pids) | {orphan}
        assert len(victims) >= 10 and all(_alive(p) for p in pids + [orphan])
        os.kill(owner.pid, sig)
        owner.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in victims):
            time.sleep(0.2)
        assert [p for p in victims if _alive(p)] == []
        assert not scratch.exists() and not nested_scratch.exists()
    finally:  # only when the test failed: leave nothing behind
        owner.kill()
        for pid in _tree(owner.pid) | {p for p in victims if _alive(p)}:
            os.kill(pid, signal.SIGKILL)


def test_read_proc_and_descendants():
    me = read_proc(os.getpid())
    assert me.pid == os.getpid() and me.ppid == os.getppid() and me.state in "RS"
    assert read_proc(os.getpid()).start == me.start  # the same process keeps its start time
    table = {p.pid: p for p in [Proc(1, 0, "S", 0), Proc(10, 1, "S", 5), Proc(11, 10, "S", 6),
                                Proc(12, 11, "S", 7), Proc(20, 1, "S", 8)]}
    assert descendants(table, [10]) == {11, 12}
    assert descendants(table, [1]) == {10, 11, 12, 20}
    assert descendants(table, [12]) == set()


def test_carries_token_reads_the_start_environment():
    env = {**os.environ, TOKENS_ENV: "a-1:b-2"}
    child = subprocess.Popen(["sleep", "30"], env=env)
    try:
        time.sleep(0.1)
        assert carries_token(child.pid, "b-2") and carries_token(child.pid, "a-1")
        assert not carries_token(child.pid, "b") and not carries_token(child.pid, "c-3")
    finally:
        child.kill()
        child.wait()


# An owner that exits normally, leaving one child that ends by itself a moment later (as Ray's
# workers do after ray.shutdown) and one that never would.
CLEAN_OWNER = textwrap.dedent("""
    import subprocess, sys
    from coevo.core.lifetime import ensure_reaper
    ensure_reaper()
    ending = subprocess.Popen(["sleep", "1.5"])
    stuck = subprocess.Popen(["sleep", "300"])
    print(ending.pid, stuck.pid, flush=True)
    sys.exit(0)
""")


def test_a_normal_exit_lets_children_end_by_themselves_and_reports_only_what_was_left():
    import coevo.core.lifetime as lifetime

    assert lifetime.SHUTDOWN_GRACE_S <= 15  # the wait below
    owner = subprocess.run([sys.executable, "-c", CLEAN_OWNER], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)  # returns once the reaper, which holds the stderr pipe, has exited
    ending, stuck = (int(p) for p in owner.stdout.split())
    try:
        assert owner.returncode == 0 and not _alive(stuck) and not _alive(ending)
        # The reaper waited for the first to end by itself: only the stuck one is reported as killed.
        assert "killed the 1 processes it left (1 sleep)" in owner.stderr, owner.stderr
    finally:
        for pid in (ending, stuck):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_watch_reads_the_clean_exit_the_owner_wrote_before_the_pipe_closed():
    from coevo.core.lifetime import CLEAN_EXIT, watch

    read, write = os.pipe()
    os.write(write, CLEAN_EXIT)
    os.close(write)
    # Our parent is not `owner`: the loop ends at once, the leftover bytes are still read.
    tracked, clean = watch(owner=-1, wakeup=read, poll_s=0.01)
    assert tracked == {} and clean
    read2, write2 = os.pipe()
    os.close(write2)  # closed without a word: a kill
    assert watch(owner=-1, wakeup=read2, poll_s=0.01) == ({}, False)
