"""The co-evolution driver (SPEC §2): one step = propose → validate → solve → reward → update.

`coevolution_step` is the whole algorithm and reads top to bottom; `train` wraps it with
the data cursor, dumps, metrics, checkpoints and resume.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from coevo.core.config import CoevoConfig
from coevo.core.grpo import group_advantages
from coevo.core.types import SamplingParams
from coevo.orchestrate.records import candidate_record, step_metrics
from proposer.pipeline import (
    Candidate,
    assign_proposer_rewards,
    attach_paths,
    check_questions,
    check_targets,
    propose_questions,
    propose_targets,
    proposer_sequences,
)
from solver.agent import Task, run_episodes
from solver.ranker import SearchTool, build_ranker
from solver.training import ranker_sequences, score_ranker, score_solver, solver_sequences


@dataclass
class StageTimer:
    """Wall-clock seconds per stage of one step."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.seconds[stage] = round(self.seconds.get(stage, 0.0) + time.perf_counter() - t0, 3)


def coevolution_step(step: int, references: list[tuple[int, str]], actors: Any, cfg: CoevoConfig,
                     seed: int, progress: Any = print) -> tuple[list[dict], dict]:
    """Run one step of SPEC §2 and return (task-dump records, metrics)."""
    timer = StageTimer()
    with timer("target"):
        cands = propose_targets(actors.proposer, references, cfg.proposer, seed)
        check_targets(actors.evidence, cands)
    with timer("path"):
        attach_paths(actors.evidence, cands, seed)
    with timer("question"):
        propose_questions(actors.proposer, cands, cfg.proposer, seed + 1)
        check_questions(actors.evidence, cands)
    tasks = {f"s{step}-q{c.ref_index}-c{c.index}": c for c in cands if c.accepted}
    progress(f"step {step}: {len(tasks)}/{len(cands)} tasks accepted; solving with G={cfg.solver.group_size}")
    with timer("solve"):
        episodes = solve_tasks(tasks, actors, cfg, seed + 2)
        accuracy = score_solver(episodes, cfg.solver)
        groups = score_ranker(episodes, cfg.ranker)
    for task_id, cand in tasks.items():
        cand.accuracy = accuracy.get(task_id)
    assign_proposer_rewards(cands, cfg.proposer)
    with timer("update"):
        updates = update_policies(actors, cands, episodes, groups, cfg)
    metrics = {**step_metrics(cands, episodes, groups, cfg.ranker.top_k), "update": updates,
               "time_s": timer.seconds}
    task_of = {id(c): t for t, c in tasks.items()}
    decode = actors.solver.tokenizer.decode  # the dump shows what the solver wrote and read
    records = [candidate_record(c, task_of.get(id(c)), [ep for ep in episodes if ep.task_id == task_of.get(id(c))],
                                timer.seconds, decode) for c in cands]
    return records, metrics


def solve_tasks(tasks: dict[str, Candidate], actors: Any, cfg: CoevoConfig, seed: int) -> list[Any]:
    """G solver rollouts per accepted task, all live episodes batched per turn."""
    if not tasks:
        return []
    ranker = build_ranker(cfg.ranker, solver_policy=actors.solver, load_policy=lambda: actors.ranker)
    tool = SearchTool(actors.retrieval, ranker, cfg.ranker)
    todo = [Task(tid, c.question, [c.target], list((c.path or {}).get("evidence_ids", []))) for tid, c in tasks.items()]
    sampling = SamplingParams(temperature=cfg.solver.temperature, top_p=cfg.solver.top_p,
                              max_new_tokens=cfg.solver.max_new_tokens, stop=["</search>", "</answer>"], seed=seed)
    return run_episodes(actors.solver, todo, tool, cfg.solver, sampling=sampling)


def update_policies(actors: Any, cands: list[Candidate], episodes: list[Any], groups: list[Any],
                    cfg: CoevoConfig) -> dict[str, Any]:
    """One GRPO update per trainable policy (frozen ones and empty batches are skipped)."""
    out: dict[str, Any] = {}
    if "proposer" in actors.trainable:
        ids = [c.ref_index for c in cands]
        adv, n_zero = group_advantages(_tensor([c.reward for c in cands]), ids, scale_std=cfg.proposer.scale_std)
        batch = proposer_sequences(cands, adv.tolist())
        out["proposer"] = {**_update(actors.proposer, batch), "zero_var_groups": int(n_zero)}
    if "solver" in actors.trainable or (cfg.ranker.share_backbone and "solver" in actors.trainable):
        batch, info = solver_sequences(episodes, cfg.solver.scale_std)
        if cfg.ranker.share_backbone and cfg.ranker.mode == "trainable":
            ranker_batch, rinfo = ranker_sequences(groups, cfg.ranker.scale_std)
            batch, info = batch + ranker_batch, {**info, "ranker": rinfo}
        out["solver"] = {**_update(actors.solver, batch), **info}
    if "ranker" in actors.trainable:
        batch, info = ranker_sequences(groups, cfg.ranker.scale_std)
        out["ranker"] = {**_update(actors.ranker, batch), **info}
    return out


def _update(policy: Any, batch: list) -> dict:
    if not batch:
        return {"skipped": True, "n_seqs": 0}
    return policy.update(batch)


def _tensor(xs: list[float]):  # noqa: ANN202
    import torch

    return torch.tensor(xs, dtype=torch.float32)
