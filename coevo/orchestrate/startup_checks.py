"""Start-up checks and exit codes: what a command checks before any model starts, and how it ends.

The checks, made before Ray or any model starts (`run_checks`): every model located, the GPU roles
planned, `num_gpus > 0` against the visible GPUs, a large corpus's indexes found cached, the memory
estimated. A training command (`coevo.run`, `coevo.solve`) makes them once it holds run.dir's lock
(`open_run`, which claims the directory: `claim_run`); its dry run makes them without claiming it,
after asking whether it could (`dry_run_checks`). coevo/startup.py runs every entry point through them.

The exit codes (defined once, in coevo/core/cli.py, where every entry point's own checks use them too):
- `EXIT_REFUSED` (2): the command cannot start as asked: an invalid config, run.dir not usable as asked,
  a model that cannot be had, no visible GPU, a large corpus's index not built (`REFUSALS`). One line
  `<prog>: error: ...` on stderr; nothing written, no done report.
- `EXIT_FAILED` (1): the memory estimate exceeds the budget (its message on stderr, no done report), or the
  run stopped on an error or on an actor's failure (the done report says so, `run_and_report`).
- 128 + n: signal n stopped the run (`Stopped.exit_code`, coevo/core/stopping.py), with its done report.
What the run keeps and its done report are coevo/orchestrate/persist.py's.
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from coevo.core.cli import EXIT_FAILED, EXIT_REFUSED
from coevo.core.config import CoevoConfig
from coevo.core.console import report_error, say, setup_logging
from coevo.core.rundir import (
    RunDirError,
    RunDirLock,
    check_not_in_use,
    claim_run_dir,
    hydra_entries,
    remove_temp_files,
    run_dir_verdict,
)
from coevo.core.stopping import Stopped, stop_on_signals
from coevo.orchestrate.actors import ActorFailure
from coevo.orchestrate.extraction_mix import check_extraction_data
from coevo.orchestrate.outputs import start_line, write_config
from coevo.orchestrate.persist import done_report, resume_point, stopped_advice
from coevo.train.checkpoint import latest_checkpoint, remove_partial_checkpoints
from coevo.train.gpu_plan import check_gpu_plan
from coevo.train.memory import MemoryBudgetError, check_run_memory
from coevo.train.preflight import PreflightError, check_devices, check_models
from evidence.build_index import IndexNotBuilt, check_prebuilt

log = logging.getLogger(__name__)

# What a check raises when the command cannot start as asked: one line `<prog>: error: ...`,
# EXIT_REFUSED, nothing written (`exit_on_failed_check`, before the run or inside it).
REFUSALS = (RunDirError, PreflightError, IndexNotBuilt)


def run_checks(cfg: CoevoConfig, with_proposer: bool = True) -> tuple[Any, Any]:
    """The checks a training command makes before Ray or any model starts; returns (model sources, memory estimate).

    Every model located (`check_models`, the hub asked once at most, with a deadline), the GPU roles
    planned, `num_gpus > 0` against the visible GPUs, a large corpus's indexes found cached, the memory
    estimated. Raises PreflightError (PlanError), IndexNotBuilt or MemoryBudgetError. `open_run` makes
    them once it owns run.dir; a dry run (coevo/startup.py) makes the same ones without a run dir.
    """
    sources = check_models(cfg, with_proposer)
    check_gpu_plan(cfg, with_proposer)  # arithmetic only: a role too big for its GPU stops before it loads
    check_devices(cfg, with_proposer)  # num_gpus > 0 without a visible GPU: refused, never run on the CPU
    check_prebuilt(cfg, entities=with_proposer)  # a large corpus's indexes are built before the run, not in it
    if with_proposer:
        check_extraction_data(cfg)  # solver.extraction_mix's cloze file, read before any model starts
    return sources, check_run_memory(cfg, with_proposer=with_proposer)


def dry_run_checks(cfg: CoevoConfig, with_proposer: bool = True) -> tuple[Any, Any]:
    """A dry run's checks: whether the real run could claim run.dir as configured (no live run holds
    it, `check_not_in_use`; `run_dir_verdict`, reading only), then `run_checks`. Raises RunDirError
    first; nothing is written."""
    run_dir = Path(cfg.run.dir)
    check_not_in_use(run_dir)
    run_dir_verdict(run_dir, resume=cfg.resume, overwrite=cfg.run.overwrite, keep=hydra_entries(run_dir),
                    resumable=run_dir.is_dir() and latest_checkpoint(run_dir) is not None)
    return run_checks(cfg, with_proposer)


def claim_run(cfg: CoevoConfig, run_dir: Path) -> RunDirLock:
    """This run's lock on run.dir, with the directory emptied (run.overwrite) and a killed run's temp files gone."""
    lock = claim_run_dir(run_dir, resume=cfg.resume, overwrite=cfg.run.overwrite, keep=hydra_entries(run_dir),
                         resumable=latest_checkpoint(run_dir) is not None)
    try:
        removed = remove_partial_checkpoints(run_dir) + remove_temp_files(run_dir)
    except BaseException:
        lock.release()
        raise
    if removed:
        say(f"removed what an interrupted run left in {run_dir}: {', '.join(removed)}")
    return lock


@contextmanager
def open_run(prog: str, cfg: CoevoConfig, dcfg: DictConfig, with_proposer: bool = True) -> Iterator[Optional[Path]]:
    """Hold run.dir's lock for the block; yields the checkpoint to resume from (None: a fresh start).

    Once the run owns run.dir, logging is set up (run.log); then every model is located
    (`check_models`), the GPU roles planned (`check_gpu_plan`), a large corpus's indexes found
    cached (`check_prebuilt`) and the memory estimated, all before Ray or any model starts. The
    experiment check comes before config.yaml (`dcfg`, resolved) is (re)written: a refused
    resume leaves the stored config as it was.
    """
    run_dir = Path(cfg.run.dir)
    with claim_run(cfg, run_dir):
        setup_logging(cfg.log.level, run_dir)
        say(start_line(prog, cfg, *run_checks(cfg, with_proposer)))
        config_yaml = OmegaConf.to_yaml(dcfg, resolve=True)
        ckpt = resume_point(cfg, run_dir, config_yaml)
        write_config(run_dir, config_yaml)
        yield ckpt


@contextmanager
def exit_on_failed_check(prog: str) -> Iterator[None]:
    """Within the block, a failed start-up check ends the process: a refusal (`REFUSALS`) with its one
    line `<prog>: error: ...` and EXIT_REFUSED, the memory budget with its message and EXIT_FAILED."""
    try:
        yield
    except REFUSALS as e:
        report_error(prog, e)
        sys.exit(EXIT_REFUSED)
    except MemoryBudgetError as e:
        print(e, file=sys.stderr, flush=True)
        sys.exit(EXIT_FAILED)


def error_line(e: BaseException, limit: int = 200) -> str:
    """`Type: first line of the message` (cut at `limit` characters), for the done line of a failed run."""
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first[:limit]}" + ("…" if len(first) > limit or len(text) > 1 else "")


def run_and_report(prog: str, run_dir: Path, body: Callable[[], object]) -> None:
    """Run `body` (which claims `run_dir`) and end with its done report; never returns on failure.

    Exit codes (see the module doc): EXIT_REFUSED when run.dir cannot be used as asked, a model cannot
    be had or a large corpus's index is not built yet (no report: the run wrote nothing), EXIT_FAILED when
    the memory estimate exceeds the budget (no report either) or the run stopped on an error, 128 + n
    when signal n stopped it.
    """
    try:
        with exit_on_failed_check(prog), stop_on_signals():  # the handlers restored before a refusal exits
            body()
    except ActorFailure as e:
        _stop(f"coevo: run stopped: {e}\n{stopped_advice(run_dir)}", run_dir, f"stopped: {error_line(e)}",
              EXIT_FAILED)
    except Stopped as e:
        _stop(f"coevo: stopped by {e}. {stopped_advice(run_dir)}", run_dir, f"stopped by {e}", e.exit_code)
    except Exception as e:  # noqa: BLE001  the traceback is logged; the report still says where the outputs are
        log.exception("%s stopped on an error", prog)
        _stop(f"{prog}: stopped on an error. {stopped_advice(run_dir)}", run_dir,
              f"stopped on an error: {error_line(e)}", EXIT_FAILED)
    say(done_report(run_dir))


def _stop(message: str, run_dir: Path, stopped: str, code: int) -> None:
    print(f"{message}\n{done_report(run_dir, stopped)}", file=sys.stderr, flush=True)
    sys.exit(code)
