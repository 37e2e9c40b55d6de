"""Ctrl-C and SIGTERM stop a run cleanly (`stop_on_signals`): the signal raises `Stopped` in the
main thread, which unwinds the run (temp files of writes in progress are deleted), except
inside an `uninterrupted` block (a step's outputs and checkpoint), which completes first. A
second signal ends the process at once; either way the reaper (coevo/core/lifetime.py) stops
every process the run started.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived: unwinds the run like KeyboardInterrupt (`except Exception` lets it pass)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for "ended by signal n"


_stopping = False  # inside `stop_on_signals`
_critical = 0  # depth of nested `uninterrupted` blocks
_pending: Optional[int] = None  # a signal that arrived inside one


def _on_stop_signal(signum: int, frame: object) -> None:
    global _pending
    for sig in STOP_SIGNALS:  # a second signal ends the process at once; the reaper still stops its children
        signal.signal(sig, signal.SIG_DFL)
    if _critical:
        _pending = signum
        os.write(2, f"coevo: {signal.Signals(signum).name} received; stopping once the write in progress is "
                    "complete (send it again to stop at once)\n".encode())
        return
    raise Stopped(signum)


def install_stop_handlers() -> None:
    """Inside `stop_on_signals`, (re)install its handlers: call it after a library replaced them
    (`ray.init` installs a SIGTERM handler that aborts the process)."""
    if _stopping and threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _on_stop_signal)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM raise `Stopped` in the main thread, at once or, inside an
    `uninterrupted` block, when it ends. Unwinding runs every `finally` and `except BaseException`
    (atomic writes delete their temp files); the reaper then stops what the run started."""
    global _stopping, _pending
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    _stopping, _pending = True, None
    install_stop_handlers()
    try:
        yield
    finally:
        _stopping = False
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """A stop signal that arrives inside the block takes effect when the block ends, so that
    what the block writes (a step's dump, metrics line and checkpoint) is written whole."""
    global _critical, _pending
    _critical += 1
    try:
        yield
    finally:
        _critical -= 1
    if _critical == 0 and _pending is not None:
        signum, _pending = _pending, None
        raise Stopped(signum)

