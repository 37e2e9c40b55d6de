"""`python -m coevo.run` end to end through Ray: dumps, metrics, checkpoints, resume, SIGKILL."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coevo.orchestrate.outputs import read_jsonl
from coevo.train.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parents[2]



def _run(run_dir, corpus, *extra, wait=True):
    cmd = [sys.executable, "-m", "coevo.run", "experiment=smoke", "corpus=jsonl", f"corpus.path={corpus}",
           f"run.dir={run_dir}", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _kill_after(run_dir, corpus, dump: str, *extra) -> int:
    """Run in the background until `tasks/<dump>` exists, SIGKILL its process group; the last checkpointed step."""
    proc = _run(run_dir, corpus, *extra, wait=False)
    deadline = time.time() + 400
    while time.time() < deadline and not (run_dir / "tasks" / dump).exists() and proc.poll() is None:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = latest_checkpoint(run_dir)
    assert done is not None, "no checkpoint before the kill"
    return json.loads((done / "state.json").read_text())["step"]


@pytest.mark.slow
def test_smoke_run_then_sigkill_then_resume(tmp_path, small_corpus):
    """One run dir through its life: a finished run, a resumed one killed by SIGKILL, a second resume.

    (One test, three runs: each run starts Ray and five actors, most of its time.)
    """
    run_dir = tmp_path / "run"
    out = _run(run_dir, small_corpus, "run.steps=2")
    assert "[step 2/2]" in out and f"  inspect      python -m coevo.inspect {run_dir}" in out
    # Ray's own records and what its workers print go to run.log, not the terminal (coevo/core/console.py).
    assert "Ray instance" not in out and "actor_name" not in out and "(pid=" not in out, out[-3000:]
    log = (run_dir / "run.log").read_text()
    assert "Started a local Ray instance" in log and ":actor_name:RetrievalWorker" in log
    for step in (0, 1):
        rows = read_jsonl(run_dir / "tasks" / f"step_{step}.jsonl")
        assert len(rows) == 4  # 2 reference questions x proposer.group_size 2
        for key in ("reference_question", "target", "target_verdict", "evidence_path", "question",
                    "question_verdict", "rollouts", "accuracy", "proposer_reward", "timings_s"):
            assert key in rows[0]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1] and "acceptance" in metrics[0]
    assert latest_checkpoint(run_dir).name == "step_1"
    assert (run_dir / "config.yaml").exists() and list((run_dir / "tensorboard").iterdir())
    from coevo.inspect import main as inspect_main

    assert inspect_main([str(run_dir), "--html", str(tmp_path / "r.html"), "--verdict", "rejected"]) == 0
    assert '<svg class="chart"' in (tmp_path / "r.html").read_text()  # inline charts of the real run

    last = _kill_after(run_dir, small_corpus, "step_2.jsonl", "run.steps=50", "resume=true")
    assert last >= 1
    for f in (run_dir / "tasks").glob("step_*.jsonl"):
        read_jsonl(f)  # never corrupt
    kept = {n: (run_dir / "tasks" / f"step_{n}.jsonl").read_bytes() for n in range(last + 1)}
    out = _run(run_dir, small_corpus, f"run.steps={last + 2}", "resume=true")
    assert "resumed from" in out and f"[step {last + 2}/{last + 2}]" in out
    for n, data in kept.items():
        assert (run_dir / "tasks" / f"step_{n}.jsonl").read_bytes() == data  # completed steps untouched
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(last + 2))
    state = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())
    assert state["step"] == last + 1 and state["cursor"] == 2 * (last + 2)  # 2 reference questions a step


@pytest.mark.slow
@pytest.mark.parametrize("experiment,check", [
    ("frozen_proposer", lambda cfg: cfg["proposer"]["frozen"] is True),
    ("retrieval_only", lambda cfg: cfg["ranker"]["mode"] == "none"),
])
def test_ablation_experiments_run(tmp_path, small_corpus, experiment, check):
    import yaml

    run_dir = tmp_path / experiment
    cmd = [sys.executable, "-m", "coevo.run", f"experiment={experiment}", "proposer=tiny-random",
           "solver=tiny-random", "ranker=tiny-random", "corpus=jsonl", f"corpus.path={small_corpus}",
           f"run.dir={run_dir}", "run.steps=1", "proposer.questions_per_step=2", "solver.group_size=2",
           "ray.local=true"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert check(yaml.safe_load((run_dir / "config.yaml").read_text()))
    assert len(read_jsonl(run_dir / "tasks" / "step_0.jsonl")) == 2 * 4  # questions x proposer.group_size


@pytest.mark.slow
def test_dry_run_and_a_refused_key_create_nothing_on_disk(tmp_path, small_corpus):
    cwd, run_dir, index = tmp_path / "cwd", tmp_path / "run", tmp_path / "index"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "coevo.run", "experiment=smoke", "corpus=jsonl", f"corpus.path={small_corpus}",
           f"run.dir={run_dir}", f"retrieval.cache_dir={index}"]
    dry = subprocess.run([*cmd, "dry_run=true"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "coevo stack\n  proposer  tiny-random" in dry.stdout
    typo = subprocess.run([*cmd, "+ranker.topk=5"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert typo.returncode == 2
    assert typo.stderr.startswith("coevo.run: error: unknown config key 'ranker.topk': did you mean 'ranker.top_k'?")
    assert not run_dir.exists() and list(cwd.iterdir()) == []  # no run dir, no .hydra/, no log file anywhere
