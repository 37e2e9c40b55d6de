"""`python -m coevo.run`: the main job (Hydra). Overrides: `proposer=qwen3-4b solver=qwen2.5-7b`.

Creates the Ray actors, then runs `run.steps` co-evolution steps, writing after each step
the task dump, a metrics line and (every `run.save_every` steps and at the end) a
checkpoint. `resume=true` continues from the newest complete checkpoint in `run.dir`.
"""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from coevo.core.config import CoevoConfig, register_schema, to_object
from coevo.core.lifetime import ensure_reaper
from coevo.orchestrate.actors import ActorFailure, create_actors, create_local_actors
from coevo.orchestrate.loop import coevolution_step, step_seed
from coevo.orchestrate.outputs import (
    MetricsLog,
    drop_dumps_after,
    load_reference_questions,
    write_config,
    write_task_dump,
)
from coevo.orchestrate.stack import format_summary, load_stack_summary
from coevo.train.checkpoint import latest_checkpoint, prune_checkpoints, read_state, restore_rng, save_checkpoint
from coevo.train.memory import MemoryBudgetError, check_run_memory

register_schema()


def next_references(questions: list[str], cursor: int, n: int) -> tuple[list[tuple[int, str]], int]:
    """The next `n` reference questions (cycling), with their indices, and the new cursor."""
    picked = [((cursor + i) % len(questions), questions[(cursor + i) % len(questions)]) for i in range(n)]
    return picked, cursor + n


def _resume_point(cfg: CoevoConfig, run_dir: Path, actors, metrics) -> tuple[int, int]:  # noqa: ANN001
    """(first step to run, data cursor), restoring policies and RNG from the newest checkpoint."""

    ckpt = latest_checkpoint(run_dir) if cfg.resume else None
    if ckpt is None:
        if cfg.resume:
            print(f"resume=true but {run_dir}/checkpoints has no complete checkpoint; starting at step 0")
        return 0, 0
    state = read_state(ckpt)
    for role, policy in actors.trainable.items():
        if (ckpt / role).exists():
            policy.load(str(ckpt / role))
    restore_rng(state["rng"])
    metrics.truncate_after(state["step"])
    drop_dumps_after(run_dir, state["step"])
    print(f"resumed from {ckpt} (step {state['step']} done, cursor {state['cursor']})")
    return state["step"] + 1, state["cursor"]


def _checkpoint(run_dir: Path, step: int, cursor: int, actors) -> Path:  # noqa: ANN001

    def save(role: str, path: Path) -> None:
        actors.trainable[role].save(str(path))

    path = save_checkpoint(run_dir, step, cursor, save, sorted(actors.trainable))
    prune_checkpoints(run_dir, keep=2)
    return path


def train(cfg: CoevoConfig, dcfg: DictConfig) -> Path:
    """Run the co-evolution loop; returns the run directory."""

    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_config(run_dir, OmegaConf.to_yaml(dcfg, resolve=True))
    questions = load_reference_questions(cfg.run.reference_questions)
    random.seed(cfg.seed)
    t0 = time.perf_counter()
    # Before the actors: a logger that cannot start (run.logger=wandb, not installed) fails in seconds.
    metrics = MetricsLog(run_dir, cfg.run.logger, cfg.run.wandb_project,
                         OmegaConf.to_container(dcfg, resolve=True, enum_to_str=True))
    actors = create_local_actors(cfg) if cfg.ray.local else create_actors(cfg)
    start, cursor = _resume_point(cfg, run_dir, actors, metrics)
    print(f"actors ready in {time.perf_counter() - t0:.1f}s; {len(questions)} reference questions; "
          f"steps {start}..{cfg.run.steps - 1}; run dir {run_dir}", flush=True)
    started = time.perf_counter()
    for step in range(start, cfg.run.steps):
        refs, cursor = next_references(questions, cursor, cfg.proposer.questions_per_step)
        records, m = coevolution_step(step, refs, actors, cfg, step_seed(cfg.seed, step),
                                      progress=lambda s: print(s, flush=True))
        write_task_dump(run_dir, step, records)
        metrics.log(step, m)
        if (step + 1) % cfg.run.save_every == 0 or step == cfg.run.steps - 1:
            _checkpoint(run_dir, step, cursor, actors)
        _print_progress(step, m, cfg.run.steps, start, started)
    metrics.close()
    print(f"done: task dumps in {run_dir / 'tasks'}, metrics in {run_dir / 'metrics.jsonl'}; "
          f"inspect with: python -m coevo.inspect {run_dir}", flush=True)
    return run_dir


def _print_progress(step: int, m: dict, steps: int, start: int, started: float) -> None:
    done = step - start + 1
    eta = (time.perf_counter() - started) / done * (steps - step - 1)
    r = m["reward"]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"[step {step + 1}/{steps}] accepted {m['accepted']}/{m['candidates']} | reward proposer "
          f"{fmt(r['proposer'])} solver {fmt(r['solver'])} ranker {fmt(r['ranker'])} | "
          f"searches {fmt(m['solver']['mean_searches'])} | stage s {m['time_s']} | ETA {eta:.0f}s", flush=True)


@hydra.main(config_path="../configs", config_name="coevo", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    # First: Ray's processes and the engines must inherit this run's reaper token to die with it.
    ensure_reaper()
    cfg = to_object(dcfg)
    if cfg.dry_run:
        print(format_summary(load_stack_summary(cfg)), flush=True)
        return
    try:
        check_run_memory(cfg)
    except MemoryBudgetError as e:
        sys.exit(str(e))
    try:
        train(cfg, dcfg)
    except ActorFailure as e:
        print(f"coevo: run stopped: {e}\nThe last complete checkpoint in {cfg.run.dir}/checkpoints is intact; "
              "rerun with resume=true.", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
