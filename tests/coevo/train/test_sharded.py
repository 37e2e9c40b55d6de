"""Sharded updates (coevo/train/sharded.py): the token split by hand, and 2 gloo ranks with FSDP2
on the CPU against one process's `Policy.update` on the same batches."""
from __future__ import annotations

import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from coevo.core.config import PolicyConfig
from coevo.core.role_config import LoraConfig
from coevo.train.sharded import check_shardable, split_by_tokens
from coevo.train.sharded_io import _by_index, _by_name, load_model_weights, read_optimizer_state

sys.path.insert(0, str(Path(__file__).parent))  # spawned ranks import their bodies from sharded_ranks.py
import sharded_ranks  # noqa: E402


@pytest.mark.parametrize("counts, world, expected", [
    ([5, 3, 3, 1], 2, [[0, 3], [1, 2]]),  # 5 -> r0; 3 -> r1; 3 -> r1 (3 < 5); 1 -> r0 (5 < 6)
    ([2, 2, 2, 2], 2, [[0, 2], [1, 3]]),  # ties: fewer tokens, then fewer sequences, then lower rank
    ([6, 3, 8, 2, 5], 2, [[1, 2, 3], [0, 4]]),  # 8 r0; 6 r1; 5 r1 (11); 3 r0 (11); 2: tie, tie, r0
    ([4], 2, [[0], []]),  # one sequence: the other rank gets none
    ([0, 0, 7], 3, [[2], [0], [1]]),
    ([], 2, [[], []]),
])
def test_split_by_tokens_by_hand(counts, world, expected) -> None:
    assert split_by_tokens(counts, world) == expected


def test_split_keeps_every_sequence_once_and_rejects_no_ranks() -> None:
    counts = [9, 1, 4, 4, 7, 2, 2, 0]
    parts = split_by_tokens(counts, 3)
    assert sorted(i for p in parts for i in p) == list(range(len(counts)))
    # 9 r0; 7 r1; 4 r2; 4 r2 (4 < 7); 2 r1 (7 < 8); 2 r2 (8 < 9); 1 r0 (9 = 9, fewer seqs); 0 r1 (9 < 10)
    assert parts == [[0, 1], [4, 5, 7], [2, 3, 6]]
    assert [sum(counts[i] for i in p) for p in parts] == [10, 9, 10]
    with pytest.raises(ValueError, match="world=0"):
        split_by_tokens(counts, 0)


def test_lora_and_frozen_roles_are_refused_naming_the_key() -> None:
    base = dict(preset="test", model="unused", num_gpus=0)
    with pytest.raises(ValueError, match=r"solver.lora.rank=8 .*expected solver.lora.rank=0"):
        check_shardable(PolicyConfig(**base, lora=LoraConfig(rank=8)), "solver")
    with pytest.raises(ValueError, match=r"ranker.frozen=true .*expected ranker.num_gpus <= 1"):
        check_shardable(PolicyConfig(**base, frozen=True), "ranker")


def test_optimizer_state_keys_round_trip_between_names_and_indices() -> None:
    names = ["a.weight", "b.weight"]
    by_name = {"state": {"b.weight": {"step": 1}, "a.weight": {"step": 2}},
               "param_groups": [{"lr": 0.1, "params": ["a.weight", "b.weight"]}]}
    by_index = _by_index(by_name, names)
    assert by_index == {"state": {1: {"step": 1}, 0: {"step": 2}}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}
    assert _by_name(by_index, names) == by_name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    """Either checkpoint format: a sharded role saves its shards, a 1-process `Policy` an HF directory."""
    return load_model_weights(directory)


