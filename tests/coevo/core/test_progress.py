"""Progress of first-use builds (a line per 10% in logs, a bar with rate and ETA on a terminal) and of a run's steps."""
import io
import logging
import time

import pytest

from coevo.core import progress as progress_mod
from coevo.core.progress import Progress, StepBar, track


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    """perf_counter stand-in: each call returns the next second."""

    def __init__(self):
        self.t = -1.0

    def __call__(self):
        self.t += 1.0
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(progress_mod.time, "perf_counter", c)
    return c


def test_a_line_per_tenth_in_the_log(caplog, clock):
    caplog.set_level(logging.INFO, logger="coevo.progress")
    stream = io.StringIO()  # not a terminal: no bar
    with Progress("index of toy", 20, "passages", stream=stream) as p:
        for _ in range(20):
            p.update()
    lines = [r.getMessage() for r in caplog.records if r.name == "coevo.progress"]
    assert lines[0] == "index of toy: started, 20 passages"
    assert [line.split(": ")[1].split(" ")[0] for line in lines[1:]] == [f"{10 * i}%" for i in range(1, 11)]
    # The clock ticks once at the start and once per line: the 10% line comes at t=1 after
    # 2 passages (2.0/s, 18 left -> 9 s), the last at t=10 after 20.
    assert lines[1] == "index of toy: 10% (2/20 passages, 2.0 passages/s, elapsed 1s, ETA 9s)"
    assert lines[-1] == "index of toy: 100% (20/20 passages, 2.0 passages/s, elapsed 10s, ETA 0s)"
    assert stream.getvalue() == ""  # the log got the lines; no bar on a non-terminal


def test_one_line_per_update_however_many_tenths_it_crosses(caplog, clock):
    caplog.set_level(logging.INFO, logger="coevo.progress")
    with Progress("conversion", 100, "%", stream=io.StringIO()) as p:
        for share in (17, 64, 14, 5):
            p.update(share)
    pcts = [r.getMessage().split(": ")[1].split(" ")[0] for r in caplog.records][1:]
    assert pcts == ["17%", "81%", "95%", "100%"]


def test_without_logging_set_up_the_lines_go_to_the_stream(clock):
    logger = logging.getLogger("coevo.progress.test.unconfigured")
    logger.propagate = False  # no handler anywhere up the chain
    stream = io.StringIO()
    with Progress("annotation", 3, "passages", stream=stream, logger=logger) as p:
        for _ in range(3):
            p.update()
    assert stream.getvalue().splitlines() == [
        "annotation: started, 3 passages",
        "annotation: 33% (1/3 passages, 1.0 passages/s, elapsed 1s, ETA 2s)",
        "annotation: 66% (2/3 passages, 1.0 passages/s, elapsed 2s, ETA 1s)",
        "annotation: 100% (3/3 passages, 1.0 passages/s, elapsed 3s, ETA 0s)",
    ]


def test_terminal_gets_a_bar_with_rate_and_eta():
    stream = Terminal()
    logger = logging.getLogger("coevo.progress.test.tty")
    logger.propagate = False
    items = list(track(range(50), "encoding", 50, "passages", stream=stream))
    assert items == list(range(50))
    out = stream.getvalue()
    assert "\r" in out and "encoding" in out and "50/50" in out
    assert "passages/s" in out and "<" in out  # rate and [elapsed<remaining]


def test_a_failed_build_says_where_it_stopped(caplog):
    caplog.set_level(logging.INFO, logger="coevo.progress")
    with pytest.raises(KeyboardInterrupt):
        with Progress("index", 10, "passages", stream=io.StringIO()) as p:
            p.update(3)
            raise KeyboardInterrupt
    assert caplog.records[-1].getMessage() == "index: stopped at 3/10 passages (KeyboardInterrupt)"


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (3600, "1h00m"), (7322, "2h02m")])
def test_durations(seconds, text):
    assert progress_mod.duration(seconds) == text


def test_step_line_has_the_headline_step_time_and_eta():
    bar = StepBar("coevo.run", 4, start=1, stream=io.StringIO())
    # Resumed at step 1: after step 2 (the 2nd step of this run) and 10 s, 1 step is left at 5 s a step.
    assert bar.line_for(2, "accepted 1/4", 4.25, 10.0) == "[step 3/4] accepted 1/4 | 4.2s | ETA 5s"
    assert bar.line_for(3, "h", 0.0, 12.0) == "[step 4/4] h | 0.0s | ETA 0s"
    bar.close()


def test_steps_print_one_line_each_and_no_bar_off_a_terminal(capsys, clock):
    stream = io.StringIO()
    with StepBar("coevo.run", 2, stream=stream) as bar:  # clock: t0 = 0, then 1 and 2 at the two steps
        bar.step(0, "a", 1.0)
        bar.step(1, "b", 1.0)
    assert capsys.readouterr().out.splitlines() == ["[step 1/2] a | 1.0s | ETA 1s", "[step 2/2] b | 1.0s | ETA 0s"]
    assert stream.getvalue() == ""


def test_a_terminal_gets_a_step_bar_with_rate_and_eta(capsys):
    stream = Terminal()
    with StepBar("coevo.run", 3, stream=stream) as bar:
        for step in range(3):
            time.sleep(0.15)  # past tqdm's 0.1 s redraw interval: each step redraws the bar
            bar.step(step, "x", 0.15)
    assert len(capsys.readouterr().out.splitlines()) == 3
    out = stream.getvalue()
    assert "coevo.run" in out and "2/3" in out and "step/s" in out and "<00:00" in out  # rate and ETA
    assert out.endswith("\r")  # leave=False: the bar is wiped at the end, the step lines stay
