"""Progress of long first-use builds (model conversion, retrieval index, entity annotation).

On a terminal: a tqdm bar with count, rate and ETA on stderr. In logs: one line at start and
one each time another 10% is done, through the `coevo.progress` logger. Where logging is not
set up to show INFO lines (the eval entry point, a Ray worker) the lines go to stderr
instead, so they are never dropped: a log file or Ray's forwarded worker output gets them.
"""
from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext
from typing import IO, Any, Iterable, Iterator, Optional, TypeVar

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

LOG = logging.getLogger("coevo.progress")
T = TypeVar("T")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Count `total` units of one build; use as a context manager and call `update(n)`.

    The bar shows only where `stream` is a terminal (tqdm's own check), so redirected output
    is not filled with carriage-return frames; the 10% lines are written either way.
    """

    def __init__(self, what: str, total: int, unit: str = "it", stream: Optional[IO[str]] = None,
                 logger: logging.Logger = LOG) -> None:
        self.what, self.total, self.unit = what, max(0, int(total)), unit
        self.stream = stream or sys.stderr
        self.logger = logger
        self.done = 0
        self._tenths = 0
        self._t0 = time.perf_counter()
        self.bar = tqdm(total=self.total, desc=what, unit=unit, file=self.stream, disable=None,
                        dynamic_ncols=True, mininterval=0.5)
        # Log lines printed while the bar is drawn go above it, not into it.
        self._redirect: Optional[Any] = logging_redirect_tqdm() if not self.bar.disable else nullcontext()
        self._redirect.__enter__()
        self._line(f"{what}: started, {self.total} {unit}")

    def _line(self, text: str) -> None:
        if self.logger.isEnabledFor(logging.INFO) and self.logger.hasHandlers():
            self.logger.info(text)
        else:
            tqdm.write(text, file=self.stream)

    def line_for(self, done: int, elapsed: float) -> str:
        """The log line after `done` units in `elapsed` seconds (percent, count, rate, elapsed, ETA)."""
        pct = 100 * done // self.total if self.total else 100
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = _duration((self.total - done) / rate) if rate > 0 else "?"
        return (f"{self.what}: {pct}% ({done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s, "
                f"elapsed {_duration(elapsed)}, ETA {eta})")

    def update(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)
        tenths = 10 * self.done // self.total if self.total else 10
        if tenths > self._tenths:  # one line however many tenths one update crosses
            self._tenths = tenths
            self._line(self.line_for(self.done, time.perf_counter() - self._t0))

    def close(self) -> None:
        """Close the bar (and stop redirecting log lines); a second call does nothing."""
        if self._redirect is not None:
            self.bar.close()
            self._redirect.__exit__(None, None, None)
            self._redirect = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            self._line(f"{self.what}: stopped at {self.done}/{self.total} {self.unit} ({exc[0].__name__})")
        self.close()


def track(items: Iterable[T], what: str, total: int, unit: str = "it", stream: Optional[IO[str]] = None) -> Iterator[T]:
    """Yield `items`, counting each one in a `Progress` (closed when the iteration ends or stops)."""
    with Progress(what, total, unit, stream) as progress:
        for item in items:
            yield item
            progress.update()
