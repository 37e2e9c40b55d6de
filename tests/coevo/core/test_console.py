"""The terminal and run.log of every entry point: which records go where, and Ray workers' output."""
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.core import console
from coevo.core.console import (
    ConsoleFilter,
    ConsoleFormatter,
    children_print_to_log,
    report_error,
    say,
    setup_logging,
    vllm_logging_config,
    worker_env,
)

ROOT = Path(__file__).resolve().parents[3]


def record(name, level, msg="m", exc_info=None):
    return logging.LogRecord(name, level, __file__, 1, msg, (), exc_info)


@pytest.mark.parametrize("name,level,debug,has_file,shown", [
    ("coevo.console", logging.INFO, False, True, True),  # the user's lines
    ("coevo.progress", logging.INFO, False, True, True),  # build progress
    ("coevo.run", logging.INFO, False, True, False),  # our other INFO: run.log only
    ("coevo.memory", logging.WARNING, False, True, True),  # our warnings
    ("evidence.retrieval", logging.WARNING, False, True, True),
    ("transformers.modeling_utils", logging.WARNING, False, True, False),  # a library's warning: run.log only
    ("vllm.engine", logging.INFO, False, True, False),
    ("ray._private.worker", logging.INFO, False, True, False),
    ("vllm.engine", logging.ERROR, False, True, True),  # anyone's errors
    ("transformers.modeling_utils", logging.WARNING, False, False, True),  # no run.log to hold it
    ("transformers.modeling_utils", logging.INFO, False, False, False),
    ("httpx", logging.DEBUG, True, True, True),  # log.level=debug: everything
])
def test_console_filter(name, level, debug, has_file, shown):
    assert ConsoleFilter(debug, has_file).filter(record(name, level)) is shown


def test_console_format_keeps_the_users_lines_and_drops_tracebacks():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        exc = sys.exc_info()
    plain = ConsoleFormatter(debug=False)
    assert plain.format(record("coevo.console", logging.INFO, "[step 1/2] x")) == "[step 1/2] x"
    assert plain.format(record("coevo.memory", logging.WARNING, "check skipped")) == "warning: check skipped"
    assert plain.format(record("vllm", logging.ERROR, "engine died", exc)) == "error: engine died"
    debug = ConsoleFormatter(debug=True).format(record("vllm", logging.ERROR, "engine died", exc))
    assert debug.startswith("ERROR vllm: engine died\nTraceback") and "RuntimeError: boom" in debug


def test_vllm_config_sends_only_the_vllm_logger_to_run_log(tmp_path):
    cfg = vllm_logging_config(tmp_path / "run.log", debug=False)
    assert cfg["disable_existing_loggers"] is False and "root" not in cfg
    assert cfg["loggers"] == {"vllm": {"handlers": ["run_log"], "level": "INFO", "propagate": False}}
    assert cfg["handlers"]["run_log"]["filename"] == str(tmp_path / "run.log")
    debug = vllm_logging_config(tmp_path / "run.log", debug=True)
    assert debug["loggers"]["vllm"] == {"handlers": ["run_log", "terminal"], "level": "DEBUG", "propagate": False}


def test_say_prints_before_logging_is_set_up(capsys, monkeypatch):
    monkeypatch.setattr(console, "_configured", {})
    say("plain line")
    assert capsys.readouterr().out == "plain line\n"


CHILD = [sys.executable, "-c", "import sys; print('child out'); print('child err', file=sys.stderr)"]


@pytest.mark.parametrize("level,to_log", [("info", True), ("debug", False)])
def test_processes_started_in_the_block_print_to_run_log(tmp_path, capfd, monkeypatch, level, to_log):
    log = tmp_path / "run.log"
    monkeypatch.setattr(console, "_configured", {"file": str(log), "level": level})
    print("before", flush=True)
    with children_print_to_log():
        subprocess.run(CHILD, check=True)  # inherits the descriptors, as vLLM's engine processes do
    print("after", flush=True)
    print("after err", file=sys.stderr, flush=True)
    out, err = capfd.readouterr()
    assert out.splitlines()[0] == "before" and out.splitlines()[-1] == "after" and err.endswith("after err\n")
    in_log = log.read_text() if log.exists() else ""
    assert ("child out" in in_log and "child err" in in_log) is to_log
    assert ("child out" in out and "child err" in err) is not to_log


