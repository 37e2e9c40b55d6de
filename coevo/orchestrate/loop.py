"""The co-evolution driver (docs/method.md §2): one step = propose → validate → solve → reward → update.

`coevolution_step` is the whole algorithm and reads top to bottom; `coevo.run` wraps it with
the data cursor, dumps, metrics, checkpoints and resume. `solve_tasks`, `role_batches` and
`apply_updates` are also the whole of `coevo.solve`'s step (the same step without the
proposer stages), so both train the solver and the ranker through one path.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping, NamedTuple, Optional, Sequence

from coevo.core.choices import PathLength, path_length
from coevo.core.config import CoevoConfig
from coevo.core.types import SamplingParams, TrainSequence
from coevo.orchestrate import extraction_mix
from coevo.orchestrate.actors import Actors
from coevo.orchestrate.records import candidate_record, hop_accuracy, step_metrics
from coevo.orchestrate.timing import StageTimer, update_tokens
from proposer.pipeline import (
    Candidate,
    assign_proposer_rewards,
    attach_paths,
    check_questions,
    check_targets,
    grounding_titles,
    propose_questions,
    propose_targets,
    proposer_sequences,
)
from solver.agent import Episode, Task, run_episodes
from solver.ranker import RankerCall, build_ranker
from solver.search_tool import SearchTool
from solver.training import ranker_sequences, score_ranker, score_solver, solver_sequences


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of one step: a resumed step samples exactly what the original would have."""
    return (seed * 1_000_003 + step * 7919) % (2**31 - 1)


class StepOutcome(NamedTuple):
    """What one co-evolution step returns: its task-dump records, its metrics line, and the mean solver
    accuracy of its accepted tasks by path length (hops -> accuracy, None: none scored), the value the
    hop curriculum moves on (`hop_curriculum.advance`; the metrics log it as `hops/accuracy/<k>`)."""

    records: list[dict]
    metrics: dict[str, Any]
    hop_accuracy: dict[int, Optional[float]]


def coevolution_step(step: int, references: list[tuple[int, str]], actors: Actors, cfg: CoevoConfig,
                     seed: int, progress: Any = print, hops: PathLength | int | None = None) -> StepOutcome:
    """Run one step of docs/method.md §2 and return its `StepOutcome`.

    `hops`: this step's path length (the hop curriculum's level); None: `evidence.hops`.
    """
    timer = StageTimer()
    actors = timer.metered(actors)  # tokens per stage (coevo/orchestrate/timing.py)
    cands = propose_tasks(references, actors, cfg, seed, timer, hops)
    tasks = {make_task_id(step, pos, c): c for pos, c in enumerate(cands) if c.accepted}
    progress(f"step {step}: {len(tasks)}/{len(cands)} tasks accepted; solving with G={cfg.solver.group_size}")
    todo = [Task(tid, c.question, c.answers, c.path.evidence_ids if c.path is not None else [], c.guide)
            for tid, c in tasks.items()]
    clozes = extraction_mix.step_clozes(cfg, step)  # corpus clozes beside the tasks (solver.extraction_mix; off: none)
    with timer("solve"):
        episodes, groups, accuracy = solve_tasks(todo + clozes.tasks, actors, cfg, seed + 2)
    episodes, groups, mixed = clozes.apart(episodes, groups, accuracy)  # every figure below is the tasks' alone
    for task_id, cand in tasks.items():
        cand.accuracy = accuracy.get(task_id)
    assign_proposer_rewards(cands, cfg.proposer)
    with timer("update"):
        updates = apply_updates(actors.trainable, role_batches(cfg, actors.trainable, cands, episodes + mixed.episodes,
                                                               groups + mixed.groups))
    timer.tokens["update"] = update_tokens(updates)
    metrics = {**step_metrics(cands, episodes, groups, cfg.ranker.top_k), **clozes.metrics(mixed, cfg.ranker.top_k),
               "update": updates, "time_s": timer.seconds, "tokens": timer.tokens}
    task_of = {id(c): t for t, c in tasks.items()}
    decode = actors.solver.tokenizer.decode  # the dump shows what the solver wrote and read
    records = [candidate_record(c, task_of.get(id(c)), [ep for ep in episodes if ep.task_id == task_of.get(id(c))],
                                timer.seconds, decode) for c in cands] + clozes.records(mixed, decode)
    return StepOutcome(records, metrics, hop_accuracy([c for c in cands if c.accepted]))


