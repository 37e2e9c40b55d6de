"""`python -m coevo.run`: the main job (Hydra). Overrides: `proposer=qwen3-4b solver=qwen2.5-7b`.

Creates the Ray actors, then runs `run.steps` co-evolution steps, writing after each step
the task dump, a metrics line and (every `run.save_every` steps and at the end) a
checkpoint. The run holds `run.dir`'s lock throughout and refuses a directory that already
holds a run unless `resume=true` (continue it: the newest checkpoint that verifies, same
experiment keys) or `run.overwrite=true` (empty it first); see coevo/core/rundir.py.
Ctrl-C or SIGTERM stops after the step's outputs in progress are written whole (exit code
128 + the signal number). The last lines are `done: <run dir>` and what it holds, also after
a stop (coevo/orchestrate/persist.py, shared with coevo.solve). `--help` lists every key.
`dry_run=true` makes the checks the run makes before Ray starts (models located, GPU plan, memory),
then prints the loaded stack and exits; the start-up path is coevo/startup.py's, shared with
coevo.solve and coevo.eval.
"""
from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from coevo.core.cli import hydra_entry
from coevo.core.config import CoevoConfig, register_schema, to_object
from coevo.core.console import say
from coevo.core.events import BEGIN, READY, STEP, emit
from coevo.core.inputs import load_reference_questions
from coevo.core.progress import StepBar
from coevo.core.stopping import uninterrupted
from coevo.orchestrate import hop_curriculum
from coevo.orchestrate.actors import create_actors, create_local_actors
from coevo.orchestrate.cluster import record_placement
from coevo.orchestrate.loop import coevolution_step, step_seed
from coevo.orchestrate.outputs import MetricsLog, step_headline, write_task_dump
from coevo.orchestrate.persist import checkpoint_due, open_metrics, restore, save_period, save_step
from coevo.orchestrate.stack import model_roles
from coevo.orchestrate.startup_checks import dry_run_checks, open_run
from coevo.orchestrate.timing import breakdown_line
from coevo.startup import Command, hydra_main
from proposer.curriculum import CurriculumState

register_schema()
LOG = logging.getLogger("coevo.run")


def next_references(questions: list[str], cursor: int, n: int) -> tuple[list[tuple[int, str]], int]:
    """The next `n` reference questions (cycling), with their indices, and the new cursor."""
    picked = [((cursor + i) % len(questions), questions[(cursor + i) % len(questions)]) for i in range(n)]
    return picked, cursor + n


def train(cfg: CoevoConfig, dcfg: DictConfig) -> Path:
    """Run the co-evolution loop, holding run.dir's lock throughout; returns the run directory.

    `open_run` sets up logging (run.log) once the run owns run.dir; then every model is located
    (`check_models`) and the memory estimated, both before Ray or any model starts.
    """
    run_dir = Path(cfg.run.dir)
    with open_run("coevo.run", cfg, dcfg) as ckpt:
        questions, report = load_reference_questions(cfg.run.reference_questions)
        if report.message():
            say(f"run.reference_questions: {report.message()}")
        random.seed(cfg.seed)
        t0 = time.perf_counter()
        metrics = open_metrics(cfg, dcfg, ckpt)
        try:
            actors = create_local_actors(cfg) if cfg.ray.local else create_actors(cfg)
            record_placement(run_dir, actors.placement)
            start, cursor = restore(ckpt, run_dir, actors)
            curriculum = hop_curriculum.start(cfg, hop_curriculum.saved_state(ckpt))  # the level a resume left
            LOG.info("actors ready in %.1fs; %d reference questions; steps %d..%d; run dir %s",
                     time.perf_counter() - t0, len(questions), start, cfg.run.steps - 1, run_dir)
            emit(run_dir, READY, start=start, last=cfg.run.steps - 1,
                 actors={name: p["pid"] for name, p in actors.placement.items()})
            _loop(cfg, run_dir, actors, questions, metrics, start, cursor, curriculum)
        finally:
            metrics.close()
    return run_dir


def _loop(cfg: CoevoConfig, run_dir: Path, actors, questions: list[str], metrics: MetricsLog,  # noqa: ANN001
          start: int, cursor: int, curriculum: Optional[CurriculumState] = None) -> None:
    with StepBar("coevo.run", cfg.run.steps, start) as bar:
        for step in range(start, cfg.run.steps):
            t0 = time.perf_counter()
            emit(run_dir, BEGIN, step=step)
            actors.check_alive()  # an actor lost in the last step stops the run here, named
            refs, cursor = next_references(questions, cursor, cfg.proposer.questions_per_step)
            records, m, hop_accuracy = coevolution_step(step, refs, actors, cfg, step_seed(cfg.seed, step), LOG.info,
                                                        hops=hop_curriculum.step_hops(cfg, curriculum))
            curriculum, m = hop_curriculum.advance(cfg, curriculum, m, hop_accuracy)
            written = time.perf_counter()
            with uninterrupted():  # a stop signal waits for the step's outputs and checkpoint to be whole
                write_task_dump(run_dir, step, records)
                metrics.log(step, m)
                if checkpoint_due(step, cfg.run.steps, save_period(cfg)):
                    save_step(run_dir, step, cursor, actors, hop_curriculum.checkpoint_state(curriculum))
                emit(run_dir, STEP, step=step)
            write_s, wall = time.perf_counter() - written, time.perf_counter() - t0
            bar.step(step, step_headline(m), wall)
            say(breakdown_line(m["time_s"], m["tokens"], write_s, wall))


COMMAND: Command[CoevoConfig] = Command(
    prog="coevo.run", validate=to_object, checks=dry_run_checks, roles=model_roles, run=train, owns_run_dir=True)
main = hydra_main(COMMAND, "coevo")

if __name__ == "__main__":
    hydra_entry(main, "coevo", to_object)
