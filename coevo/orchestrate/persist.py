"""What a training command keeps, and where: one copy for `coevo.run` and `coevo.solve`.

Both hold run.dir's lock throughout and write their config first (`open_run`), resume only
from a checkpoint that verifies and only into the same experiment (`open_run`, `restore`),
checkpoint every `run.save_every` steps (`save_period`) and at the end (`checkpoint_due`, `save_step`), and
end with one line `done: <run dir>` followed by what the directory holds (`done_report`),
also when they stop on an error or a signal (`run_and_report`: the line then says so).
The run-directory rules are coevo/core/rundir.py's, the checkpoint format
coevo/train/checkpoint.py's.
"""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from omegaconf import DictConfig, OmegaConf

from coevo.core.config import CoevoConfig
from coevo.core.console import report_error, say, setup_logging
from coevo.core.io import step_of
from coevo.core.rundir import (
    CONFIG_NAME,
    RunDirError,
    RunDirLock,
    check_not_in_use,
    check_same_experiment,
    claim_run_dir,
    hydra_entries,
    remove_temp_files,
    run_dir_verdict,
)
from coevo.core.stopping import Stopped, stop_on_signals
from coevo.orchestrate.actors import ActorFailure
from coevo.orchestrate.outputs import MetricsLog, drop_dumps_after, start_line, write_config
from coevo.train.checkpoint import (
    complete_checkpoints,
    drop_checkpoints_after,
    latest_checkpoint,
    prune_checkpoints,
    read_state,
    remove_partial_checkpoints,
    restore_rng,
    resumable_checkpoint,
    save_checkpoint,
)
from coevo.train.gpu_plan import check_gpu_plan
from coevo.train.memory import MemoryBudgetError, check_run_memory, loaded_policies
from coevo.train.preflight import PreflightError, check_devices, check_models
from evidence.build_index import IndexNotBuilt, check_prebuilt

log = logging.getLogger(__name__)
KEEP_CHECKPOINTS = 2  # the newest complete checkpoints kept; older ones are deleted after each save
GPU_SAVE_EVERY = 10  # run.save_every's default with a GPU role: its checkpoint is the whole trainer state


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


def resume_point(cfg: CoevoConfig, run_dir: Path, config_yaml: str) -> Optional[Path]:
    """The verified checkpoint to resume from (None: start at step 0), once the experiment is known to match."""
    if not cfg.resume:
        return None
    stored = (run_dir / CONFIG_NAME).exists()
    if stored:
        check_same_experiment(run_dir, config_yaml, type(cfg))
    ckpt, skipped = resumable_checkpoint(run_dir)
    for path, why in skipped:
        say(f"resume: skipping {path.name}: {why}")
    if ckpt is None and skipped:
        raise RunDirError(f"resume=true but no checkpoint in {run_dir / 'checkpoints'} verifies (reasons above); "
                          "run.overwrite=true deletes them and starts over")
    if ckpt is not None and not stored:
        raise RunDirError(f"resume=true but {run_dir / CONFIG_NAME} is missing: cannot check that this run "
                          "continues the same experiment")
    if ckpt is None:
        say(f"resume=true but {run_dir} holds no checkpoint yet: starting at step 0")
    return ckpt


# What a check raises when the command cannot start as asked: one line `<prog>: error: ...`, exit 2,
# nothing written (coevo.startup for checks made before the run, `run_and_report` for those inside it).
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


def open_metrics(cfg: CoevoConfig, dcfg: DictConfig, ckpt: Optional[Path]) -> MetricsLog:
    """metrics.jsonl and `run.logger` from the step after `ckpt` on (0: a fresh start).

    Made before the actors: a logger that cannot start (run.logger=wandb, not installed) fails in seconds.
    """
    return MetricsLog(Path(cfg.run.dir), cfg.run.logger, cfg.run.wandb_project,
                      OmegaConf.to_container(dcfg, resolve=True, enum_to_str=True),
                      start=read_state(ckpt)["step"] + 1 if ckpt is not None else 0)


def restore(ckpt: Optional[Path], run_dir: Path, actors: Any) -> tuple[int, int]:
    """(first step to run, data cursor): policies, optimizers and RNG restored from `ckpt`, later outputs dropped."""
    if ckpt is None:
        drop_dumps_after(run_dir, -1)
        return 0, 0
    state = read_state(ckpt)
    if sorted(state["roles"]) != sorted(actors.trainable):
        raise RunDirError(f"checkpoint {ckpt} holds the roles {sorted(state['roles'])} but this run trains "
                          f"{sorted(actors.trainable)}")
    for role, policy in actors.trainable.items():
        policy.load(str(ckpt / role))
    restore_rng(state["rng"])
    drop_dumps_after(run_dir, state["step"])
    dropped = drop_checkpoints_after(run_dir, state["step"])
    say(f"resumed from {ckpt} (step {state['step']} done, cursor {state['cursor']})"
        + (f"; deleted the unverified {', '.join(dropped)}" if dropped else ""))
    return state["step"] + 1, state["cursor"]


def save_period(cfg: CoevoConfig, with_proposer: bool = True) -> int:
    """The checkpoint period: `run.save_every` when set, else `GPU_SAVE_EVERY` when a loaded role
    (`loaded_policies`; `with_proposer=False` for coevo.solve) has `num_gpus > 0`, else 1.

    A GPU role saves its fp32 weights and AdamW state (12 bytes a parameter: 91 GB for a 7B solver),
    minutes of writing that every step would repeat; a CPU run's tiny models save every step.
    """
    if cfg.run.save_every is not None:
        return cfg.run.save_every
    on_gpu = any(policy.num_gpus > 0 for policy in loaded_policies(cfg, with_proposer).values())
    return GPU_SAVE_EVERY if on_gpu else 1


