"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (SPEC §4).

No proposer here: tasks are labelled questions (JSONL with `question`, `answers`, optional
`id` and `gold_ids`). One step reads top to bottom in `solve_step`:
G episodes per question → correctness (token F1 by default in this mode) and tool-aware
solver rewards → composite ranker rewards and semantic grouping → GRPO advantages →
one update per trainable policy → one JSON line of metrics (stdout and
`<run.dir>/metrics.jsonl`).

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates

Config: `configs/solve.yaml` = the `coevo` root + a `solve:` block (`SolveConfig` below),
corpus wiki_mini and `solver.reward.correctness=f1`.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from coevo.core.config import CoevoConfig, register_schema, validate_config
from coevo.core.io import append_jsonl
from coevo.core.scoring import exact_match, f1
from coevo.core.types import TrainSequence
from coevo.train.policy import Policy
from evidence.corpus import corpus_source, load_corpus
from evidence.retrieval import build_retriever
from solver.agent import Episode, Task, run_episodes
from solver.ranker import RankerCall, SearchTool, build_ranker
from solver.reward import relevance_reward
from solver.training import episodes_by_task, ranker_sequences, score_ranker, score_solver, solver_sequences


@dataclass
class SolveConfig:
    """The `solve:` block: which labelled questions, how many steps, whether to train."""

    data: str = "${oc.env:COEVO_SHARED_DATA,../shared/data}/wiki_mini/questions_dev.jsonl"  # labelled JSONL
    limit: Optional[int] = None  # use only the first `limit` questions of the file
    steps: int = 2  # training steps (one question batch each)
    batch_questions: int = 4  # questions per step (each gets solver.group_size rollouts)
    train: bool = True  # run GRPO updates (false: rollouts and metrics only)
    shuffle: bool = True  # visit questions in a seeded random order


@dataclass
class SolveRootConfig(CoevoConfig):
    """Root config of `python -m coevo.solve`: the coevo root plus `solve`."""

    solve: SolveConfig = field(default_factory=SolveConfig)


def register_solve_schema() -> None:
    """Make `coevo_schema` and `solve_schema` available to Hydra's defaults lists."""
    from hydra.core.config_store import ConfigStore

    register_schema()
    ConfigStore.instance().store(name="solve_schema", node=SolveRootConfig)


def to_solve_object(dcfg: DictConfig) -> SolveRootConfig:
    """Typed, validated config (interpolations resolved)."""
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SolveRootConfig), dcfg))
    assert isinstance(obj, SolveRootConfig)
    validate_config(obj)
    return obj