def propose_tasks(references: list[tuple[int, str]], actors: Actors, cfg: CoevoConfig, seed: int,
                  timer: StageTimer | None = None, hops: PathLength | int | None = None) -> list[Candidate]:
    """docs/method.md §3.1-3.4: call 1 → target checks → evidence paths → call 2 → question checks.

    Every candidate comes back with its verdicts; the accepted ones are the step's tasks.
    `hops`: the path length asked for (None: `evidence.hops`).
    """
    timer = timer if timer is not None else StageTimer()
    hops = path_length(cfg.evidence.hops, cfg.evidence.max_hops) if hops is None else hops
    with timer("target"):
        titles = grounding_titles(actors.retrieval, [q for _, q in references], cfg.proposer.grounding)
        cands = propose_targets(actors.proposer, references, cfg.proposer, seed, titles)
        check_targets(actors.evidence, cands)
    with timer("path"):
        attach_paths(actors.evidence, cands, seed, direct=cfg.proposer.generation == "direct", hops=hops)
    with timer("question"):
        propose_questions(actors.proposer, cands, cfg.proposer, seed + 1)
        check_questions(actors.evidence, cands)
    return cands


def make_task_id(step: int, position: int, cand: Candidate) -> str:
    """`s<step>-q<reference_index>-c<position>`: `position` is the candidate's place in the step
    (its line in tasks/step_<n>.jsonl), so ids stay unique when a step's reference questions
    repeat (a short question file cycled); `q` only tells the reader which reference it was."""
    return f"s{step}-q{cand.ref_index}-c{position}"


def solve_tasks(tasks: list[Task], actors: Actors, cfg: CoevoConfig,
                seed: int) -> tuple[list[Episode], list[list[RankerCall]], dict[str, float]]:
    """G solver rollouts per task (all live episodes batched per turn), then their rewards.

    Returns (episodes, the ranker's GRPO groups, solver accuracy per task id). Shared by
    the co-evolution step and `coevo.solve`, whose step is this plus the update.
    """
    if not tasks:
        return [], [], {}
    ranker = build_ranker(cfg.ranker, solver_policy=actors.solver, load_policy=lambda: actors.ranker)
    tool = SearchTool(actors.retrieval, ranker, cfg.ranker)
    sampling = SamplingParams(temperature=cfg.solver.temperature, top_p=cfg.solver.top_p,
                              max_new_tokens=cfg.solver.max_new_tokens, stop=["</search>", "</answer>"], seed=seed)
    episodes = run_episodes(actors.solver, tasks, tool, cfg.solver, sampling=sampling)
    accuracy = score_solver(episodes, cfg.solver)
    return episodes, score_ranker(episodes, cfg.ranker), accuracy


def role_batches(cfg: CoevoConfig, roles: Collection[str], cands: Sequence[Candidate], episodes: Sequence[Episode],
                 groups: Sequence[Sequence[RankerCall]]) -> dict[str, tuple[list[TrainSequence], dict[str, Any]]]:
    """(GRPO batch, its group statistics as `update/<role>/...` keys: `GroupStats.to_metrics`) for each
    trainable role in `roles`.

    With `ranker.share_backbone` there is no separate ranker policy: a trainable ranker's
    calls join the solver's batch (one update of the shared weights) and their statistics
    nest under `solver.ranker`.
    """
    out: dict[str, tuple[list[TrainSequence], dict[str, Any]]] = {}
    if "proposer" in roles:
        batch, stats = proposer_sequences(cands, cfg.proposer.scale_std, cfg.proposer.keep_zero_advantage)
        out["proposer"] = (batch, stats.to_metrics())
    if "solver" in roles:
        batch, stats = solver_sequences(episodes, cfg.solver.scale_std, cfg.solver.keep_zero_advantage)
        info = stats.to_metrics()
        if cfg.ranker.share_backbone and cfg.ranker.mode == "trainable":
            ranker_batch, ranker_stats = ranker_sequences(groups, cfg.ranker.scale_std, cfg.ranker.keep_zero_advantage)
            batch, info = batch + ranker_batch, {**info, "ranker": ranker_stats.to_metrics()}
        out["solver"] = (batch, info)
    if "ranker" in roles:
        batch, stats = ranker_sequences(groups, cfg.ranker.scale_std, cfg.ranker.keep_zero_advantage)
        out["ranker"] = (batch, stats.to_metrics())
    return out


def apply_updates(policies: Mapping[str, Any],
                  batches: Mapping[str, tuple[list[TrainSequence], dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One GRPO update per role; metrics nested as `update/<role>/<key>` (an empty batch is skipped)."""
    out = {}
    for role, (batch, info) in batches.items():
        result = policies[role].update(batch) if batch else {"skipped": True, "n_seqs": 0}
        out[role] = {**result, **info}
    return out
