"""Run outputs: atomic dumps, metrics truncation on resume, checkpoints, reference questions."""
import random

import numpy as np
import pytest
import torch

from coevo.core.io import atomic_dir
from coevo.orchestrate.loop import step_seed
from coevo.orchestrate.outputs import (
    MetricsLog,
    drop_dumps_after,
    read_jsonl,
    write_task_dump,
)
from coevo.run import next_references
from coevo.train.checkpoint import (
    latest_checkpoint,
    prune_checkpoints,
    read_state,
    restore_rng,
    rng_state,
    save_checkpoint,
)


def test_task_dump_atomic_and_readable(tmp_path):
    path = write_task_dump(tmp_path, 3, [{"a": 1}, {"b": "ü"}])
    assert read_jsonl(path) == [{"a": 1}, {"b": "ü"}]
    assert not [p for p in (tmp_path / "tasks").iterdir() if p.name.startswith(".")]


def test_torn_last_line_skipped_but_middle_corruption_is_an_error(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 0}\n{"step": 1, "x"')
    assert read_jsonl(p) == [{"step": 0}]
    p.write_text('{"step": 0}\n{bad\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2"):
        read_jsonl(p)


def test_metrics_log_and_truncate(tmp_path):
    log = MetricsLog(tmp_path, logger="none")
    for s in range(4):
        log.log(s, {"reward": {"solver": s * 0.5}, "nan": float("nan")})
    log.truncate_after(1)
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and rows[0]["nan"] is None


def test_drop_dumps_after(tmp_path):
    for s in range(3):
        write_task_dump(tmp_path, s, [{"s": s}])
    drop_dumps_after(tmp_path, 0)
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["step_0.jsonl"]


def test_checkpoint_roundtrip_and_latest(tmp_path):
    def save(role, path):
        path.mkdir(parents=True)
        (path / "w.txt").write_text(role)

    random.seed(1)
    save_checkpoint(tmp_path, 0, 4, save, ["solver"])
    state_before = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    save_checkpoint(tmp_path, 1, 8, save, ["proposer", "solver"])
    # A crashed save leaves only a temp dir and a marker-less dir: neither counts.
    (tmp_path / "checkpoints" / ".tmp-step_2-xyz").mkdir()
    (tmp_path / "checkpoints" / "step_3").mkdir()
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step_1" and (latest / "proposer" / "w.txt").read_text() == "proposer"
    state = read_state(latest)
    assert state["cursor"] == 8 and state["roles"] == ["proposer", "solver"]
    restore_rng(state_before)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_failed_checkpoint_write_leaves_previous_intact(tmp_path):
    save_checkpoint(tmp_path, 0, 1, lambda r, p: p.mkdir(), ["solver"])

    def boom(role, path):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_checkpoint(tmp_path, 1, 2, boom, ["solver"])
    assert latest_checkpoint(tmp_path).name == "step_0"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_0"]


def test_prune_keeps_newest(tmp_path):
    for s in range(4):
        save_checkpoint(tmp_path, s, s, lambda r, p: p.mkdir(), ["solver"])
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_3"]


def test_atomic_dir_replaces_existing(tmp_path):
    target = tmp_path / "d"
    with atomic_dir(target) as t:
        (t / "a").write_text("1")
    with atomic_dir(target) as t:
        (t / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]


def test_cursor_cycles_and_seeds_differ():
    refs, cursor = next_references(["a", "b", "c"], 2, 3)
    assert refs == [(2, "c"), (0, "a"), (1, "b")] and cursor == 5
    assert step_seed(0, 1) != step_seed(0, 2) and step_seed(0, 1) == step_seed(0, 1)
