"""What coevo.run and coevo.solve keep and report: checkpoint period, the done report, how a run ends."""
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from coevo.core.rundir import RunDirError
from coevo.core.stopping import Stopped
from coevo.orchestrate.actors import ActorFailure
from coevo.orchestrate.persist import (
    GPU_SAVE_EVERY,
    checkpoint_due,
    done_report,
    error_line,
    run_and_report,
    save_period,
    save_step,
)
from coevo.train.checkpoint import complete_checkpoints


class SavedPolicy:
    def save(self, directory):
        Path(directory).mkdir(parents=True)
        (Path(directory) / "model.safetensors").write_text("w")
        (Path(directory) / "optimizer.pt").write_text("o")


def _run_dir(tmp_path: Path, steps: int) -> Path:
    run = tmp_path / "run"
    actors = SimpleNamespace(trainable={"solver": SavedPolicy(), "ranker": SavedPolicy()})
    for step in range(steps):
        save_step(run, step, 4 * (step + 1), actors)
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {n}}}\n' for n in range(steps)))
    (run / "config.yaml").write_text("seed: 0\n")
    return run


@pytest.mark.parametrize("save_every,steps,due", [
    (1, 3, [0, 1, 2]), (2, 5, [1, 3, 4]), (3, 3, [2]), (10, 4, [3]),  # always the last step
])
def test_checkpoint_period(save_every, steps, due):
    assert [s for s in range(steps) if checkpoint_due(s, steps, save_every)] == due


@pytest.mark.parametrize("overrides,with_proposer,period", [
    ([], True, 1),  # tiny models on the CPU: every step
    (["solver.num_gpus=1"], True, GPU_SAVE_EVERY),
    (["proposer.num_gpus=2"], True, GPU_SAVE_EVERY),  # a sharded role counts as a GPU role
    (["proposer.num_gpus=1", "ranker.num_gpus=0"], False, 1),  # coevo.solve loads no proposer
    (["ranker.num_gpus=1"], True, GPU_SAVE_EVERY),  # the smoke ranker is its own model
    (["solver.num_gpus=1", "run.save_every=3"], True, 3),  # an explicit value always wins
    (["run.save_every=1", "solver.num_gpus=1"], True, 1),
])
def test_the_checkpoint_period_default_depends_on_gpu_roles(overrides, with_proposer, period):
    from coevo.core.config import compose, to_object

    cfg = to_object(compose(["experiment=smoke", *overrides]))
    assert save_period(cfg, with_proposer) == period


def test_done_report_lists_what_the_run_dir_holds(tmp_path):
    run = _run_dir(tmp_path, 3)
    assert [c.name for c in complete_checkpoints(run)] == ["step_1", "step_2"]  # the two newest are kept
    ckpt = run / "checkpoints" / "step_2"
    assert done_report(run).splitlines() == [
        f"done: {run}",
        f"  metrics      3 steps in {run / 'metrics.jsonl'}",
        f"  checkpoints  step_1, step_2 in {run / 'checkpoints'} (resume=true continues from the newest)",
        f"  evaluate     python -m coevo.eval solver.checkpoint={ckpt / 'solver'} ranker.mode=trainable "
        f"ranker.checkpoint={ckpt / 'ranker'}",
        f"  config       {run / 'config.yaml'}",
    ]
    empty = tmp_path / "empty"
    assert done_report(empty, "stopped by SIGTERM") == f"done: {empty} (stopped by SIGTERM)\n  checkpoints  none"


def _ends(body, tmp_path, capsys):
    run = _run_dir(tmp_path, 1)
    with pytest.raises(SystemExit) as end:
        run_and_report("coevo.solve", run, body)
    out, err = capsys.readouterr()
    return end.value.code, out, err, run


def test_a_finished_run_ends_with_the_done_report(tmp_path, capsys):
    run = _run_dir(tmp_path, 1)
    run_and_report("coevo.solve", run, lambda: None)
    assert capsys.readouterr().out == done_report(run) + "\n"


def _raise(error):
    def body():
        raise error
    return body


def test_an_error_stops_the_run_with_the_done_report_saying_so(tmp_path, capsys, caplog):
    code, out, err, run = _ends(_raise(RuntimeError("boom\nsecond line")), tmp_path, capsys)
    # The terminal shows the error as one line once console logging is set up (an earlier test may have), never
    # the traceback or the report.
    assert code == 1 and out in ("", "error: coevo.solve stopped on an error\n")
    logged = caplog.records[-1]  # the traceback goes to the log (the terminal and Hydra's log file in a run)
    assert logged.getMessage() == "coevo.solve stopped on an error" and logged.exc_info[0] is RuntimeError
    ckpt = run / "checkpoints" / "step_0"
    assert err.endswith(f"coevo.solve: stopped on an error. The last complete checkpoint, {ckpt}, is intact; rerun "
                        "with resume=true to continue.\n" + done_report(run, "stopped on an error: RuntimeError: boom…")
                        + "\n")


def test_a_signal_or_an_actor_failure_ends_with_the_done_report(tmp_path, capsys):
    code, _, err, run = _ends(_raise(Stopped(signal.SIGTERM)), tmp_path, capsys)
    assert code == 128 + signal.SIGTERM
    assert err.endswith("\n" + done_report(run, "stopped by SIGTERM") + "\n")
    assert err.startswith("coevo: stopped by SIGTERM. The last complete checkpoint")
    code, _, err, _ = _ends(_raise(ActorFailure("solver died")), tmp_path / "b", capsys)
    assert code == 1 and "(stopped: ActorFailure: solver died)" in err


def test_a_refused_run_dir_gets_no_report(tmp_path, capsys):
    code, out, err, _ = _ends(_raise(RunDirError("run.dir x is in use")), tmp_path, capsys)
    assert code == 2 and out == "" and err == "coevo.solve: error: run.dir x is in use\n"


def test_error_line_is_one_line():
    assert error_line(ValueError("bad\nmore")) == "ValueError: bad…"
    assert error_line(KeyError("k")) == "KeyError: 'k'"
    assert error_line(RuntimeError("x" * 300)) == "RuntimeError: " + "x" * 200 + "…"
