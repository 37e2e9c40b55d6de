"""Semantic grouping of ranker calls into GRPO groups (docs/method.md §4.4).

For one original question q0: collect the ranker calls of its G rollouts in order of
appearance (rollout order, then turn order), drop calls of rollouts with f = 0, split by
I_ans, and cluster each split greedily: a call joins the FIRST group whose representative
(founding) sub-query has token F1 ≥ δ with its own sub-query, otherwise it founds a new
group. Groups smaller than k_min are dropped. No extra rollouts are made.

Only calls the ranker policy actually generated can be trained, so calls without a
completion (modes none/oracle, searches with no candidates) are never grouped.

`by_question` ablation: all kept calls of q0 form one group, with the same k_min rule —
a group of fewer than k_min samples gives a near-meaningless normalized advantage in
either mode, and keeping the rule makes the two modes differ only in how they group.

Group ids are strings `<task id>/ans<I_ans>/<n>` (semantic) or `<task id>/all`
(by_question), unique across tasks without a global counter; they are written into
`RankerCall.group_id` of every kept call (dropped calls keep None).
"""
from __future__ import annotations

from typing import Any, Sequence

from coevo.core.scoring import token_f1
from solver.ranker import RankerCall

GROUPINGS = ("semantic", "by_question")


def cluster_calls(calls: Sequence[RankerCall], delta: float) -> list[list[RankerCall]]:
    """Greedy clustering in the given order against each group's representative (first) call."""
    groups: list[list[RankerCall]] = []
    for call in calls:
        for group in groups:
            if token_f1(group[0].sub_query, call.sub_query) >= delta:
                group.append(call)
                break
        else:
            groups.append([call])
    return groups


def task_calls(episodes: Sequence[Any]) -> list[RankerCall]:
    """Trainable ranker calls of one task's rollouts with f = 1, rollout order then turn order."""
    ordered = sorted(episodes, key=lambda ep: ep.rollout_idx)
    return [call for ep in ordered if ep.format_ok for call in ep.ranker_calls if call.generated]


def group_calls(calls: Sequence[RankerCall], task_id: str, grouping: str = "semantic",
                delta: float = 0.8, min_group_size: int = 3) -> list[list[RankerCall]]:
    """GRPO groups of one task's (already f-filtered, ordered) calls; assigns `group_id`."""
    if grouping not in GROUPINGS:
        raise ValueError(f"ranker.grouping {grouping!r} is not valid; expected one of {list(GROUPINGS)}")
    if grouping == "by_question":
        named = [(f"{task_id}/all", list(calls))] if calls else []
    else:
        named = []
        for i_ans in (True, False):
            split = [c for c in calls if c.i_ans == i_ans]
            named += [(f"{task_id}/ans{int(i_ans)}/{n}", g) for n, g in enumerate(cluster_calls(split, delta))]
    kept = []
    for group_id, group in named:
        if len(group) >= min_group_size:
            for call in group:
                call.group_id = group_id
            kept.append(group)
    return kept


def group_task(episodes: Sequence[Any], cfg: Any) -> list[list[RankerCall]]:
    """docs/method.md §4.4 for the G rollouts of one task, with `cfg` a RankerConfig."""
    if not episodes:
        return []
    return group_calls(task_calls(episodes), episodes[0].task_id, cfg.grouping, cfg.group_f1, cfg.min_group_size)
