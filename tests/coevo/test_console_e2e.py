"""A researcher's first hour end to end: what the terminal shows, what run.log keeps, a hub preset offline."""
import os
import re
import resource
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_LINE = re.compile(r".+: (started, \d+ \S+|\d+% \(\d+/\d+ \S+, .*\))")
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def run_module(args, env=None, timeout=900):
    """`python -m <args>` from the repo root; (process, wall seconds, CPU seconds of it and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc, time.perf_counter() - t0, cpu


def log_times(path):
    return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f") for line in path.read_text().splitlines()
            if (m := STAMP.match(line))]


def _breakdown(line):
    """(wall seconds, {term: seconds}) of a `time <wall>s = <term> <s>s (...) + ...` line (orchestrate/timing.py)."""
    head, _, rest = line.partition(" = ")
    assert head.startswith("time ") and head.endswith("s"), line
    terms = [term.split(" ") for term in re.sub(r" \([^)]*\)", "", rest).split(" + ")]  # tokens and rates dropped
    return float(head[5:-1]), {name: float(seconds.rstrip("s")) for name, seconds in terms}


@pytest.mark.slow
def test_smoke_run_prints_a_start_line_one_line_per_step_and_done(tmp_path):
    run_dir = tmp_path / "run"
    proc, wall, _ = run_module(["coevo.run", "experiment=smoke", "ray.local=true", "run.steps=2", f"run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # A fresh $COEVO_CACHE adds first-use build lines (coevo/core/progress.py); nothing else may appear.
    lines = [line for line in proc.stdout.splitlines() if not BUILD_LINE.fullmatch(line)]
    assert proc.stderr == "", proc.stderr[-3000:]  # no engine, library or Ray output on the terminal
    assert re.fullmatch(re.escape(f"coevo.run: smoke: proposer tiny-random, solver tiny-random, ranker tiny-random; "
                                  f"run dir {run_dir} (log: run.log); memory: estimated peak ") + r"[\d.]+ GiB of RAM",
                        lines[0]), lines[0]
    assert re.fullmatch(r"\[step 1/2\] accepted \d+/4 \| solver reward \S+ format \S+ \| ranker format \S+ \| "
                        r"[\d.]+s \| ETA \S+", lines[1]), lines[1]
    assert lines[3].startswith("[step 2/2] accepted ") and lines[3].endswith("ETA 0s")
    for step_line, breakdown in ((lines[1], lines[2]), (lines[3], lines[4])):  # where each step's time went
        wall, terms = _breakdown(breakdown)
        assert list(terms) == ["target", "path", "question", "solve", "update", "write", "other"], breakdown
        assert f"| {wall:.1f}s |" in step_line and abs(sum(terms.values()) - wall) <= 0.05 * wall + 0.35
        assert abs(terms["other"]) <= 0.05 * wall + 0.05, breakdown  # the stages cover the step
        assert "prefill + " in breakdown.split(" + path")[0]  # the proposer's tokens, counted in its stage
    # The end: `done: <run dir>` and what the run dir holds (coevo/orchestrate/persist.py). Nothing else before it.
    assert lines[5] == f"done: {run_dir}", lines[5:]
    log = (run_dir / "run.log").read_text()
    for text in ("preflight: solver: preset tiny-random", "memory: estimated peak", "actors ready in",
                 "solving with G=2", lines[1], lines[3],
                 "loading configuration file"):  # transformers' INFO records: the libraries' logs are here too
        assert text in log, text
    print(f"smoke run: {wall:.1f}s wall")


@pytest.mark.slow
@pytest.mark.parametrize("hub_env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}],
                         ids=["offline-mode", "unreachable-endpoint"])
def test_offline_hub_preset_fails_fast_naming_role_preset_and_override(tmp_path, hub_env):
    # An empty hub cache, and a hub that cannot be reached without touching the network: offline mode, or an
    # endpoint on this machine where nothing listens.
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    env.update({"HF_HOME": str(tmp_path / "hf"), **hub_env})
    run_dir = tmp_path / "run"
    proc, wall, cpu = run_module(["coevo.run", "experiment=smoke", "solver=qwen2.5-7b", "ray.local=true",
                                  f"run.dir={run_dir}"], env)
    assert proc.returncode == 2 and proc.stdout == ""
    reason = ("offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)" if "HF_HUB_OFFLINE" in hub_env else
              "the hub (http://127.0.0.1:9) is unreachable: ConnectError: [Errno 111] Connection refused")
    assert proc.stderr == (
        "coevo.run: error: the solver model cannot be loaded: preset qwen2.5-7b, model Qwen/Qwen2.5-7B-Instruct: "
        f"not in the hub cache ({tmp_path / 'hf' / 'hub'}) and {reason}. Use a local copy with "
        "solver.model=/local/dir\n")  # one line: no retries, no traceback
    log = run_dir / "run.log"
    assert "Traceback" in log.read_text() and "PreflightError" in log.read_text()  # kept for whoever debugs it
    times = log_times(log)
    preflight_s = (times[-1] - times[0]).total_seconds()  # from logging set up to the error
    print(f"offline preset ({'/'.join(hub_env)}): {wall:.1f}s wall, {cpu:.1f}s CPU, preflight {preflight_s:.2f}s")
    # No retries with backoff between logging set up and the error (measured 0.00 s; a retry loop takes many
    # seconds). The rest of the wall and CPU time is the interpreter's imports (torch, transformers, Ray), which
    # vary with the machine and its load: printed above, not asserted (10.4 s of CPU once on a 2-core machine).
    assert preflight_s < 10
