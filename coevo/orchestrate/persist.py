"""What a training command keeps, and where: one copy for `coevo.run` and `coevo.solve`.

Both resume only from a checkpoint that verifies and only into the same experiment (`resume_point`,
`restore`), checkpoint every `run.save_every` steps (`save_period`) and at the end (`checkpoint_due`,
`save_step`), and end with one line `done: <run dir>` followed by what the directory holds (`done_report`;
after a stop, `stopped_advice` says what to do next). Claiming run.dir, the checks before a run and the
exit codes are coevo/orchestrate/startup_checks.py's, the run-directory rules coevo/core/rundir.py's,
the checkpoint format coevo/train/checkpoint.py's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from coevo.core.config import CoevoConfig
from coevo.core.console import say
from coevo.core.events import SAVE, emit
from coevo.core.io import step_of
from coevo.core.rundir import CONFIG_NAME, RunDirError, check_same_experiment
from coevo.orchestrate.outputs import MetricsLog, drop_dumps_after
from coevo.train.checkpoint import (
    complete_checkpoints,
    drop_checkpoints_after,
    latest_checkpoint,
    prune_checkpoints,
    read_state,
    restore_rng,
    resumable_checkpoint,
    save_checkpoint,
)
from coevo.train.memory import loaded_policies

KEEP_CHECKPOINTS = 2  # the newest complete checkpoints kept; older ones are deleted after each save
GPU_SAVE_EVERY = 10  # run.save_every's default with a GPU role: its checkpoint is the whole trainer state


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

    emit(run_dir, SAVE, step=step)  # for supervisors (bench.faults strikes during saves): events.py

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
