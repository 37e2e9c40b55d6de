"""The one `mean` of run metrics, solve metrics, evaluation, run inspection and benches, and the one
classification of solver groups by correctness (the papers' mixed / all-correct / all-wrong shares)."""
from __future__ import annotations

import statistics
from typing import Iterable, Optional, Sequence


def mean(values: Iterable[float]) -> Optional[float]:
    """Arithmetic mean, or None when there is nothing to average (absent, not 0).

    `statistics.mean` sums exactly, so the result is correctly rounded and does not depend
    on the order the values were gathered in; like it, all-int input with a whole mean gives
    an int. Callers that report fewer digits round at the call site.
    """
    values = list(values)
    return statistics.mean(values) if values else None


def correctness_shares(groups: Sequence[Sequence[float]]) -> dict[str, Optional[float]]:
    """Shares of groups (one task's rollout correctness values) that are mixed, all >= 1 (all
    correct) or all <= 0 (all wrong); `n` counts the non-empty groups, a share is None when n = 0.
    A group without variance teaches the solver nothing (ZEST's analysis of the difficulty reward)."""
    groups = [g for g in groups if len(g)]
    n = len(groups)
    correct = sum(1 for g in groups if min(g) >= 1)
    wrong = sum(1 for g in groups if max(g) <= 0)
    share = (lambda k: k / n if n else None)  # noqa: E731
    return {"n": n, "mixed": share(n - correct - wrong), "all_correct": share(correct), "all_wrong": share(wrong)}
