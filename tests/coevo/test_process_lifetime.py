"""Engines die with their run: kill the driver of a real vLLM run, and within 30 s no
process it started is left (vLLM EngineCore and Worker, Ray's raylet, GCS and workers, the reapers),
and the engines' tmpfs staging directories are gone.

The runs use tiny models and a 1% KV share; each case waits until a vLLM Worker runs (about
50-70 s on 2 cores), records the driver's whole process tree from /proc, then sends the signal.
SIGKILL stands for an OOM kill (the kernel sends the same signal).
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevo.core.lifetime import (
    TOKENS_ENV,
    Proc,
    descendants,
    kill,
    paths_file,
    process_table,
    read_proc,
    read_proc_file,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
TINY_ENGINES = ["experiment=smoke", "rollout=vllm", "run.memory_check=false",
                *(f"{role}.gpu_memory_utilization=0.01" for role in ("proposer", "solver", "ranker"))]


def _cmdline(pid: int) -> bytes:
    return read_proc_file(f"/proc/{pid}/cmdline")


def _alive(proc: Proc) -> bool:
    now = read_proc(proc.pid)
    return now is not None and now.start == proc.start and now.state not in ("Z", "X")


def _tree_once_an_engine_runs(driver: subprocess.Popen, timeout_s: float, log: Path) -> dict[int, Proc]:
    """The driver and its descendants, as soon as a vLLM EngineCore has started its Worker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and driver.poll() is None:
        table = process_table()
        tree = descendants(table, [driver.pid])
        cores = [pid for pid in tree if _cmdline(pid).startswith(b"VLLM::EngineCore")]
        if descendants(table, cores):
            return {pid: table[pid] for pid in tree | {driver.pid}}
        time.sleep(0.5)
    raise AssertionError(f"no vLLM Worker below the driver within {timeout_s}s (exit code {driver.poll()}):\n"
                         f"{log.read_text()[-3000:]}")


def _tokens(pids) -> set[str]:  # noqa: ANN001
    """The reaper tokens the processes `pids` carry."""
    tokens = set()
    for pid in pids:
        for entry in read_proc_file(f"/proc/{pid}/environ").split(b"\0"):
            if entry.startswith(TOKENS_ENV.encode() + b"="):
                tokens.update(t for t in entry.decode().partition("=")[2].split(":") if t)
    return tokens


def _registered_paths(tree: dict[int, Proc]) -> set[str]:
    """Paths the run's processes asked their reapers to delete (the engines' tmpfs staging directories)."""
    return {line for t in _tokens(tree) for line in read_proc_file(str(paths_file(t))).decode().splitlines()}



@pytest.mark.parametrize("entry, sig, extra", [
    # The engine is a Ray actor's child, in a Ray cluster the driver started; one engine (the
    # solver's) starts faster than three on 2 cores and exercises the same path.
    ("coevo.run", signal.SIGKILL, ["proposer.engine=hf", "ranker.engine=hf"]),
    ("coevo.solve", signal.SIGTERM, []),  # the engines are the driver's own children
])
def test_no_process_outlives_a_killed_driver(tmp_path, shared_data, small_corpus, entry, sig, extra):
    args = [f"run.dir={tmp_path / 'run'}", *TINY_ENGINES, *extra]
    if entry == "coevo.solve":
        args += [f"solve.data={shared_data / 'wiki_mini' / 'questions_dev.jsonl'}", "solve.steps=1000"]
    else:
        args += ["corpus=jsonl", f"corpus.path={small_corpus}", "run.steps=1000"]
    log = tmp_path / "driver.log"
    # A reaper token of this test process (another test may have started one here) is not the run's: the
    # driver starts without it, as from a shell, so every token its processes carry is the run's own.
    env = {k: v for k, v in os.environ.items() if k != TOKENS_ENV}
    with open(log, "w") as out:
        driver = subprocess.Popen([sys.executable, "-m", entry, *args], cwd=ROOT, stdout=out, env=env,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    tree: dict[int, Proc] = {}
    try:
        tree = _tree_once_an_engine_runs(driver, timeout_s=480, log=log)  # engine start on two loaded cores
        staged = _registered_paths(tree)
        tokens = _tokens(tree)
        assert staged, "the engine registered no staging directory"
        killed_at = time.monotonic()
        driver.send_signal(sig)
        driver.wait(timeout=30)
        while time.monotonic() - killed_at < 30 and any(_alive(p) for p in tree.values()):
            time.sleep(0.2)
        left = {pid: _cmdline(pid)[:60] for pid, p in tree.items() if _alive(p)}
        print(f"{entry} {sig.name}: {len(tree)} processes gone {time.monotonic() - killed_at:.1f}s after the signal")
        assert left == {}, f"still alive 30 s after {sig.name}: {left}\n{log.read_text()[-3000:]}"
        # Also none started after the snapshot (Ray's DashboardAgent, RuntimeEnvAgent): all carry a token.
        late = {pid: _cmdline(pid)[:60] for pid in process_table() if _tokens([pid]) & tokens}
        assert late == {}, f"processes of the run still alive after {sig.name}: {late}"
        assert [p for p in staged if os.path.exists(p)] == []
    finally:  # only when the test failed: leave nothing behind
        if driver.poll() is None:
            driver.kill()
        for proc in tree.values():
            kill(proc)
        for pid in descendants(process_table(), [driver.pid]):
            os.kill(pid, signal.SIGKILL)
