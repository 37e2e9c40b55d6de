"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (docs/method.md §4).

No proposer here: tasks are labelled questions (JSONL with `question`, `answers`, optional
`id` and `gold_ids`). One step reads top to bottom in `solve_step`:
G episodes per question → correctness (token F1 by default in this mode) and tool-aware
solver rewards → composite ranker rewards and semantic grouping → GRPO advantages →
one update per trainable policy → one line of metrics in `<run.dir>/metrics.jsonl` (and the
`run.logger`: TensorBoard by default) and one line with its headline figures on the terminal.
Checkpoints and resume are `coevo.run`'s (coevo/orchestrate/persist.py): every
`run.save_every` steps and at the end, the trainable policies with their optimizers and the
question cursor; `resume=true` continues at the step after the newest checkpoint that verifies.

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates

Config: `configs/solve.yaml` = the `coevo` root + a `solve:` block (schema `SolveRootConfig`
in coevo/core/config.py), corpus wiki_mini and `solver.reward.correctness=f1`.
"""
from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from omegaconf import DictConfig

from coevo.core.config import SolveRootConfig, to_object
from coevo.core.console import say
from coevo.core.events import BEGIN, READY, STEP, emit
from coevo.core.inputs import load_labelled_questions
from coevo.core.progress import StepBar
from coevo.core.stopping import uninterrupted
from coevo.orchestrate.actors import create_local_actors
from coevo.orchestrate.loop import apply_updates, role_batches, solve_tasks, step_seed
from coevo.orchestrate.outputs import MetricsLog, step_headline
from coevo.orchestrate.persist import checkpoint_due, open_metrics, restore, save_period, save_step
from coevo.orchestrate.startup_checks import open_run
from coevo.orchestrate.step_metrics import rollout_figures
from coevo.orchestrate.timing import StageTimer, breakdown_line, update_tokens
from solver.agent import Episode, Task
from solver.ranker import RankerCall
from solver.training import episodes_by_task

LOG = logging.getLogger("coevo.solve")


def to_solve_object(dcfg: DictConfig) -> SolveRootConfig:
    """Typed, validated config (interpolations resolved)."""
    obj = to_object(dcfg, SolveRootConfig)
    assert isinstance(obj, SolveRootConfig)
    return obj


def load_tasks(path: str | Path, limit: Optional[int] = None) -> list[Task]:
    """The first `limit` (default all) labelled questions of a file as tasks; `gold_ids` are their evidence,
    `guide` the searches a guided rollout replays (`solver.guided_rollouts`, e.g. evidence/extraction.py's tasks).

    Read and validated by `coevo.core.inputs.load_labelled_questions`, the loader `coevo.eval`
    uses too: the whole file is checked, also past `limit`.
    """
    questions, _ = load_labelled_questions(path)
    return [Task(q.id, q.question, q.answers, q.gold_ids, q.guide) for q in questions[:limit]]


def question_batches(tasks: list[Task], batch: int, steps: int, seed: int = 0, shuffle: bool = True,
                     start: int = 0, cursor: int = 0) -> Iterator[list[Task]]:
    """The batches of steps `start`..`steps`-1, `batch` questions each, cycling through a (seeded) permutation.

    The first begins at position `cursor` of the permutation: the questions the steps before
    `start` consumed (a resumed run passes its checkpoint's cursor).
    """
    if not tasks:
        raise ValueError("no labelled questions to solve")
    order = list(range(len(tasks)))
    if shuffle:
        random.Random(seed).shuffle(order)
    size = min(batch, len(order))
    for i in range(steps - start):
        yield [tasks[order[(cursor + i * size + j) % len(order)]] for j in range(size)]


def rollout_metrics(episodes: list[Episode], groups: list[list[RankerCall]], top_k: int) -> dict[str, Any]:
    """The step's question and episode counts, then the solver, reward and ranker blocks every command
    writes alike (`coevo.orchestrate.step_metrics.rollout_figures`: each key's population stated there)."""
    return {"questions": len(episodes_by_task(episodes)), "episodes": len(episodes),
            **rollout_figures(episodes, groups, top_k)}


def solve_step(actors: Any, tasks: list[Task], cfg: SolveRootConfig, seed: int, train: bool = True) -> dict[str, Any]:
    """The co-evolution step without the proposer stages: rollouts, rewards, groups, updates.

    `actors` has the co-evolution loop's shape (`solver`, `ranker`, `retrieval`, `trainable`);
    metrics nest as in the loop (`solver/...`, `reward/...`, `ranker/...`, `update/<role>/...`).
    """
    timer = StageTimer()
    with timer("solve"):
        episodes, groups, _ = solve_tasks(tasks, timer.metered(actors), cfg, seed)
    metrics = rollout_metrics(episodes, groups, cfg.ranker.top_k)
    if train:
        with timer("update"):
            metrics["update"] = apply_updates(actors.trainable, role_batches(cfg, actors.trainable, [], episodes,
                                                                             groups))
        timer.tokens["update"] = update_tokens(metrics["update"])
    return {**metrics, "time_s": timer.seconds, "tokens": timer.tokens}


def run_solve(cfg: SolveRootConfig, dcfg: DictConfig) -> list[dict[str, Any]]:
    """The whole job in run.dir, holding its lock: load, resume if asked, then the steps up to `solve.steps`.

    dcfg: the composed config, stored as config.yaml (a resume checks it against the stored one).
    Returns the metrics of the steps this call ran.
    """
    run_dir = Path(cfg.run.dir)
    with open_run("coevo.solve", cfg, dcfg, with_proposer=False) as ckpt:
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        tasks = load_tasks(cfg.solve.data, cfg.solve.limit)
        metrics = open_metrics(cfg, dcfg, ckpt)
        try:
            t0 = time.perf_counter()
            actors = create_local_actors(cfg, with_proposer=False)
            start, cursor = restore(ckpt, run_dir, actors)
            LOG.info("actors ready in %.1fs; %d questions; steps %d..%d; run dir %s",
                     time.perf_counter() - t0, len(tasks), start, cfg.solve.steps - 1, run_dir)
            emit(run_dir, READY, start=start, last=cfg.solve.steps - 1)
            return _solve_steps(cfg, actors, tasks, metrics, start, cursor)
        finally:
            metrics.close()


def _solve_steps(cfg: SolveRootConfig, actors: Any, tasks: list[Task], metrics: MetricsLog, start: int,
                 cursor: int) -> list[dict[str, Any]]:
    history = []
    batches = question_batches(tasks, cfg.solve.batch_questions, cfg.solve.steps, cfg.seed, cfg.solve.shuffle,
                               start, cursor)
    with StepBar("coevo.solve", cfg.solve.steps, start) as bar:
        for step, batch in zip(range(start, cfg.solve.steps), batches):
            t0 = time.perf_counter()
            emit(cfg.run.dir, BEGIN, step=step)
            m = solve_step(actors, batch, cfg, step_seed(cfg.seed, step), cfg.solve.train)
            cursor += len(batch)
            written = time.perf_counter()
            with uninterrupted():  # a stop signal waits for the step's metrics and checkpoint to be whole
                metrics.log(step, m)  # first: bench/memory.py reads metrics.jsonl when the step's line appears
                if checkpoint_due(step, cfg.solve.steps, save_period(cfg, with_proposer=False)):
                    save_step(Path(cfg.run.dir), step, cursor, actors)
                emit(cfg.run.dir, STEP, step=step)
            history.append({"step": step, **m})
            write_s, wall = time.perf_counter() - written, time.perf_counter() - t0
            bar.step(step, step_headline(history[-1]), wall)
            say(breakdown_line(m["time_s"], m["tokens"], write_s, wall))
    return history
