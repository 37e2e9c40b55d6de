"""`python -m coevo.run`: the main job (Hydra). Overrides: `proposer=qwen3-4b solver=qwen2.5-7b`.

Creates the Ray actors, then runs `run.steps` co-evolution steps, writing after each step
the task dump, a metrics line and (every `run.save_every` steps and at the end) a
checkpoint. The run holds `run.dir`'s lock throughout and refuses a directory that already
holds a run unless `resume=true` (continue it: the newest checkpoint that verifies, same
experiment keys) or `run.overwrite=true` (empty it first); see coevo/core/rundir.py.
Ctrl-C or SIGTERM stops after the step's outputs in progress are written whole (exit code
128 + the signal number).
"""
from __future__ import annotations

import logging
import random
import sys
import time
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf

from coevo.core.config import CoevoConfig, register_schema, to_object
from coevo.core.console import report_error, say, setup_logging
from coevo.core.inputs import load_reference_questions
from coevo.core.lifetime import Stopped, ensure_reaper, stop_on_signals, uninterrupted
from coevo.core.progress import StepBar
from coevo.core.rundir import (
    CONFIG_NAME,
    RunDirError,
    RunDirLock,
    check_same_experiment,
    claim_run_dir,
    hydra_entries,
    remove_temp_files,
)
from coevo.orchestrate.actors import ActorFailure, create_actors, create_local_actors
from coevo.orchestrate.loop import coevolution_step, step_seed
from coevo.orchestrate.outputs import (
    MetricsLog,
    drop_dumps_after,
    start_line,
    step_headline,
    write_config,
    write_task_dump,
)
from coevo.orchestrate.stack import format_summary, load_stack_summary
from coevo.train.checkpoint import (
    drop_checkpoints_after,
    latest_checkpoint,
    prune_checkpoints,
    read_state,
    remove_partial_checkpoints,
    restore_rng,
    resumable_checkpoint,
    save_checkpoint,
)
from coevo.train.memory import MemoryBudgetError, check_run_memory
from coevo.train.preflight import PreflightError, check_models

register_schema()
LOG = logging.getLogger("coevo.run")


def next_references(questions: list[str], cursor: int, n: int) -> tuple[list[tuple[int, str]], int]:
    """The next `n` reference questions (cycling), with their indices, and the new cursor."""
    picked = [((cursor + i) % len(questions), questions[(cursor + i) % len(questions)]) for i in range(n)]
    return picked, cursor + n


def _resume_point(cfg: CoevoConfig, run_dir: Path, config_yaml: str) -> Optional[Path]:
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


def _restore(ckpt: Optional[Path], run_dir: Path, actors) -> tuple[int, int]:  # noqa: ANN001
    """(first step to run, data cursor), restoring policies and RNG from `ckpt` and dropping later outputs."""
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


def _checkpoint(run_dir: Path, step: int, cursor: int, actors) -> Path:  # noqa: ANN001

    def save(role: str, path: Path) -> None:
        actors.trainable[role].save(str(path))

    path = save_checkpoint(run_dir, step, cursor, save, sorted(actors.trainable))
    prune_checkpoints(run_dir, keep=2)
    return path


def _claim(cfg: CoevoConfig, run_dir: Path) -> RunDirLock:
    """This run's lock on run.dir, with the directory emptied (run.overwrite) and a killed run's temp files gone."""
    lock = claim_run_dir(run_dir, resume=cfg.resume, overwrite=cfg.run.overwrite, keep=hydra_entries(run_dir),
                         resumable=latest_checkpoint(run_dir) is not None)
    try:
        removed = remove_partial_checkpoints(run_dir) + remove_temp_files(run_dir)
    except BaseException:
        lock.release()
        raise
    if removed:
        print(f"removed what an interrupted run left in {run_dir}: {', '.join(removed)}", flush=True)
    return lock


