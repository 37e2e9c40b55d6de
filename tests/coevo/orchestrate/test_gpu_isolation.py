"""Every engine on its own device: an actor given no GPU sees none (`cluster.worker_runtime_env`), and the roles
serving with vLLM on GPUs start one at a time (`actors.start_policies`).

The Ray test starts a local cluster with two GPUs it does not have (`num_gpus=2`) under the driver's
`CUDA_VISIBLE_DEVICES=0,1`, as on a GPU node: Ray only hands out the ids, nothing touches a device.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest
import ray

from coevo.core.config import compose, to_object
from coevo.orchestrate import cluster
from coevo.orchestrate.actors import RemoteShardedPolicy, one_at_a_time, start_policies
from coevo.orchestrate.cluster import ZERO_GPUS_HIDE_ALL, init_ray, worker_runtime_env
from coevo.train.sharded import shard_count


class Probe:
    """What an actor, and a process it starts (as a vLLM engine core), sees of the node's GPUs."""

    def seen(self) -> dict:
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return {"env": os.environ.get("CUDA_VISIBLE_DEVICES"), "ids": ray.get_gpu_ids(), "child": child}


def test_an_actor_given_no_gpu_sees_none_and_a_gpu_actor_its_own(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the node's raylet and workers start with it
    temp_dir = tempfile.mkdtemp(prefix="coevo-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, configure_logging=False,
             _temp_dir=temp_dir, runtime_env=worker_runtime_env())
    try:
        # As the ranker, retrieval and evidence actors are made (placement_options: num_gpus 0), and a GPU role.
        actors = [ray.remote(Probe).options(num_cpus=0, num_gpus=n).remote() for n in (0, 1)]
        cpu, gpu = ray.get([actor.seen.remote() for actor in actors])
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert cpu == {"env": "", "ids": [], "child": ""}  # not the node's "0,1": neither the actor nor its engine
    assert len(gpu["ids"]) == 1 and gpu["env"] == gpu["child"] == str(gpu["ids"][0])


@pytest.mark.parametrize("address", [None, "auto"])
def test_init_ray_gives_every_worker_that_env_also_on_a_joined_cluster(monkeypatch, address):
    class Stop(Exception):
        pass

    seen = {}

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise Stop  # before init_ray's logging and signal set-up, which belong to a real run

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(cluster.ray, "init", fake_init)
    with pytest.raises(Stop):
        init_ray(to_object(compose(["experiment=smoke"] + ([f"ray.address={address}"] if address else []))))
    assert seen["address"] == (address or "local")
    assert seen["runtime_env"]["env_vars"][ZERO_GPUS_HIDE_ALL] == "1"
    assert seen["runtime_env"] == worker_runtime_env()


class FakeSharded(RemoteShardedPolicy):
    """A sharded role's proxy without Ray: its workers are names, `start` is recorded."""

    def __init__(self, role: str, ranks: int, events: list) -> None:
        self.role, self.events = role, events
        self.workers = [f"{role} rank {r}" for r in range(ranks)]

    def start(self) -> list:
        self.events.append(("start", self.role))
        return []


def _start_order(overrides: list[str]) -> tuple[list, dict]:
    """The events `start_policies` produces for a config: actors created, waited for, sharded ones started."""
    cfg = to_object(compose(overrides))
    events: list = []

    def make(role, policy):
        events.append(("create", role))
        ranks = shard_count(policy, role)
        return FakeSharded(role, ranks, events) if ranks else SimpleNamespace(actor=f"{role} actor")

    def ready(handles):
        events.append(("ready", sorted(handles)))
        return {name: {"node_id": "n"} for name in handles}

    _, placed = start_policies({"proposer": cfg.proposer, "solver": cfg.solver, "ranker": cfg.ranker}, make, ready,
                               {"retrieval": "r", "evidence": "e"})
    return events, placed


def test_gpu_vllm_roles_start_one_at_a_time_before_the_next_is_created():
    # The headline command with vLLM: proposer (2 ranks), solver (4 ranks) and the ranker (smollm2-135m, on the
    # 2 GPUs left) serve with vLLM on GPUs.
    events, placed = _start_order(["proposer=qwen3-4b", "solver=qwen2.5-7b", "rollout=vllm"])
    assert events == [("create", "proposer"), ("ready", ["proposer", "proposer.1"]), ("start", "proposer"),
                      ("create", "solver"), ("ready", ["solver", "solver.1", "solver.2", "solver.3"]),
                      ("start", "solver"), ("create", "ranker"), ("ready", ["ranker", "ranker.1"]), ("start", "ranker"),
                      ("ready", ["evidence", "retrieval"])]
    assert len(placed) == 2 + 4 + 2 + 2  # every actor's placement, each waited for once
    # Single-GPU actors: each constructor (model, engine) has returned before the next actor exists.
    events, _ = _start_order(["rollout=vllm", "proposer.num_gpus=1", "solver.num_gpus=0.5", "ranker.num_gpus=0.5"])
    assert events == [("create", "proposer"), ("ready", ["proposer"]), ("create", "solver"), ("ready", ["solver"]),
                      ("create", "ranker"), ("ready", ["ranker"]), ("ready", ["evidence", "retrieval"])]


@pytest.mark.parametrize("overrides", [["proposer=qwen3-4b", "solver=qwen2.5-7b", "rollout=hf"], ["rollout=vllm"],
                                       ["rollout=vllm", "solver.num_gpus=1", "ranker.num_gpus=0"]], ids=" ".join)
def test_hf_cpu_and_lone_gpu_engines_start_together(overrides):
    """HF roles, CPU engines and a single GPU vLLM role: created at once, one wait, then the sharded started."""
    events, placed = _start_order(overrides)
    sharded = [("start", r) for r in ("proposer", "solver", "ranker") if any(n == f"{r}.1" for n in placed)]
    assert events == [("create", "proposer"), ("create", "solver"), ("create", "ranker"),
                      ("ready", sorted(placed)), *sharded]
    assert one_at_a_time({"solver": to_object(compose(overrides)).solver}) == []
