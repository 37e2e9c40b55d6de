"""`python -m coevo.solve` end to end (tiny models, a toy corpus): checkpoints, SIGKILL, resume, the done report."""
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
COUNTRIES = [("Paris", "France"), ("Berlin", "Germany"), ("Rome", "Italy"), ("Madrid", "Spain"), ("Oslo", "Norway")]
BATCH = 2  # questions per step


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory):
    """(corpus, labelled questions, index cache dir): small enough that a step takes about a second."""
    root = tmp_path_factory.mktemp("toy")
    with open(root / "corpus.jsonl", "w") as f:
        for i, (city, country) in enumerate(COUNTRIES * 3):
            f.write(json.dumps({"id": f"p{i}", "title": city, "text": f"{city} is the capital of {country}."}) + "\n")
    with open(root / "questions.jsonl", "w") as f:
        for city, country in COUNTRIES:
            f.write(json.dumps({"question": f"Which country is {city} the capital of?", "answers": [country]}) + "\n")
    return root / "corpus.jsonl", root / "questions.jsonl", root / "index"


def _cmd(run_dir, data, *extra):
    corpus, questions, index = data
    return [sys.executable, "-m", "coevo.solve", "experiment=smoke", "ray.local=true", "corpus=jsonl",
            f"corpus.path={corpus}", f"solve.data={questions}", f"solve.batch_questions={BATCH}",
            f"retrieval.cache_dir={index}", f"run.dir={run_dir}", *extra]


def test_solve_killed_after_a_checkpoint_resumes_at_the_next_step(tmp_path, toy_data):
    run_dir, log = tmp_path / "run", tmp_path / "first.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(_cmd(run_dir, toy_data, "solve.steps=200"), cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 400
    while latest_checkpoint(run_dir) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no checkpoint (exit code {proc.wait()}): {log.read_text()[-3000:]}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    last = json.loads((latest_checkpoint(run_dir) / "state.json").read_text())["step"]
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")][:last + 1] == list(range(last + 1))

    again = subprocess.run(_cmd(run_dir, toy_data, f"solve.steps={last + 3}", "resume=true"), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    out = again.stdout
    assert f"resumed from {run_dir / 'checkpoints' / f'step_{last}'} (step {last} done, cursor {BATCH * (last + 1)})" \
        in out
    ran = [int(line.split("/")[0].removeprefix("[step ")) - 1 for line in out.splitlines() if line.startswith("[step ")]
    assert ran == [last + 1, last + 2]  # the next step, not step 0 and not a step done twice
    assert [m["step"] for m in read_jsonl(run_dir / "metrics.jsonl")] == list(range(last + 3))
    newest = latest_checkpoint(run_dir)
    state = json.loads((newest / "state.json").read_text())
    assert newest.name == f"step_{last + 2}" and verify_checkpoint(newest) is None
    assert state["cursor"] == BATCH * (last + 3) and sorted(state["roles"]) == ["ranker", "solver"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"step_{last + 1}", f"step_{last + 2}"]
    tail = out.splitlines()[-5:]  # the done report ends the output
    assert tail[0] == f"done: {run_dir}"
    assert tail[1] == f"  metrics      {last + 3} steps in {run_dir / 'metrics.jsonl'}; TensorBoard: " \
                      f"{run_dir / 'tensorboard'}"
    assert tail[2].startswith(f"  checkpoints  step_{last + 1}, step_{last + 2} in {run_dir / 'checkpoints'}")
    assert tail[3] == f"  evaluate     python -m coevo.eval solver.checkpoint={newest / 'solver'} " \
                      f"ranker.mode=trainable ranker.checkpoint={newest / 'ranker'}"
    assert tail[4] == f"  config       {run_dir / 'config.yaml'}"
