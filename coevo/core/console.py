"""The terminal and `run.log` of every entry point: one format, set up once by `setup_logging`.

- The terminal (stdout) shows what a user follows a run by: the lines the entry points `say`
  (start, one per step, the end), build progress (coevo/core/progress.py), warnings of our own
  packages and errors from anyone, without tracebacks. Lines are written through tqdm, so
  they land above a progress bar instead of breaking it. `log.level=debug` shows every record.
- `run.log` in the run directory gets every record at DEBUG, with time, level, logger and pid:
  ours, Python warnings, and the libraries' (transformers at INFO, Ray, vLLM), whose own
  terminal handlers are removed so their records reach it (`route_library_loggers`).
- Ray workers run `setup_worker_logging` first (Ray's `worker_process_setup_hook`; the run.log
  path and level travel in `worker_env()`): the worker's stdout and stderr descriptors point at
  run.log, so whatever it and its children (vLLM engine processes) print lands there; only
  build progress still goes to the worker's own stderr, which Ray forwards to the terminal.
- vLLM configures logging itself in every process that imports it, engine cores included;
  `VLLM_LOGGING_CONFIG_PATH` points it at a config that sends its `vllm` logger to run.log.

Without a run directory (`coevo.eval`, `dry_run=true`) there is no run.log: the terminal then
also shows the libraries' warnings, so nothing above INFO is dropped.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, Optional

from tqdm import tqdm

from coevo.core.io import atomic_write_text
from coevo.core.rundir import LOG_NAME, VLLM_LOGGING_NAME

CONSOLE = "coevo.console"  # the logger of the lines meant for the user
PROGRESS = "coevo.progress"  # build progress (coevo/core/progress.py)
OWN_PACKAGES = ("coevo", "evidence", "proposer", "solver", "bench", "__main__")
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
# Per-connection and per-file DEBUG chatter that would bury everything else in run.log.
CHATTY_LIBRARIES = ("httpcore", "httpx", "httpx2", "urllib3", "filelock", "fsspec", "matplotlib", "PIL", "asyncio")
LOG_FILE_ENV, LOG_LEVEL_ENV = "COEVO_RUN_LOG", "COEVO_LOG_LEVEL"  # read by setup_worker_logging
WORKER_SETUP_HOOK = "coevo.core.console.setup_worker_logging"

_configured: dict[str, Optional[str]] = {}  # {"level": ..., "file": ...} once setup_logging ran


def say(message: str) -> None:
    """One line for the user: the terminal (above any progress bar) and run.log; plain stdout before setup."""
    if _configured:
        logging.getLogger(CONSOLE).info(message)
    else:
        print(message, flush=True)


def report_error(prog: str, error: BaseException) -> None:
    """`<prog>: error: <message>` on stderr, one line; the traceback goes to run.log only (DEBUG)."""
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    if _configured:
        logging.getLogger(CONSOLE).debug("%s: error: %s", prog, error, exc_info=error)


def _is_own(name: str) -> bool:
    return name.split(".", 1)[0] in OWN_PACKAGES


class ConsoleFilter(logging.Filter):
    """Which records the terminal shows (see the module docstring)."""

    def __init__(self, debug: bool, has_file: bool) -> None:
        super().__init__()
        self.debug, self.has_file = debug, has_file

    def filter(self, record: logging.LogRecord) -> bool:
        if self.debug or record.levelno >= logging.ERROR:
            return True
        if record.name in (CONSOLE, PROGRESS):
            return record.levelno >= logging.INFO
        return record.levelno >= logging.WARNING and (_is_own(record.name) or not self.has_file)


class ConsoleFormatter(logging.Formatter):
    """The user's lines as they are, other records as `<level>: <message>`; no tracebacks (run.log has them)."""

    def __init__(self, debug: bool) -> None:
        super().__init__()
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name in (CONSOLE, PROGRESS) and record.levelno == logging.INFO:
            return message
        if self.debug:
            text = f"{record.levelname} {record.name}: {message}"
            return text + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")
        return f"{record.levelname.lower()}: {message}"