def checkpoint_due(step: int, steps: int, save_every: int) -> bool:
    """Whether step `step` (of `steps`) ends with a checkpoint: every `save_every` steps and the last one."""
    return (step + 1) % save_every == 0 or step == steps - 1


def save_step(run_dir: Path, step: int, cursor: int, actors: Any, extra: Optional[dict[str, Any]] = None) -> Path:
    """Checkpoint every trainable policy after `step`, then keep only the newest KEEP_CHECKPOINTS.

    `extra`: the run's other state for state.json (`hop_curriculum.checkpoint_state`), read back with `read_state`.
    """

    def save(role: str, path: Path) -> None:
        actors.trainable[role].save(str(path))

    path = save_checkpoint(run_dir, step, cursor, save, sorted(actors.trainable), extra)
    prune_checkpoints(run_dir, keep=KEEP_CHECKPOINTS)
    return path


def stopped_advice(run_dir: Path) -> str:
    """What to do after the run stopped: resume only when there is a checkpoint to resume from."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return (f"No checkpoint was written in {run_dir}: rerun with run.overwrite=true (or another run.dir) "
                "to start over.")
    return f"The last complete checkpoint, {ckpt}, is intact; rerun with resume=true to continue."


def _count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def run_contents(run_dir: Path) -> list[tuple[str, str]]:
    """(what, where) of each output a run keeps in `run_dir`, as the done report lists them."""
    rows = []
    tasks = run_dir / "tasks"
    dumps = sorted(n for f in tasks.iterdir() if (n := step_of(f.name, ".jsonl")) is not None) \
        if tasks.is_dir() else []
    if dumps:
        rows.append(("tasks", f"{len(dumps)} step dumps in {tasks} (step_{dumps[0]}..step_{dumps[-1]}.jsonl)"))
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        board = run_dir / "tensorboard"
        rows.append(("metrics", f"{_count_lines(metrics)} steps in {metrics}"
                     + (f"; TensorBoard: {board}" if board.is_dir() else "")))
    ckpts = complete_checkpoints(run_dir)
    if ckpts:
        newest = ckpts[-1]
        rows.append(("checkpoints", f"{', '.join(c.name for c in ckpts)} in {run_dir / 'checkpoints'} "
                     "(resume=true continues from the newest)"))
        if (newest / "solver").is_dir():
            ranker = f" ranker.mode=trainable ranker.checkpoint={newest / 'ranker'}" \
                if (newest / "ranker").is_dir() else ""
            rows.append(("evaluate", f"python -m coevo.eval solver.checkpoint={newest / 'solver'}{ranker}"))
    else:
        rows.append(("checkpoints", "none"))
    if (run_dir / CONFIG_NAME).is_file():
        rows.append(("config", str(run_dir / CONFIG_NAME)))
    if dumps:
        rows.append(("inspect", f"python -m coevo.inspect {run_dir}"))
    return rows


def done_report(run_dir: Path | str, stopped: Optional[str] = None,
                rows: Optional[list[tuple[str, str]]] = None) -> str:
    """`done: <run dir>` (with `(stopped ...)` when it did not finish), then one line per output it holds.

    rows: (what, where) lines to list instead of `run_contents(run_dir)` (then `run_dir` may be
    any short text: `coevo.inspect --compare` reports on several runs).
    """
    head = f"done: {run_dir}" + (f" ({stopped})" if stopped else "")
    listed = run_contents(Path(run_dir)) if rows is None else rows
    return "\n".join([head, *(f"  {what:<12} {where}" for what, where in listed)])


def error_line(e: BaseException, limit: int = 200) -> str:
    """`Type: first line of the message` (cut at `limit` characters), for the done line of a failed run."""
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first[:limit]}" + ("…" if len(first) > limit or len(text) > 1 else "")


def run_and_report(prog: str, run_dir: Path, body: Callable[[], object]) -> None:
    """Run `body` (which claims `run_dir`) and end with its done report; never returns on failure.

    Exit codes: 2 when run.dir cannot be used as asked, a model cannot be had or a large corpus's
    index is not built yet (no report: the run wrote nothing), 1 when the memory estimate exceeds
    the budget (no report either) or the run stopped on an error, 128 + n when signal n stopped it.
    """
    try:
        with stop_on_signals():
            body()
    except REFUSALS as e:
        report_error(prog, e)
        sys.exit(2)
    except MemoryBudgetError as e:
        sys.exit(str(e))
    except ActorFailure as e:
        _stop(f"coevo: run stopped: {e}\n{stopped_advice(run_dir)}", run_dir, f"stopped: {error_line(e)}", 1)
    except Stopped as e:
        _stop(f"coevo: stopped by {e}. {stopped_advice(run_dir)}", run_dir, f"stopped by {e}", e.exit_code)
    except Exception as e:  # noqa: BLE001  the traceback is logged; the report still says where the outputs are
        log.exception("%s stopped on an error", prog)
        _stop(f"{prog}: stopped on an error. {stopped_advice(run_dir)}", run_dir,
              f"stopped on an error: {error_line(e)}", 1)
    say(done_report(run_dir))


def _stop(message: str, run_dir: Path, stopped: str, code: int) -> None:
    print(f"{message}\n{done_report(run_dir, stopped)}", file=sys.stderr, flush=True)
    sys.exit(code)
