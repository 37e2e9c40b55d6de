"""Shared cache entries: several processes hammering the same entries, killed and failing builders."""
import multiprocessing
import os
import random
import signal
import time
import traceback
import uuid

import pytest

from coevo.core.cache import MARKER, cache_entry, is_complete, lock_path

# fork: the workers are functions of this test module, which a spawned child could not import
# under pytest's importlib import mode.
CTX = multiprocessing.get_context("fork")
BLOB = 64 * 1024


def _write_entry(tmp, token, pause):
    (tmp / "a.txt").write_text(token)
    time.sleep(pause)  # a reader looking now must not see the entry at all
    (tmp / "blob").write_bytes(b"x" * BLOB)
    (tmp / "b.txt").write_text(token)


def _check_entry(entry):
    a, b = (entry / "a.txt").read_text(), (entry / "b.txt").read_text()
    assert a == b, f"{entry}: files of two different builds ({a} / {b})"
    assert (entry / "blob").stat().st_size == BLOB, f"{entry}: half-written blob"


def _guarded(fn, errors, *args):
    try:
        fn(*args)
    except BaseException:
        (errors / f"{os.getpid()}.txt").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def _builder(entries, builds, fail_rate, seed, barrier):
    rng = random.Random(seed)
    barrier.wait(30)  # all builders go through the entries in the same order, at the same time
    for _ in range(2):
        for entry in entries:
            def build(tmp, entry=entry):
                token = f"{os.getpid()}-{uuid.uuid4().hex}"
                _write_entry(tmp, token, rng.uniform(0, 0.004))
                if rng.random() < fail_rate:
                    raise RuntimeError("injected build failure")
                (builds / f"{entry.name}.{token}").touch()
            try:
                cache_entry(entry, build, f"test entry {entry.name}")
            except RuntimeError as e:
                assert "injected" in str(e)
                continue
            assert is_complete(entry)
            _check_entry(entry)


def _reader(entries, stop_file, seen_file):
    seen = 0
    while not stop_file.exists():
        for entry in entries:
            if is_complete(entry):
                _check_entry(entry)
                seen += 1
    seen_file.write_text(str(seen))


def _start(target, errors, *args):
    p = CTX.Process(target=_guarded, args=(target, errors, *args))
    p.start()
    return p


@pytest.mark.parametrize("fail_rate", [0.0, 0.3])
def test_many_processes_hammering_the_same_entries(tmp_path, fail_rate):
    root, builds, errors = tmp_path / "cache", tmp_path / "builds", tmp_path / "errors"
    for d in (root, builds, errors):
        d.mkdir()
    entries = [root / f"entry-{i}" for i in range(40)]
    stop = tmp_path / "stop"
    readers = [_start(_reader, errors, entries, stop, tmp_path / f"seen{i}") for i in range(2)]
    barrier = CTX.Barrier(4)
    builders = [_start(_builder, errors, entries, builds, fail_rate, seed, barrier) for seed in range(4)]
    for p in builders:
        p.join(120)
    stop.touch()
    for p in readers:
        p.join(30)
    problems = "\n".join(f.read_text() for f in errors.iterdir())
    assert not problems and all(p.exitcode == 0 for p in builders + readers), problems
    # Each entry was built exactly once (a failed build leaves nothing and the next one builds).
    per_entry = sorted(f.name.split(".")[0] for f in builds.iterdir())
    assert per_entry == sorted(e.name for e in entries)
    for entry in entries:
        _check_entry(entry)
    # No temp dirs left: only the entries and their lock files.
    assert sorted(p.name for p in root.iterdir()) == sorted([e.name for e in entries] +
                                                            [lock_path(e).name for e in entries])
    assert sum(int((tmp_path / f"seen{i}").read_text()) for i in range(2)) > 0


def _slow_build(entry, started):
    def build(tmp):
        (tmp / "part").write_text("half")
        started.touch()
        time.sleep(60)
    cache_entry(entry, build, "slow entry")


def test_a_killed_builder_blocks_nobody_and_its_leftovers_go(tmp_path):
    entry, started = tmp_path / "cache" / "e", tmp_path / "started"
    p = CTX.Process(target=_slow_build, args=(entry, started))
    p.start()
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists()
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    leftovers = [c.name for c in entry.parent.iterdir() if c.name.startswith(".tmp-")]
    assert len(leftovers) == 1 and not entry.exists()  # the kill left its half-built temp dir

    assert cache_entry(entry, lambda tmp: (tmp / "ok").write_text("1"), "e") is True
    assert (entry / "ok").read_text() == "1" and is_complete(entry)
    assert sorted(c.name for c in entry.parent.iterdir()) == [".e.lock", "e"]


def _hold_then_build(entry, started, release):
    def build(tmp):
        started.touch()
        while not release.exists():
            time.sleep(0.01)
        (tmp / "v").write_text("from the first builder")
    cache_entry(entry, build, "shared entry")


def test_second_builder_waits_with_one_message_and_uses_the_first_ones_entry(tmp_path, capfd):
    entry, started, release = tmp_path / "e", tmp_path / "started", tmp_path / "release"
    p = CTX.Process(target=_hold_then_build, args=(entry, started, release))
    p.start()
    while not started.exists():
        time.sleep(0.01)
    capfd.readouterr()
    releaser = CTX.Process(target=lambda: (time.sleep(0.5), release.touch()))
    releaser.start()

    def never(tmp):
        raise AssertionError("the second caller must not build")

    assert cache_entry(entry, never, "shared entry") is False
    p.join(10)
    releaser.join(10)
    err = capfd.readouterr().err
    assert err.count("coevo: waiting for") == 1
    assert f"waiting for pid {p.pid} on " in err and "building shared entry" in err
    assert (entry / "v").read_text() == "from the first builder"


def test_failed_build_leaves_nothing_and_the_next_call_builds(tmp_path):
    entry = tmp_path / "e"

    def broken(tmp):
        (tmp / "x").write_text("partial")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        cache_entry(entry, broken, "e")
    assert sorted(c.name for c in tmp_path.iterdir()) == [".e.lock"]
    assert cache_entry(entry, lambda tmp: (tmp / "x").write_text("whole"), "e") is True
    assert (entry / "x").read_text() == "whole"
    assert cache_entry(entry, broken, "e") is False  # complete: never rebuilt


def test_entry_without_marker_is_replaced_not_read(tmp_path, capsys):
    entry = tmp_path / "e"
    entry.mkdir()
    (entry / "stale").write_text("from an older coevo")
    assert cache_entry(entry, lambda tmp: (tmp / "fresh").write_text("1"), "e") is True
    assert sorted(c.name for c in entry.iterdir()) == [MARKER, "fresh"]
    assert "is incomplete" in capsys.readouterr().err
    assert sorted(c.name for c in tmp_path.iterdir()) == [".e.lock", "e"]


def test_other_entries_temp_dirs_are_not_touched(tmp_path):
    # `.tmp-e-x-<hex>` belongs to entry "e-x", not to "e": cleaning up "e" must keep it.
    other = tmp_path / f".tmp-e-x-{uuid.uuid4().hex}"
    other.mkdir()
    cache_entry(tmp_path / "e", lambda tmp: None, "e")
    assert other.is_dir()
