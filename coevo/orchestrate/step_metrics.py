"""The solver and ranker figures of one batch of episodes: one builder, so a key means one thing in every command.

`rollout_figures(episodes, groups, top_k)` gives the `solver`, `reward` and `ranker` blocks of a
metrics line; `coevo.run` (records.py `step_metrics`) and `coevo.solve` (solve_loop.py
`rollout_metrics`) both write them as they come and add only their own keys beside them.
`coevo.eval` scores prediction records, not episodes, and shares `hit_rates` for its `hit@k`.

Each key and the population it is computed over, stated here once:

- Sampled rollouts: the episodes the policy wrote. Guided replays (`solver.guided_rollouts`)
  answer the gold by construction, so they are counted apart and nowhere else among the solver's
  figures. `solver/format_valid` (share ending in a well-formed answer); `solver/em`, `solver/f1`
  (the answer against the task's golds, 0 without a well-formed answer; EM and F1 whatever
  correctness the reward uses); `solver/em_no_echo` (EM with an echoed answer counted wrong,
  whether or not `solver.reward.echo_guard` is on); `solver/mean_searches` (valid searches);
  `solver/end_reasons` ({reason: count}); `solver/echo_rate`, `solver/answer_in_observation`
  (`answer_rates`); `reward/solver` (mean reward).
- Every episode: `solver/gen_tokens` (tokens the solver generated, guided replays' included: what
  the engine spent); `solver/guided` (guided replays) and `solver/guided_read` (those whose searches
  showed a gold answer: the ones that train).
- Every ranker call of every episode (guided replays' too: the ranker ranks them alike):
  `ranker/calls`; `ranker/i_ans` (share with a pseudo-relevant candidate, per `ranker.relevance`).
- Calls with a pseudo-relevant candidate (`i_ans`), where a ranking can hit at all:
  `ranker/hit@k` for k in `hit_cutoffs(ranker.top_k)` (share whose first k returned documents hold a
  relevant one), `ranker/r_rel` (mean relevance reward: the mean of those hit@k).
- Calls the ranker policy wrote (`generated`; none in ranker modes none and oracle): `ranker/generated`
  (count); `ranker/format_valid` (share well-formed); `ranker/gen_tokens`; `ranker/grouped_share`
  (share in a GRPO group); `reward/ranker` (mean reward).
- The ranker's GRPO groups: `ranker/groups` (count), `ranker/group_sizes` ({size: count}),
  `ranker/group_size` (mean size).

A figure with nothing to count is None (absent, not 0). Means are `coevo.core.stats.mean`, unrounded.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from coevo.core.scoring import echoes, exact_match, f1
from coevo.core.stats import mean
from solver.agent import Episode, episode_echo_sources
from solver.ranker import RankerCall
from solver.reward import hit_at_k, hit_cutoffs, relevance_reward


def _rate(n: int, d: int) -> Optional[float]:
    return n / d if d else None


def _echoed(ep: Episode) -> bool:
    return ep.answer is not None and echoes(ep.answer, episode_echo_sources(ep))


def answer_rates(episodes: Sequence[Episode]) -> dict[str, Optional[float]]:
    """`echo_rate`: share of well-formed answers that repeat the question or a query the rollout wrote
    before an observation showed that answer (`solver.agent.episode_echo_sources`, the reward's rule; measured
    whether or not `solver.reward.echo_guard` is on);
    `answer_in_observation`: share of rollouts shown a passage holding a gold answer (`read_answer`),
    the ceiling of their accuracy. The caller passes the population (the sampled rollouts)."""
    answered = [ep for ep in episodes if ep.format_ok and ep.answer is not None]
    echoed = sum(1 for ep in answered if _echoed(ep))
    seen = sum(1 for ep in episodes if ep.read_answer)
    return {"echo_rate": _rate(echoed, len(answered)), "answer_in_observation": _rate(seen, len(episodes))}


def hit_rates(rankings: Sequence[Sequence[bool]], top_k: int) -> dict[str, Optional[float]]:
    """`hit@k` for k in `hit_cutoffs(top_k)`: share of `rankings` (relevance of the returned documents,
    in returned order) with a relevant document among the first k. The caller passes the rankings of
    the calls that had a relevant candidate; None for each k when there is none."""
    return {f"hit@{k}": mean([hit_at_k(r, k) for r in rankings]) for k in hit_cutoffs(top_k)}


def solver_figures(episodes: Sequence[Episode]) -> dict[str, Any]:
    """The `solver` block (keys and populations: the module docstring)."""
    sampled = [ep for ep in episodes if not ep.guided]
    answers = [(ep.answer if ep.format_ok and ep.answer else "", ep.task.answers) for ep in sampled]
    return {"format_valid": mean([float(ep.format_ok) for ep in sampled]),
            "em": mean([exact_match(a, g) if a else 0.0 for a, g in answers]),
            "em_no_echo": mean([exact_match(a, g) if a and not _echoed(ep) else 0.0
                                for ep, (a, g) in zip(sampled, answers)]),
            "f1": mean([f1(a, g) if a else 0.0 for a, g in answers]),
            "mean_searches": mean([float(ep.n_searches) for ep in sampled]),
            "gen_tokens": sum(ep.n_generated for ep in episodes),
            "end_reasons": dict(sorted(Counter(ep.end_reason for ep in sampled).items())),
            "guided": len(episodes) - len(sampled),
            "guided_read": sum(1 for ep in episodes if ep.guided and ep.read_answer),
            **answer_rates(sampled)}


def ranker_figures(episodes: Sequence[Episode], groups: Sequence[Sequence[RankerCall]],
                   top_k: int) -> dict[str, Any]:
    """The `ranker` block (keys and populations: the module docstring); `top_k` is `ranker.top_k`."""
    calls = [c for ep in episodes for c in ep.ranker_calls]
    generated = [c for c in calls if c.generated]
    rankings = [c.ranked_relevant() for c in calls if c.i_ans]
    return {"calls": len(calls), "generated": len(generated),
            "format_valid": mean([float(c.format_ok) for c in generated]),
            "i_ans": mean([float(c.i_ans) for c in calls]),
            **hit_rates(rankings, top_k),
            "r_rel": mean([relevance_reward(r, top_k) for r in rankings]),
            "gen_tokens": sum(len(c.completion_ids) for c in generated),
            "groups": len(groups),
            "group_sizes": dict(sorted(Counter(len(g) for g in groups).items())),
            "grouped_share": mean([float(c.group_id is not None) for c in generated]),
            "group_size": mean([float(len(g)) for g in groups])}


def rollout_figures(episodes: Sequence[Episode], groups: Sequence[Sequence[RankerCall]],
                    top_k: int) -> dict[str, dict[str, Any]]:
    """`solver`, `reward` (`solver`, `ranker`) and `ranker` blocks of scored episodes (rewards filled by
    `solver.training.score_solver` / `score_ranker`); `groups`: the ranker's GRPO groups."""
    sampled = [ep for ep in episodes if not ep.guided]
    generated = [c for ep in episodes for c in ep.ranker_calls if c.generated]
    return {"solver": solver_figures(episodes),
            "reward": {"solver": mean([ep.reward for ep in sampled]),
                       "ranker": mean([c.reward for c in generated if c.reward is not None])},
            "ranker": ranker_figures(episodes, groups, top_k)}
