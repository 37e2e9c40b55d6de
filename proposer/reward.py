"""Proposer reward: intermediate difficulty with a penalty for invalid tasks (docs/method.md §3.5)."""
from __future__ import annotations

from typing import Optional

from coevo.core.choices import ProposerReward

# Checks a candidate can pass before it is a task: target parse, target validation, evidence
# path, question parse, question form, question content. `stages_passed` of a rejected candidate
# is 0 … 5. Form and content are two stages because with one, "your question?" (too short) earned
# what a real question rejected for its content earned, and a proposer learned to write it
# (docs/learning.md, run 13).
N_STAGES = 6


def difficulty_reward(accuracy: float, kind: str = "abs") -> float:
    """Reward of an accepted task solved with accuracy p.

    'abs' 1-|2p-1| and 'quadratic' 4p(1-p) peak at 1 for p = 0.5 and are 0 when every rollout
    is right or every rollout is wrong; 'adversarial' 1-p is monotonic (1 for a task no rollout
    solves), ZEST's comparison for the intermediate-difficulty reward.
    """
    p = min(max(float(accuracy), 0.0), 1.0)
    if kind == "abs":
        return 1.0 - abs(2.0 * p - 1.0)
    if kind == "quadratic":
        return 4.0 * p * (1.0 - p)
    if kind == "adversarial":
        return 1.0 - p
    raise ValueError(f"proposer.reward={kind!r} is not valid; expected one of {[str(k) for k in ProposerReward]}")


def invalid_reward(invalid_penalty: float = 0.5, stages_passed: int = 0, by_stage: bool = False) -> float:
    """Reward of a rejected candidate: −penalty, or with `by_stage` −penalty·(6 − k)/6, k = stages passed.

    Graded, an unparsable target earns −penalty and a candidate whose question failed the content
    checks −penalty/6: a group whose candidates all fail at different stages still has reward
    variance, so the proposer can learn to get further (a valid target first) before any task
    is accepted. Every graded value stays below 0, the least an accepted task earns.
    """
    if not by_stage:
        return -float(invalid_penalty)
    k = min(max(int(stages_passed), 0), N_STAGES - 1)
    return -float(invalid_penalty) * (N_STAGES - k) / N_STAGES


def proposer_reward(accuracy: Optional[float], invalid_penalty: float = 0.5, kind: str = "abs",
                    stages_passed: int = 0, by_stage: bool = False) -> float:
    """Reward of one proposed candidate: the invalid reward when validation rejected it (accuracy None)."""
    if accuracy is None:
        return invalid_reward(invalid_penalty, stages_passed, by_stage)
    return difficulty_reward(accuracy, kind)