def test_without_a_run_log_children_print_to_the_terminal(capfd, monkeypatch):
    monkeypatch.setattr(console, "_configured", {})
    with children_print_to_log():
        subprocess.run(CHILD, check=True)
    out, err = capfd.readouterr()
    assert "child out" in out and "child err" in err


@pytest.fixture
def isolated_logging(monkeypatch):
    """setup_logging changes process-wide state: the root handlers, env vars, library loggers; put them back."""
    from transformers.utils import logging as hf_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(console, "_configured", {})
    # an earlier in-process run may have left warnings captured; then captureWarnings(True) is a no-op
    # and warnings.warn keeps going to pytest's recorder instead of the run log
    logging.captureWarnings(False)
    yield
    for handler in root.handlers[:]:
        root.removeHandler(handler)
        handler.close()
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    logging.captureWarnings(False)
    hf_logging.set_verbosity_warning()
    hf_logging.disable_propagation()
    hf_logging.enable_default_handler()


def test_setup_routes_the_users_lines_ours_and_the_libraries(tmp_path, capsys, isolated_logging):
    path = setup_logging("info", tmp_path / "run")
    assert path == (tmp_path / "run" / "run.log").resolve()
    say("coevo.run: start")
    logging.getLogger("coevo.run").info("actors ready in 1.0s")
    logging.getLogger("transformers.modeling_utils").warning("generation flags ignored")
    logging.getLogger("ray").info("Started a local Ray instance.")
    import warnings

    warnings.warn("a deprecation")
    try:
        raise ValueError("bad model")
    except ValueError as e:
        report_error("coevo.run", e)
    out, err = capsys.readouterr()
    assert out == "coevo.run: start\n"  # only the user's line on the terminal
    assert err == "coevo.run: error: bad model\n"  # one line, no traceback
    log = path.read_text()
    for text in ("coevo.run: start", "actors ready in 1.0s", "generation flags ignored", "Started a local Ray",
                 "a deprecation", "coevo.run: error: bad model", "Traceback", "ValueError: bad model"):
        assert text in log, text
    assert " INFO coevo.console [" in log  # time, level, logger, pid on every record
    env = worker_env()
    assert env[console.LOG_FILE_ENV] == str(path) and env[console.LOG_LEVEL_ENV] == "info"
    vllm_cfg = json.loads(Path(env["VLLM_LOGGING_CONFIG_PATH"]).read_text())
    assert vllm_cfg["handlers"]["run_log"]["filename"] == str(path)


def test_debug_shows_everything_and_no_run_dir_shows_library_warnings(tmp_path, capsys, isolated_logging):
    setup_logging("debug", tmp_path)
    logging.getLogger("vllm.engine").info("engine up")
    assert capsys.readouterr().out == "INFO vllm.engine: engine up\n"
    setup_logging("info")  # coevo.eval: no run directory
    logging.getLogger("transformers.x").warning("w")
    logging.getLogger("transformers.x").info("i")
    assert capsys.readouterr().out == "warning: w\n"
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING" and not console._configured.get("file")


WORKER = r"""
import logging, logging.config, json, os, sys
from coevo.core import console
console.setup_worker_logging()
print("worker stdout"); print("worker stderr", file=sys.stderr)
logging.getLogger("transformers.x").warning("library warning")
logging.getLogger("coevo.progress").info("index: 10%")
sys.stdout.flush(); sys.stderr.flush()
os.system("echo engine child output")
logging.config.dictConfig(json.load(open(os.environ["VLLM_LOGGING_CONFIG_PATH"])))  # what vLLM does on import
logging.getLogger("vllm.engine").info("engine started")
logging.getLogger("coevo.run").info("root handlers still work")
"""


def test_a_ray_worker_writes_to_run_log_and_forwards_only_progress(tmp_path):
    log = tmp_path / "run.log"
    vllm = tmp_path / ".vllm-logging.json"
    vllm.write_text(json.dumps(vllm_logging_config(log, debug=False)))
    env = {**os.environ, console.LOG_FILE_ENV: str(log), console.LOG_LEVEL_ENV: "info",
           "VLLM_LOGGING_CONFIG_PATH": str(vllm), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == "index: 10%\n"  # Ray forwards this stderr to the terminal
    text = log.read_text()
    for line in ("worker stdout", "worker stderr", "library warning", "index: 10%", "engine child output",
                 "engine started", "root handlers still work"):
        assert line in text, line
