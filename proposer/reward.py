"""Proposer reward: intermediate difficulty with a penalty for invalid tasks (SPEC §3.5)."""
from __future__ import annotations

from typing import Optional


def difficulty_reward(accuracy: float, kind: str = "abs") -> float:
    """Reward of an accepted task solved with accuracy p: 1-|2p-1| ('abs') or 4p(1-p) ('quadratic').

    Both peak at 1 for p = 0.5 and are 0 when every rollout is right or every rollout is wrong.
    """
    p = min(max(float(accuracy), 0.0), 1.0)
    if kind == "abs":
        return 1.0 - abs(2.0 * p - 1.0)
    if kind == "quadratic":
        return 4.0 * p * (1.0 - p)
    raise ValueError(f"proposer.reward={kind!r} is not valid; expected one of ['abs', 'quadratic']")


def proposer_reward(accuracy: Optional[float], invalid_penalty: float = 0.5, kind: str = "abs") -> float:
    """Reward of one proposed candidate: −penalty when validation rejected it (accuracy None)."""
    if accuracy is None:
        return -float(invalid_penalty)
    return difficulty_reward(accuracy, kind)