def train(cfg: CoevoConfig, dcfg: DictConfig) -> Path:
    """Run the co-evolution loop, holding run.dir's lock throughout; returns the run directory.

    Logging is set up (run.log) once the run owns run.dir; then every model is located
    (`check_models`) and the memory estimated, both before Ray or any model starts.
    """
    run_dir = Path(cfg.run.dir)
    with _claim(cfg, run_dir):
        setup_logging(cfg.log.level, run_dir)
        sources = check_models(cfg)
        say(start_line("coevo.run", cfg, sources, check_run_memory(cfg)))
        config_yaml = OmegaConf.to_yaml(dcfg, resolve=True)
        ckpt = _resume_point(cfg, run_dir, config_yaml)
        write_config(run_dir, config_yaml)
        questions, report = load_reference_questions(cfg.run.reference_questions)
        if report.message():
            say(f"run.reference_questions: {report.message()}")
        random.seed(cfg.seed)
        t0 = time.perf_counter()
        # Before the actors: a logger that cannot start (run.logger=wandb, not installed) fails in seconds.
        metrics = MetricsLog(run_dir, cfg.run.logger, cfg.run.wandb_project,
                             OmegaConf.to_container(dcfg, resolve=True, enum_to_str=True),
                             start=read_state(ckpt)["step"] + 1 if ckpt is not None else 0)
        try:
            actors = create_local_actors(cfg) if cfg.ray.local else create_actors(cfg)
            start, cursor = _restore(ckpt, run_dir, actors)
            LOG.info("actors ready in %.1fs; %d reference questions; steps %d..%d; run dir %s",
                     time.perf_counter() - t0, len(questions), start, cfg.run.steps - 1, run_dir)
            _loop(cfg, run_dir, actors, questions, metrics, start, cursor)
        finally:
            metrics.close()
    say(f"done: task dumps in {run_dir / 'tasks'}, metrics in {run_dir / 'metrics.jsonl'}; "
        f"inspect with: python -m coevo.inspect {run_dir}")
    return run_dir


def _loop(cfg: CoevoConfig, run_dir: Path, actors, questions: list[str], metrics: MetricsLog,  # noqa: ANN001
          start: int, cursor: int) -> None:
    with StepBar("coevo.run", cfg.run.steps, start) as bar:
        for step in range(start, cfg.run.steps):
            t0 = time.perf_counter()
            refs, cursor = next_references(questions, cursor, cfg.proposer.questions_per_step)
            records, m = coevolution_step(step, refs, actors, cfg, step_seed(cfg.seed, step), progress=LOG.info)
            with uninterrupted():  # a stop signal waits for the step's outputs and checkpoint to be whole
                write_task_dump(run_dir, step, records)
                metrics.log(step, m)
                if (step + 1) % cfg.run.save_every == 0 or step == cfg.run.steps - 1:
                    _checkpoint(run_dir, step, cursor, actors)
            bar.step(step, step_headline(m), time.perf_counter() - t0)


def _stopped_advice(run_dir: Path) -> str:
    """What to do after the run stopped: resume only when there is a checkpoint to resume from."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return (f"No checkpoint was written in {run_dir}: rerun with run.overwrite=true (or another run.dir) "
                "to start over.")
    return f"The last complete checkpoint, {ckpt}, is intact; rerun with resume=true to continue."


@hydra.main(config_path="../configs", config_name="coevo", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    # First: Ray's processes and the engines must inherit this run's reaper token to die with it.
    ensure_reaper()
    try:
        cfg = to_object(dcfg)
    except ValueError as e:
        print(f"coevo.run: error: {e}", file=sys.stderr)
        sys.exit(2)
    if cfg.dry_run:
        setup_logging(cfg.log.level)  # terminal only: a dry run writes no run.log
        print(format_summary(load_stack_summary(cfg)), flush=True)
        return
    run_dir = Path(cfg.run.dir)
    try:
        with stop_on_signals():
            train(cfg, dcfg)
    except (RunDirError, PreflightError) as e:
        report_error("coevo.run", e)
        sys.exit(2)
    except MemoryBudgetError as e:
        sys.exit(str(e))
    except ActorFailure as e:
        print(f"coevo: run stopped: {e}\n{_stopped_advice(run_dir)}", file=sys.stderr)
        sys.exit(1)
    except Stopped as e:
        print(f"coevo: stopped by {e}. {_stopped_advice(run_dir)}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