def load_tasks(path: str | Path, limit: Optional[int] = None) -> list[Task]:
    """Labelled questions from JSONL; `gold_ids` become the tasks' evidence passages."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: malformed JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{line_no}: expected a JSON object")
            answers = rec.get("answers") or ([rec["answer"]] if "answer" in rec else [])
            if not rec.get("question") or not answers:
                raise ValueError(f"{path}:{line_no}: a labelled question needs 'question' and 'answers'")
            answers = [answers] if isinstance(answers, str) else [str(a) for a in answers]
            tasks.append(Task(str(rec.get("id", f"q{line_no}")), rec["question"], answers,
                              [str(i) for i in rec.get("gold_ids", [])]))
            if limit is not None and len(tasks) >= limit:
                break
    return tasks


def question_batches(tasks: list[Task], batch: int, steps: int, seed: int = 0,
                     shuffle: bool = True) -> Iterator[list[Task]]:
    """`steps` batches of `batch` questions, cycling through a (seeded) permutation."""
    if not tasks:
        raise ValueError("no labelled questions to solve")
    order = list(range(len(tasks)))
    if shuffle:
        random.Random(seed).shuffle(order)
    size = min(batch, len(order))
    for step in range(steps):
        yield [tasks[order[(step * size + j) % len(order)]] for j in range(size)]


@dataclass
class SolveStack:
    """What a step needs: the solver policy and its search tool (retriever + ranker)."""

    solver: Any  # coevo.train.policy.Policy (or anything with its generate/update interface)
    tool: SearchTool

    @property
    def ranker_policy(self) -> Optional[Any]:
        return self.tool.ranker.policy


def build_stack(cfg: SolveRootConfig) -> SolveStack:
    """Load corpus, retriever, solver and ranker (the solver's own object when share_backbone)."""
    retriever = build_retriever(load_corpus(corpus_source(cfg.corpus)), cfg.retrieval.backend, cfg.retrieval.cache_dir)
    solver = Policy.from_config(cfg.solver, "solver")
    # mode=frozen means a fixed ranker: load it frozen so it holds no optimizer or reference copy.
    ranker_cfg = dataclasses.replace(cfg.ranker, frozen=cfg.ranker.frozen or cfg.ranker.mode == "frozen")
    ranker = build_ranker(cfg.ranker, solver, lambda: Policy.from_config(ranker_cfg, "ranker"))
    return SolveStack(solver, SearchTool(retriever, ranker, cfg.ranker))


def tasks_of(episodes: list[Episode]) -> list[list[Episode]]:
    """Episodes grouped by task, in first-appearance order."""
    return list(episodes_by_task(episodes).values())


def score_episodes(episodes: list[Episode], cfg: SolveRootConfig) -> list[list[RankerCall]]:
    """Fill solver correctness/rewards and ranker rewards; return the ranker's GRPO groups."""
    score_solver(episodes, cfg.solver)
    return score_ranker(episodes, cfg.ranker)


def _mean(values: list[float]) -> Optional[float]:
    return round(sum(values) / len(values), 4) if values else None


def rollout_metrics(episodes: list[Episode], groups: list[list[RankerCall]], top_k: int) -> dict[str, Any]:
    """Solver and ranker figures of one episode batch (EM/F1 always, whatever the reward uses)."""
    calls = [c for ep in episodes for c in ep.ranker_calls]
    generated = [c for c in calls if c.generated]
    reasons: dict[str, int] = {}
    for ep in episodes:
        reasons[ep.end_reason] = reasons.get(ep.end_reason, 0) + 1
    golds = [(ep.answer or "", ep.task.answers) for ep in episodes]
    return {
        "questions": len(tasks_of(episodes)), "episodes": len(episodes),
        "solver_format_valid": _mean([float(ep.format_ok) for ep in episodes]),
        "em": _mean([exact_match(a, g) if a else 0.0 for a, g in golds]),
        "f1": _mean([f1(a, g) if a else 0.0 for a, g in golds]),
        "mean_searches": _mean([float(ep.n_searches) for ep in episodes]),
        "solver_reward": _mean([ep.reward for ep in episodes]),
        "gen_tokens_solver": sum(ep.n_generated for ep in episodes),
        "end_reasons": dict(sorted(reasons.items())),
        "ranker_calls": len(calls), "ranker_generated": len(generated),
        "ranker_format_valid": _mean([float(c.format_ok) for c in generated]),
        "ranker_i_ans": _mean([float(c.i_ans) for c in calls]),
        "ranker_r_rel": _mean([relevance_reward(c.ranked_relevant(), top_k) for c in calls]),
        "ranker_reward": _mean([c.reward for c in generated if c.reward is not None]),
        "gen_tokens_ranker": sum(len(c.completion_ids) for c in generated),
        "ranker_groups": len(groups),
        "ranker_grouped_share": _mean([float(c.group_id is not None) for c in generated]),
        "ranker_group_size": _mean([float(len(g)) for g in groups]),
    }


def update_policies(stack: SolveStack, cfg: SolveRootConfig, solver_batch: list[TrainSequence],
                    ranker_batch: list[TrainSequence]) -> dict[str, Any]:
    """One GRPO update per trainable policy; a shared backbone gets both batches in one update.

    Ranker modes frozen/none/oracle never train ranker calls; with `share_backbone` and a
    frozen ranker the shared weights still move with the solver's updates.
    """
    ranker_trains = cfg.ranker.mode == "trainable"
    if ranker_trains and cfg.ranker.share_backbone:
        return {"solver_update": _update(stack.solver, solver_batch + ranker_batch)}
    out = {"solver_update": _update(stack.solver, solver_batch)}
    if ranker_trains:
        out["ranker_update"] = _update(stack.ranker_policy, ranker_batch)
    return out


def _update(policy: Any, batch: list[TrainSequence]) -> dict[str, Any]:
    if not batch:
        return {"skipped": True, "n_seqs": 0}
    metrics = policy.update(batch)
    return {k: round(v, 5) if isinstance(v, float) else v for k, v in metrics.items()}


def solve_step(stack: SolveStack, tasks: list[Task], cfg: SolveRootConfig, train: bool = True) -> dict[str, Any]:
    """Rollouts, rewards, grouping, advantages and updates for one question batch; its metrics."""
    t0 = time.perf_counter()
    episodes = run_episodes(stack.solver, tasks, stack.tool, cfg.solver)
    rollout_s = time.perf_counter() - t0
    groups = score_episodes(episodes, cfg)
    solver_batch, solver_info = solver_sequences(episodes, cfg.solver.scale_std)
    ranker_batch, ranker_info = ranker_sequences(groups, cfg.ranker.scale_std)
    solver_zero, ranker_zero = solver_info["zero_var_groups"], ranker_info["zero_var_groups"]
    metrics = rollout_metrics(episodes, groups, cfg.ranker.top_k)
    metrics.update(solver_zero_var_groups=solver_zero, ranker_zero_var_groups=ranker_zero,
                   solver_train_seqs=len(solver_batch), ranker_train_seqs=len(ranker_batch),
                   rollout_s=round(rollout_s, 2))
    if train:
        t1 = time.perf_counter()
        metrics.update(update_policies(stack, cfg, solver_batch, ranker_batch))
        metrics["update_s"] = round(time.perf_counter() - t1, 2)
    return metrics


def run_solve(cfg: SolveRootConfig) -> list[dict[str, Any]]:
    """The whole job: load, then `solve.steps` steps; every step's metrics printed and appended."""
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tasks = load_tasks(cfg.solve.data, cfg.solve.limit)
    stack = build_stack(cfg)
    metrics_path = Path(cfg.run.dir) / "metrics.jsonl"
    history = []
    for step, batch in enumerate(question_batches(tasks, cfg.solve.batch_questions, cfg.solve.steps, cfg.seed,
                                                  cfg.solve.shuffle)):
        metrics = {"step": step, **solve_step(stack, batch, cfg, cfg.solve.train)}
        print(json.dumps(metrics), flush=True)
        append_jsonl(metrics_path, metrics)
        history.append(metrics)
    return history
