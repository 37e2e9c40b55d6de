"""The one `mean` of run metrics, solve metrics, evaluation, run inspection and benches."""
from __future__ import annotations

import statistics
from typing import Iterable, Optional


def mean(values: Iterable[float]) -> Optional[float]:
    """Arithmetic mean, or None when there is nothing to average (absent, not 0).

    `statistics.mean` sums exactly, so the result is correctly rounded and does not depend
    on the order the values were gathered in; like it, all-int input with a whole mean gives
    an int. Callers that report fewer digits round at the call site.
    """
    values = list(values)
    return statistics.mean(values) if values else None
