"""Fault injection, end to end through `python -m coevo.run`: tiny models, `ray.local=true`
(except the one check of Ray's signal handling). Unit-level cases: tests/coevo/test_faults.py.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevo.orchestrate.outputs import read_jsonl
from coevo.train.checkpoint import latest_checkpoint, verify_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]



def _cmd(run_dir, corpus, *extra):
    return [sys.executable, "-m", "coevo.run", "experiment=smoke", "ray.local=true", "corpus=jsonl",
            f"corpus.path={corpus}", f"run.dir={run_dir}", *extra]


def _start(run_dir, corpus, *extra):
    return subprocess.Popen(_cmd(run_dir, corpus, *extra), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _run(run_dir, corpus, *extra):
    return subprocess.run(_cmd(run_dir, corpus, *extra), cwd=ROOT, capture_output=True, text=True, timeout=300)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared (exit code {proc.poll()}): {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)


def test_a_shared_or_reused_run_dir_is_refused_and_overwrite_starts_clean(tmp_path, small_corpus):
    run_dir = tmp_path / "run"
    first = _start(run_dir, small_corpus, "run.steps=200")
    try:
        _wait_for(run_dir / "tasks" / "step_0.jsonl", first)
        second = _run(run_dir, small_corpus, "run.steps=2", "seed=5")
        assert second.returncode == 2 and f"is in use by another run (pid {first.pid} on host" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    # The killed run's lock went with it (its files stay; a plain rerun is refused: test_faults.py).
    fresh = _run(run_dir, small_corpus, "run.steps=1", "seed=5", "run.overwrite=true")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == [0]
    assert sorted(p.name for p in (run_dir / "tasks").iterdir()) == ["step_0.jsonl"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_0"]
    assert "seed: 5" in (run_dir / "config.yaml").read_text() and "deleted checkpoints, config.yaml" in fresh.stdout


def test_sigterm_stops_cleanly_and_resume_skips_a_damaged_checkpoint(tmp_path, small_corpus, tensorboard_points):
    run_dir = tmp_path / "run"
    run = _start(run_dir, small_corpus, "run.steps=200")
    _wait_for(run_dir / "tasks" / "step_2.jsonl", run)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "coevo: stopped by SIGTERM. The last complete checkpoint" in err
    checkpoints = run_dir / "checkpoints"
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]  # nothing half-saved
    newest = latest_checkpoint(run_dir)
    assert verify_checkpoint(newest) is None
    last = json.loads((newest / "state.json").read_text())["step"]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(last + 1))  # the stop came between whole steps
    (newest / "solver" / "model.safetensors").unlink()  # fault: the newest checkpoint lost its weights
    (checkpoints / ".tmp-step_99-x" / "solver").mkdir(parents=True)  # fault: a save killed half-way
    resumed = _run(run_dir, small_corpus, f"run.steps={last + 2}", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resume: skipping step_{last}: solver/model.safetensors is missing" in resumed.stdout
    assert f"resumed from {checkpoints / f'step_{last - 1}'}" in resumed.stdout
    assert ".tmp-step_99-x" in resumed.stdout and not (checkpoints / ".tmp-step_99-x").exists()
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(last + 2))
    points = [(tag, step) for tag, step, _ in tensorboard_points(run_dir / "tensorboard")]
    assert len(points) == len(set(points)) and {step for _, step in points} == set(range(last + 2))
    assert verify_checkpoint(checkpoints / f"step_{last + 1}") is None


RAY_SIGTERM = """
import os, signal, sys, time
from coevo.core.config import compose, to_object
from coevo.core.lifetime import ensure_reaper
from coevo.core.stopping import Stopped, stop_on_signals
from coevo.orchestrate.actors import init_ray
ensure_reaper()
try:
    with stop_on_signals():
        init_ray(to_object(compose(["experiment=smoke"])))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
except Stopped as e:
    print("stopped cleanly", flush=True)
    sys.exit(e.exit_code)
"""


def test_sigterm_stops_a_ray_driver_cleanly(tmp_path):
    # ray.init installs a SIGTERM handler that aborts the driver (exit code 134, a stack dump).
    proc = subprocess.run([sys.executable, "-c", RAY_SIGTERM], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and proc.stdout == "stopped cleanly\n", proc.stderr[-3000:]