def _assert_same_checkpoint(got: Path, want: Path, atol: float) -> None:
    a, b = _weights(got), _weights(want)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == torch.float32 and torch.allclose(a[k], b[k], rtol=0, atol=atol), k
    oa, ob = (read_optimizer_state(d, "solver") for d in (got, want))
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for k, v in oa["state"][i].items():
            # moments ~1e-2, float noise ~1e-8; a gradient averaged over ranks instead of summed is off by 2x
            assert torch.allclose(v.float(), ob["state"][i][k].float(), rtol=1e-4, atol=1e-7), (i, k)


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_two_gloo_ranks_match_one_process(tiny_dir, tmp_path, checkpointing) -> None:
    """Uneven batch of five (split 3 / 2, one rank padded with a dummy micro-batch), then one sequence
    (one rank holds nothing): parameters, AdamW state and metrics equal one process's; generation
    on rank 0 equals it; a reload of the first save saves the same checkpoint. With gradient
    checkpointing too (each decoder layer gathered again for its recompute in backward)."""
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    sharded_ranks.single(str(tiny_dir), single, checkpointing)
    torch.multiprocessing.spawn(sharded_ranks.rank_main,
                                args=(2, _free_port(), str(tiny_dir), str(sharded), checkpointing), nprocs=2)
    for name in ("a", "b"):
        _assert_same_checkpoint(sharded / name, single / name, atol=1e-5)
    _assert_same_checkpoint(sharded / "reloaded", single / "a", atol=1e-5)
    want = json.loads((single / "metrics.json").read_text())
    for rank in (0, 1):
        got = json.loads((sharded / f"metrics{rank}.json").read_text())
        for name in ("a", "b"):
            for k in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm"):
                assert got[name][k] == pytest.approx(want[name][k], rel=1e-4, abs=1e-6), (rank, name, k)
            assert got[name]["n_tokens"] == want[name]["n_tokens"]
    assert json.loads((sharded / "metrics0.json").read_text())["generated"] == want["generated"]


def test_a_sharded_role_asks_one_gpu_bundle_per_rank_and_whole_gpus() -> None:
    from coevo.core.config import compose, to_object
    from coevo.orchestrate.actors import _requests

    cfg = to_object(compose(["experiment=smoke", "solver.num_gpus=2", "solver.num_cpus=3"]))
    requests = _requests(cfg, None)
    assert requests["solver"] == requests["solver.1"] == {"CPU": 1.5, "GPU": 1.0}
    assert "solver.2" not in requests and requests["proposer"] == {"CPU": 1.0}
    with pytest.raises(ValueError, match=r"solver.num_gpus=2.5: .*expected an integer"):
        _requests(to_object(compose(["experiment=smoke", "solver.num_gpus=2.5"])), None)
    with pytest.raises(ValueError, match=r"solver.lora.rank=4 with solver.num_gpus=2"):
        _requests(to_object(compose(["experiment=smoke", "solver.num_gpus=2", "solver.lora.rank=4"])), None)


@pytest.mark.slow
def test_a_ray_worker_group_behind_one_proxy_matches_one_process(tiny_dir, tmp_path) -> None:
    """Two CPU workers joined over gloo behind `RemoteShardedPolicy`: update / save / generate as the
    loop calls them on a single-actor role, same checkpoints and generation as one process; both ranks
    generate (data-parallel rollouts: one prompt each)."""
    import dataclasses

    import ray

    from coevo.orchestrate.actors import RemoteShardedPolicy
    from coevo.orchestrate.remote import call

    single, group = tmp_path / "single", tmp_path / "group"
    sharded_ranks.single(str(tiny_dir), single)
    root = str(Path(__file__).resolve().parents[3])
    temp_dir = tempfile.mkdtemp(prefix="coevo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False, _temp_dir=temp_dir,
             runtime_env={"env_vars": {"PYTHONPATH": root, "OMP_NUM_THREADS": "1"}})
    try:
        cfg = dataclasses.replace(sharded_ranks.config(), model=str(tiny_dir))
        proxy = RemoteShardedPolicy(cfg, "solver", 0, [{"num_cpus": 0.5}] * 2, backend="gloo")
        infos = proxy.start()
        assert [i["rank"] for i in infos] == [0, 1] and {i["world"] for i in infos} == {2}
        metrics = {}
        for name, batch in zip("ab", sharded_ranks.batches()):
            metrics[name] = proxy.update(batch)
            assert proxy.save(str(group / name)) == str(group / name)
        generated = [c[0].token_ids for c in proxy.generate([[5, 6, 7, 8], [9, 10, 11]], sharded_ranks.GREEDY)]
        counts = [call(w.info.remote(), "info")["generated"] for w in proxy.workers]
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    for name in ("a", "b"):
        _assert_same_checkpoint(group / name, single / name, atol=1e-5)
    want = json.loads((single / "metrics.json").read_text())
    assert metrics["a"]["pg_loss"] == pytest.approx(want["a"]["pg_loss"], rel=1e-4, abs=1e-6)
    assert generated == [want["generated"], want["generated_b"]] and counts == [1, 1]


def test_one_process_runs_refuse_a_sharded_role_before_loading() -> None:
    from coevo.core.config import compose, to_object
    from coevo.orchestrate.actors import create_local_actors

    cfg = to_object(compose(["experiment=smoke", "solver.num_gpus=2"]))
    with pytest.raises(ValueError, match=r"solver.num_gpus=2 shards .* expected ray.local=false or solver.num_gpus"):
        create_local_actors(cfg)
