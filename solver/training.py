"""From finished episodes to GRPO batches: rewards, groups, advantages (docs/method.md §4.2, §4.4, §4.5).

Shared by the co-evolution loop and `python -m coevo.solve`, so both train the solver and
the ranker the same way.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import torch

from coevo.core.config import RankerConfig, SolverConfig
from coevo.core.grpo import GroupStats, group_advantages
from coevo.core.types import TrainSequence
from solver.agent import episode_echo_sources
from solver.grouping import group_task
from solver.reward import correctness, score_ranker_call, solver_rewards


def episodes_by_task(episodes: Sequence[Any]) -> dict[str, list[Any]]:
    """Episodes grouped by task id, preserving first-appearance order."""
    by_task: dict[str, list[Any]] = defaultdict(list)
    for ep in episodes:
        by_task[ep.task_id].append(ep)
    return dict(by_task)


def in_groups(ep: Any) -> bool:
    """Whether an episode joins its task's GRPO groups (solver, and ranker through its calls).

    Every sampled rollout does; a guided one only when its replayed searches showed it the answer
    (`read_answer`): a replay whose results hold no gold would train writing the target without
    evidence, and pay the ranker for an answer its ranking did not show. It is still scored and dumped.
    """
    return not ep.guided or ep.read_answer


def score_solver(episodes: Sequence[Any], cfg: SolverConfig) -> dict[str, float]:
    """Fill `correctness` and `reward` of every episode; return accuracy per task.

    Accuracy p (the proposer's difficulty signal) is the share of sampled rollouts whose answer is
    an exact match: for F1 correctness too, so "solved" keeps one meaning in the dumps. A guided
    rollout (`solver.guided_rollouts`) gets its reward but no say in p: it answers the target by
    construction. With `solver.reward.echo_guard` an echoed answer (`solver.agent.episode_echo_sources`:
    in the question, or in a query written before an observation showed it) counts as wrong in both.
    """
    accuracy = {}
    for task_id, eps in episodes_by_task(episodes).items():
        golds = eps[0].task.answers
        echo_of = [episode_echo_sources(ep) if cfg.reward.echo_guard else [] for ep in eps]
        for ep, echo in zip(eps, echo_of):
            ep.correctness = correctness(ep.answer, golds, cfg.reward.correctness, echo) if ep.format_ok else 0.0
        rewards = solver_rewards([ep.correctness for ep in eps], [ep.n_searches for ep in eps],
                                 [ep.format_ok for ep in eps], cfg.reward.tool_cost, cfg.reward.format_penalty)
        for ep, r in zip(eps, rewards):
            ep.reward = r
        sampled = [(ep, echo) for ep, echo in zip(eps, echo_of) if not ep.guided]
        accuracy[task_id] = sum(correctness(ep.answer, golds, "em", echo) if ep.format_ok else 0.0
                                for ep, echo in sampled) / len(sampled) if sampled else 0.0
    return accuracy


def score_ranker(episodes: Sequence[Any], cfg: RankerConfig) -> list[list[Any]]:
    """Reward every ranker call and form the GRPO groups of trainable calls (docs/method.md §4.4–4.5).

    r_main of a call is the solver correctness of the rollout it belongs to; calls of
    rollouts with a format violation still get a reward (for the dump) but no group.
    """
    groups = []
    for eps in episodes_by_task(episodes).values():
        for ep in eps:
            for call in ep.ranker_calls:
                score_ranker_call(call, ep.correctness, cfg)
        groups += group_task([ep for ep in eps if in_groups(ep)], cfg)
    return groups


def _advantages(rewards: list[float], group_ids: list[int], scale_std: bool) -> tuple[list[float], int]:
    if not rewards:
        return [], 0
    adv, n_zero = group_advantages(torch.tensor(rewards, dtype=torch.float32), group_ids, scale_std=scale_std)
    return adv.tolist(), int(n_zero)


def solver_sequences(episodes: Sequence[Any], scale_std: bool = True,
                     keep_zero: bool = False) -> tuple[list[Any], GroupStats]:
    """One TrainSequence per episode in the groups (`in_groups`), advantages normalized within each task's rollouts;
    its group statistics (one group per task, members: its rollouts in the groups).

    Zero-advantage episodes are left out unless `keep_zero` (`solver.keep_zero_advantage`):
    kept, they count in the token-mean denominator and get the KL term.
    """

    episodes = [ep for ep in episodes if in_groups(ep)]
    tasks = list(episodes_by_task(episodes))
    gid = [tasks.index(ep.task_id) for ep in episodes]
    adv, n_zero = _advantages([ep.reward for ep in episodes], gid, scale_std)
    batch = [TrainSequence(list(ep.token_ids), list(ep.loss_mask), a,
                           list(ep.logprobs) if ep.logprobs is not None else None)
             for ep, a in zip(episodes, adv) if (a != 0.0 or keep_zero) and ep.n_generated > 0]
    return batch, GroupStats(len(tasks), n_zero, len(episodes))


def ranker_sequences(groups: Sequence[Sequence[Any]], scale_std: bool = True,
                     keep_zero: bool = False) -> tuple[list[Any], GroupStats]:
    """One TrainSequence per grouped ranker call (prompt masked out, completion trained); the group
    statistics (members: the grouped calls).

    Zero-advantage calls are left out unless `keep_zero` (`ranker.keep_zero_advantage`).
    """

    calls = [c for g in groups for c in g]
    gid = [i for i, g in enumerate(groups) for _ in g]
    adv, n_zero = _advantages([c.reward for c in calls], gid, scale_std)
    batch = []
    for call, a in zip(calls, adv):
        if a == 0.0 and not keep_zero:
            continue
        old = [0.0] * len(call.prompt_ids) + list(call.logprobs) if call.logprobs is not None else None
        batch.append(TrainSequence(list(call.prompt_ids) + list(call.completion_ids),
                                   [0] * len(call.prompt_ids) + [1] * len(call.completion_ids), a, old))
    return batch, GroupStats(len(groups), n_zero, len(calls))
