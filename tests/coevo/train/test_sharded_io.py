"""Sharded checkpoints (coevo/train/sharded_io.py) written and resumed by 2 gloo ranks, read back in one
process (`Policy.load`, `coevo.eval`'s model loading, the COMPLETE marker), and a collective timeout
(`cluster.collective_timeout_s`) that ends a collective another rank never joins."""
from __future__ import annotations

import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest
import torch

from coevo.train.checkpoint import MARKER, SHARDED_MANIFEST, save_checkpoint, verify_checkpoint
from coevo.train.models import load_model_and_tokenizer
from coevo.train.policy import Policy
from coevo.train.sharded_io import (
    MANIFEST_FORMAT,
    _by_name,
    load_model_weights,
    read_manifest,
    read_optimizer_state,
    trained_names,
)

sys.path.insert(0, str(Path(__file__).parent))  # spawned ranks import their bodies from sharded_ranks.py
import sharded_ranks  # noqa: E402

SPAWN_LIMIT_S = 600  # the two ranks end in well under a minute; a hang fails the test instead of the suite


def _free_ports(n: int) -> tuple[int, ...]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return tuple(s.getsockname()[1] for s in socks)
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def two_ranks(tiny_dir, tmp_path_factory) -> Path:
    """The output directory of one 2-rank run of `sharded_ranks.io_rank_main` (shared by this module's tests)."""
    out = tmp_path_factory.mktemp("sharded_io")
    model, tok = load_model_and_tokenizer(str(tiny_dir))
    single = Policy(sharded_ranks.config(), model, tok, "solver")
    single.update(sharded_ranks.batches()[1])
    single.save(out / "full")  # `Policy.save`'s format, for the ranks to load as an older run's checkpoint
    ctx = torch.multiprocessing.spawn(sharded_ranks.io_rank_main, args=(2, _free_ports(2), str(tiny_dir), str(out)),
                                      nprocs=2, join=False)
    deadline = time.monotonic() + SPAWN_LIMIT_S
    while not ctx.join(timeout=5):  # raises when a rank failed
        if time.monotonic() > deadline:
            for process in ctx.processes:
                process.kill()
            pytest.fail(f"the 2 ranks did not finish within {SPAWN_LIMIT_S} s")
    return out


def _assert_equal_optim(got: dict, want: dict) -> None:
    """Two optimizer states keyed alike (names or indices): same groups, bit-identical tensors."""
    def groups(state: dict) -> list[dict]:  # torch's broadcast load turns AdamW's betas tuple into a list
        return [{**g, "betas": tuple(g["betas"])} for g in state["param_groups"]]

    assert groups(got) == groups(want)
    assert got["state"].keys() == want["state"].keys()
    for key, values in want["state"].items():
        assert got["state"][key].keys() == values.keys(), key
        for name, tensor in values.items():
            assert torch.equal(got["state"][key][name].cpu(), tensor.cpu()), (key, name)


def _assert_equal_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name].cpu(), tensor.cpu()), name


