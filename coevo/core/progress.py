"""Progress of long first-use builds (model conversion, retrieval index, entity annotation) and of a run.

Builds (`Progress`, `track`): on a terminal, a tqdm bar with count, rate and ETA on stderr;
and one line at start and one each time another 10% is done, through the `coevo.progress`
logger (coevo/core/console.py shows it on the terminal and writes it to run.log; a Ray
worker's goes to the terminal through Ray's forwarding). Where logging is not set up the
lines go to stderr instead, so they are never dropped.

A run's steps (`StepBar`): a tqdm bar of steps with rate and ETA on a terminal, and one line
per step with its headline metrics, step time and ETA (`console.say`: terminal and run.log).
"""
from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext
from typing import IO, Any, Iterable, Iterator, Optional, TypeVar

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from coevo.core.console import say

LOG = logging.getLogger("coevo.progress")
T = TypeVar("T")


def note(text: str, stream: Optional[IO[str]] = None, logger: logging.Logger = LOG) -> None:
    """One line about a build: through `logger` where logging is set up, else on `stream` (stderr)."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(text)
    else:
        tqdm.write(text, file=stream or sys.stderr)


def duration(seconds: float) -> str:
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
        note(text, self.stream, self.logger)

    def line_for(self, done: int, elapsed: float) -> str:
        """The log line after `done` units in `elapsed` seconds (percent, count, rate, elapsed, ETA)."""
        pct = 100 * done // self.total if self.total else 100
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = duration((self.total - done) / rate) if rate > 0 else "?"
        return (f"{self.what}: {pct}% ({done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s, "
                f"elapsed {duration(elapsed)}, ETA {eta})")

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


class StepBar:
    """The run itself: `steps` steps, of which `start` are done (a resumed run); `step()` after each one.

    The bar (tqdm: steps, rate, ETA) shows on a terminal only and is removed at the end
    (`leave=False`), so what stays on screen is one line per step.
    """

    def __init__(self, what: str, steps: int, start: int = 0, stream: Optional[IO[str]] = None) -> None:
        self.steps, self.start = steps, start
        self._t0 = time.perf_counter()
        self.bar = tqdm(total=steps, initial=start, desc=what, unit="step", file=stream or sys.stderr, disable=None,
                        dynamic_ncols=True, leave=False)

    def line_for(self, step: int, headline: str, seconds: float, elapsed: float) -> str:
        """`[step <n>/<steps>] <headline> | <seconds>s | ETA <time>` after `elapsed` seconds of this run's steps."""
        done = step - self.start + 1
        eta = elapsed / done * (self.steps - step - 1) if done > 0 else 0.0
        return f"[step {step + 1}/{self.steps}] {headline} | {seconds:.1f}s | ETA {duration(eta)}"

    def step(self, step: int, headline: str, seconds: float) -> None:
        """Step `step` (from 0) is done and took `seconds`: its line, and the bar moves on."""
        say(self.line_for(step, headline, seconds, time.perf_counter() - self._t0))
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "StepBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