class ConsoleHandler(logging.Handler):
    """Writes to the current sys.stdout through tqdm, which clears and redraws an active bar around it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stdout)
            sys.stdout.flush()
        except Exception:  # noqa: BLE001 - logging's contract: report through handleError, never raise
            self.handleError(record)


def route_library_loggers() -> None:
    """Send the records of libraries that bring their own terminal handler (Ray, transformers) to ours.

    Ray's `ray` logger prints to stderr and does not propagate; transformers' library logger
    does the same. Both then reach the root handlers: run.log, and the terminal by its filter.
    """
    from transformers.utils import logging as hf_logging

    ray_logger = logging.getLogger("ray")
    for handler in ray_logger.handlers[:]:
        ray_logger.removeHandler(handler)
    ray_logger.propagate = True
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.set_verbosity_info()  # its INFO lines (files loaded, configs) are for run.log
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.INFO)
    logging.captureWarnings(True)  # warnings.warn → the `py.warnings` logger → run.log


def vllm_logging_config(log_path: Path, debug: bool) -> dict:
    """A logging dictConfig for vLLM: its `vllm` logger to run.log (and the terminal with debug), nothing else.

    `disable_existing_loggers: false` and no `root` key: applied in a process that already
    set up logging (the driver with `ray.local=true`), it leaves that set-up alone.
    """
    handlers: dict[str, dict] = {"run_log": {"class": "logging.FileHandler", "filename": str(log_path),
                                             "formatter": "plain", "encoding": "utf-8"}}
    if debug:
        handlers["terminal"] = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain"}
    return {"version": 1, "disable_existing_loggers": False, "formatters": {"plain": {"format": FILE_FORMAT}},
            "handlers": handlers,
            "loggers": {"vllm": {"handlers": list(handlers), "level": "DEBUG" if debug else "INFO",
                                 "propagate": False}}}


def worker_env() -> dict[str, str]:
    """Environment variables Ray workers need to log like this process (its run.log, its level, vLLM's config)."""
    keys = (LOG_FILE_ENV, LOG_LEVEL_ENV, "VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_LEVEL")
    return {k: os.environ[k] for k in keys if k in os.environ}


def _reset_root(level: int) -> logging.Logger:
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    return root


def _file_handler(path: Path) -> logging.Handler:
    handler = logging.FileHandler(path, encoding="utf-8")  # append: a resumed run continues its log
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    handler.setLevel(logging.DEBUG)
    return handler


def setup_logging(level: str = "info", run_dir: Optional[Path] = None) -> Optional[Path]:
    """Route every log record of this process (and, through `worker_env`, of its Ray workers and engines).

    level: `log.level` (info | debug). run_dir: where run.log goes (created; None: terminal only).
    Call once the run owns run_dir (coevo/core/rundir.py), before any model or engine loads.
    Returns the run.log path.
    """
    debug = str(level) == "debug"
    root = _reset_root(logging.DEBUG)
    console = ConsoleHandler()
    console.addFilter(ConsoleFilter(debug, has_file=run_dir is not None))
    console.setFormatter(ConsoleFormatter(debug))
    root.addHandler(console)
    path = None
    if run_dir is not None:
        path = Path(run_dir).resolve() / LOG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        root.addHandler(_file_handler(path))
        vllm_config = path.parent / VLLM_LOGGING_NAME
        atomic_write_text(vllm_config, json.dumps(vllm_logging_config(path, debug), indent=1) + "\n")
        os.environ.update({LOG_FILE_ENV: str(path), "VLLM_LOGGING_CONFIG_PATH": str(vllm_config)})
    else:  # no run.log: vLLM's own terminal handler, at WARNING unless debugging
        os.environ["VLLM_LOGGING_LEVEL"] = "DEBUG" if debug else "WARNING"
    os.environ[LOG_LEVEL_ENV] = "debug" if debug else "info"
    route_library_loggers()
    _configured.update(level=os.environ[LOG_LEVEL_ENV], file=str(path) if path else None)
    return path


def _redirect_output(path: Path) -> IO[str]:
    """Point this process's stdout and stderr descriptors at `path`; returns a stream on the old stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    old_stderr = os.fdopen(os.dup(2), "w", buffering=1)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return old_stderr


@contextmanager
def children_print_to_log() -> Iterator[None]:
    """Processes started inside the block print to run.log, not the terminal, for their whole life.

    vLLM's engine core and worker processes inherit the starter's stdout/stderr descriptors and
    print their imports' warnings and load bars there; in the driver (`coevo.solve`,
    `ray.local=true`) that is the terminal. The block points both descriptors at run.log while
    they start and restores them after. Nothing changes without a run.log or with debug logging.
    """
    path = _configured.get("file")
    if not path or _configured.get("level") == "debug":
        yield
        return
    saved = os.dup(1), os.dup(2)
    old_stderr = _redirect_output(Path(path))
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(saved, (1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        old_stderr.close()


def setup_worker_logging() -> None:
    """Ray's `worker_process_setup_hook` (see the module docstring); runs before the actor is created."""
    path, debug = os.environ.get(LOG_FILE_ENV), os.environ.get(LOG_LEVEL_ENV) == "debug"
    root = _reset_root(logging.DEBUG)
    if path and not Path(path).parent.is_dir():  # a node of an external cluster that does not share run.dir
        print(f"coevo: run.log's directory {Path(path).parent} does not exist on this node: this worker's logs "
              "stay in Ray's session log directory", file=sys.stderr, flush=True)
        path = None
    progress = logging.StreamHandler(sys.stderr)
    if path:
        root.addHandler(_file_handler(Path(path)))
        if not debug:
            progress = logging.StreamHandler(_redirect_output(Path(path)))
    if debug:
        terminal = logging.StreamHandler(sys.stderr)  # Ray forwards the worker's stderr to the driver
        terminal.setFormatter(logging.Formatter(FILE_FORMAT))
        root.addHandler(terminal)
    else:  # build progress still reaches the terminal, through Ray's forwarding of this stream
        progress.setFormatter(logging.Formatter("%(message)s"))
        progress.setLevel(logging.INFO)
        logging.getLogger(PROGRESS).addHandler(progress)
    route_library_loggers()
    _configured.update(level="debug" if debug else "info", file=path)
