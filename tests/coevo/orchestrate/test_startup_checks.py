"""How a training command ends (coevo/orchestrate/startup_checks.py): its done report, its exit codes."""
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from coevo.core.rundir import RunDirError
from coevo.core.stopping import Stopped
from coevo.orchestrate.actors import ActorFailure
from coevo.orchestrate.persist import done_report, save_step
from coevo.orchestrate.startup_checks import error_line, run_and_report
from coevo.train.memory import MemoryBudgetError
from coevo.train.preflight import PreflightError


class SavedPolicy:
    def save(self, directory):
        Path(directory).mkdir(parents=True)
        (Path(directory) / "model.safetensors").write_text("w")


def _run_dir(tmp_path: Path) -> Path:
    """A run dir after one step: its checkpoint, one metrics line, its config."""
    run = tmp_path / "run"
    run.mkdir(parents=True)  # a run's directory exists (claimed) before its first save
    save_step(run, 0, 4, SimpleNamespace(trainable={"solver": SavedPolicy()}))
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "config.yaml").write_text("seed: 0\n")
    return run


def _ends(body, tmp_path, capsys):
    run = _run_dir(tmp_path)
    with pytest.raises(SystemExit) as end:
        run_and_report("coevo.solve", run, body)
    out, err = capsys.readouterr()
    return end.value.code, out, err, run


def _raise(error):
    def body():
        raise error
    return body


def test_a_finished_run_ends_with_the_done_report(tmp_path, capsys):
    run = _run_dir(tmp_path)
    run_and_report("coevo.solve", run, lambda: None)
    assert capsys.readouterr().out == done_report(run) + "\n"


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


@pytest.mark.parametrize("error, code, err", [
    (RunDirError("run.dir x is in use"), 2, "coevo.solve: error: run.dir x is in use\n"),
    (PreflightError("the solver model cannot be loaded"), 2, "coevo.solve: error: the solver model cannot be loaded\n"),
    (MemoryBudgetError("coevo: this run needs about 9.0 GiB"), 1, "coevo: this run needs about 9.0 GiB\n"),
])
def test_a_failed_start_up_check_gets_its_line_and_no_report(error, code, err, tmp_path, capsys):
    assert _ends(_raise(error), tmp_path, capsys)[:3] == (code, "", err)


def test_error_line_is_one_line():
    assert error_line(ValueError("bad\nmore")) == "ValueError: bad…"
    assert error_line(KeyError("k")) == "KeyError: 'k'"
    assert error_line(RuntimeError("x" * 300)) == "RuntimeError: " + "x" * 200 + "…"
