"""children_pin_mmap_threshold: what processes started inside (and outside) the block see."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from coevo.train.allocator import MMAP_THRESHOLD, MMAP_THRESHOLD_ENV, children_pin_mmap_threshold

READ = [sys.executable, "-c", f"import os; print(os.environ.get({MMAP_THRESHOLD_ENV!r}, '-'))"]


def _child_sees() -> str:
    return subprocess.run(READ, capture_output=True, text=True, check=True).stdout.strip()


def test_children_started_inside_get_the_threshold_and_later_ones_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MMAP_THRESHOLD_ENV, raising=False)
    with children_pin_mmap_threshold() as value:
        assert value == str(MMAP_THRESHOLD) == _child_sees()
    assert MMAP_THRESHOLD_ENV not in os.environ and _child_sees() == "-"


def test_a_value_the_user_exported_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MMAP_THRESHOLD_ENV, "1048576")
    with children_pin_mmap_threshold(4096) as value:
        assert value == "1048576" == _child_sees()
    assert os.environ[MMAP_THRESHOLD_ENV] == "1048576"


def test_the_variable_is_removed_when_the_block_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MMAP_THRESHOLD_ENV, raising=False)
    with pytest.raises(RuntimeError), children_pin_mmap_threshold():
        raise RuntimeError("engine failed to start")
    assert MMAP_THRESHOLD_ENV not in os.environ