@pytest.mark.slow
def test_two_ranks_save_shards_and_resume_the_same_state(two_ranks) -> None:
    """Every rank wrote its own shard file into one directory, with what a reader needs beside them;
    a fresh 2-rank policy resumed from it holds exactly the saved weights and AdamW state."""
    ckpt = two_ranks / "ckpt"
    names = {p.name for p in ckpt.iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", SHARDED_MANIFEST, "config.json", "tokenizer.json"} <= names
    assert not [p.name for p in two_ranks.iterdir() if p.name.startswith(".tmp-")]  # staged, then renamed
    saved = torch.load(two_ranks / "saved.pt", weights_only=True)
    manifest = read_manifest(ckpt)
    assert manifest["format"] == MANIFEST_FORMAT and manifest["world_size"] == 2
    assert manifest["parameters"] == saved["optim"]["param_groups"][0]["params"]  # optimizer order
    assert all(int(s["step"]) == 2 for s in saved["optim"]["state"].values())  # ppo_epochs=2: two steps taken
    resumed = torch.load(two_ranks / "resumed.pt", weights_only=True)
    _assert_equal_weights(resumed["weights"], saved["weights"])
    _assert_equal_optim(resumed["optim"], saved["optim"])


@pytest.mark.slow
def test_the_ranks_still_resume_policy_saves_format(two_ranks) -> None:
    """A checkpoint of `Policy.save` (HF directory + optimizer.pt by index) loads on 2 ranks exactly."""
    legacy = torch.load(two_ranks / "legacy.pt", weights_only=True)
    _assert_equal_weights(legacy["weights"], load_model_weights(two_ranks / "full"))
    optim = read_optimizer_state(two_ranks / "full", "solver")
    names = legacy["optim"]["param_groups"][0]["params"]
    _assert_equal_optim(legacy["optim"], _by_name(optim, names))
    assert all(int(s["step"]) == 2 for s in legacy["optim"]["state"].values())


@pytest.mark.slow
def test_a_sharded_checkpoint_loads_into_one_process(two_ranks, tiny_dir) -> None:
    """`Policy.load` (a 1-process policy: inspection, eval) and `coevo.eval`'s `<role>.checkpoint` path
    (`load_model_and_tokenizer`) read the shards to the saved weights and optimizer state."""
    ckpt = two_ranks / "ckpt"
    saved = torch.load(two_ranks / "saved.pt", weights_only=True)
    model, tok = load_model_and_tokenizer(str(tiny_dir))
    policy = Policy(sharded_ranks.config(), model, tok, "solver")
    before = policy.model.state_dict()
    assert any(not torch.equal(before[k], v) for k, v in saved["weights"].items())  # the update moved weights
    policy.load(ckpt)
    _assert_equal_weights(policy.model.state_dict(), saved["weights"])
    names = trained_names(policy.model)
    got = policy.optimizer.state_dict()
    _assert_equal_optim({"state": {names[i]: v for i, v in got["state"].items()},
                         "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                          for g in got["param_groups"]]}, saved["optim"])
    evaluated, _ = load_model_and_tokenizer(str(tiny_dir), "bfloat16", str(ckpt))
    assert not evaluated.training and next(evaluated.parameters()).dtype == torch.bfloat16
    _assert_equal_weights(evaluated.state_dict(), {k: v.to(torch.bfloat16) for k, v in saved["weights"].items()})


@pytest.mark.slow
def test_the_complete_marker_covers_every_shard(two_ranks, tmp_path) -> None:
    """A run checkpoint holding a sharded role verifies (its shards stand for optimizer.pt), lists every
    shard with its checksum, and a changed shard fails verification by name."""
    step = save_checkpoint(tmp_path, 0, 0, lambda role, path: shutil.copytree(two_ranks / "ckpt", path), ["solver"])
    assert verify_checkpoint(step) is None
    listed = json.loads((step / MARKER).read_text())["files"]
    assert {"solver/.metadata", "solver/__0_0.distcp", "solver/__1_0.distcp", f"solver/{SHARDED_MANIFEST}"} <= set(
        listed)
    shard = step / "solver" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert verify_checkpoint(step) == "solver/__1_0.distcp does not match its checksum"


@pytest.mark.slow
def test_a_collective_only_one_rank_joins_fails_within_the_timeout(two_ranks) -> None:
    """`join_process_group` with a 3 s timeout (what `cluster.collective_timeout_s` sets): rank 0's
    all_reduce without rank 1 raises after about 3 s instead of waiting forever."""
    outcome = json.loads((two_ranks / "timeout.json").read_text())
    assert outcome["raised"] is not None, outcome
    assert "timed out" in outcome["message"].lower() or "timeout" in outcome["message"].lower(), outcome
    assert 2.5 <= outcome["seconds"] < 30, outcome
