"""A sharded policy's actors: one `ShardedWorker` per rank, driven by `RemoteShardedPolicy`.

A policy with `num_gpus = n > 1` is n worker actors, one GPU each, sharing one torch.distributed
process group (coevo/train/sharded.py), behind a proxy with `RemotePolicy`'s interface. Apart from
coevo/orchestrate/policy_actors.py so that a plain policy actor's process never imports FSDP
(torch.distributed.fsdp and .checkpoint: measured ~47 MB of RSS per policy actor).
"""
from __future__ import annotations

import os
import random
import socket
from dataclasses import replace
from datetime import timedelta
from typing import Any, Optional

import ray
from ray.exceptions import RayActorError

from coevo.core.config import ClusterConfig, PolicyConfig
from coevo.core.types import Completion, SamplingParams
from coevo.orchestrate.cluster import ActorFailure
from coevo.orchestrate.hostpaths import Need, check_host_paths
from coevo.orchestrate.policy_actors import RemotePolicy
from coevo.orchestrate.remote import call, limit_threads, where
from coevo.train.rank_failure import named_rank
from coevo.train.sharded import ShardedPolicy, block_sampling, prompt_blocks


class ShardedWorker:
    """Actor body for one rank of a sharded policy (`RemoteShardedPolicy`): built in two steps,
    because every rank must be alive before any of them can join the process group."""

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, rank: int, world: int,
                 wanted: tuple[Need, ...] = ()) -> None:
        import torch

        check_host_paths(role, list(wanted))
        self.timeout_s: Optional[float] = None
        limit_threads(max(1.0, cfg.num_cpus / world))
        torch.manual_seed(seed)  # the same on every rank: the ranks must start from the same weights
        self.cfg, self.role, self.rank, self.world = cfg, role, rank, world
        self.policy: Optional[ShardedPolicy] = None
        self.generated = 0  # prompts this rank has generated (its blocks of the data-parallel rollouts)

    def ready(self) -> dict:
        return where()

    def endpoint(self) -> tuple[str, int]:
        """Rank 0's address and a free port on it: where the process group meets."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def setup(self, address: str, port: int, backend: str, timeout_s: float) -> dict:
        """Join the process group (every rank at once; collectives time out after `timeout_s`), then load
        and shard the policy."""
        self.timeout_s = timeout_s
        with self._named("start-up"):
            join_process_group(backend, address, port, self.rank, self.world, timeout_s)
            self.policy = ShardedPolicy.from_config(self.cfg, self.role)
        return self.info()

    def _named(self, what: str):  # noqa: ANN202  a context manager
        """An error raised inside names this role and rank (`named_rank`): the driver reports it as it is."""
        return named_rank(self.role, self.rank, self.world, what, self.timeout_s)

    def _policy(self) -> ShardedPolicy:
        if self.policy is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: setup() has not run")
        return self.policy

    def info(self) -> dict:
        policy = self._policy()
        return {"params": policy.num_parameters(), "frozen": policy.frozen, "device": str(policy.policy.device),
                "rank": self.rank, "world": self.world, "generating_ranks": policy.generating_ranks,
                "generated": self.generated}

    def chat_prompt_ids(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return [self._policy().chat_prompt_ids(m) for m in messages_batch]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """This rank's block (`RemoteShardedPolicy.generate` splits the call and seeds the block)."""
        with self._named("generate"):
            out = self._policy().generate(prompts, sampling)
        self.generated += len(prompts)
        return out

    def update(self, batch: list) -> dict:
        with self._named("update"):
            return self._policy().update(batch)

    def save(self, directory: str) -> str:
        with self._named("save"):
            return str(self._policy().save(directory))

    def load(self, directory: str) -> None:
        with self._named("load"):
            self._policy().load(directory)


def join_process_group(backend: str, address: str, port: int, rank: int, world: int, timeout_s: float) -> None:
    """Join the process group meeting at `address:port` as `rank` of `world`.

    A collective (or the join itself) that waits more than `timeout_s` seconds on another rank
    (`cluster.collective_timeout_s`) raises instead of hanging the run: a rank that died, or one
    still writing, would otherwise leave the others waiting forever (torch's default is 30 min
    for gloo and 10 for NCCL, whatever the step needs).
    """
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def gather(refs: list[Any], whats: list[str]) -> list[Any]:
    """Every result of `refs`, failing at the first that fails, named by its own entry of `whats`
    ("solver rank 1 update"): the other ranks of a sharded policy then wait in a collective until
    it times out, so waiting for all of them in order would hang that long."""
    pending, names = list(refs), dict(zip(refs, whats))
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            call(ref, names[ref])
    return [call(ref, names[ref]) for ref in refs]


def _collect(refs: list[Any], wait_s: float = 2.0) -> None:
    """Fetch and drop the failures of `refs` that have arrived (within `wait_s`): one failure is reported; the
    others (survivors' collective errors, echoes of it) would else print as Ray's "Unhandled error" tracebacks
    after the run's stop message. Those still pending die with the run."""
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    for ref in done:
        try:
            ray.get(ref)
        except Exception:  # noqa: BLE001, S110  the failure already reported is the one that counts
            pass


class RemoteShardedPolicy(RemotePolicy):
    """Driver-side stand-in for a sharded policy: `RemotePolicy`'s interface over one worker per rank.

    `update`, `save` and `load` go to every rank (they are collectives; the batch is put in the
    object store once); `generate` is data-parallel over the ranks that generate (`generate`);
    prompts (`chat_prompt_ids`) go to rank 0. `actor` is rank 0, `workers` all of them. Each worker
    gets `options[rank]` (its bundle); `backend` is NCCL for GPUs, gloo for CPU workers (tests).
    `start()` joins the process group and loads the model once every worker is placed; its
    collectives time out after `collective_timeout_s` (`cluster.collective_timeout_s`).
    """

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, options: list[dict], wanted: tuple[Need, ...] = (),
                 backend: str = "nccl", collective_timeout_s: float = ClusterConfig.collective_timeout_s) -> None:
        remote = ray.remote(ShardedWorker)
        self.workers = [remote.options(**opts).remote(cfg, role, seed, rank, len(options), wanted)
                        for rank, opts in enumerate(options)]
        self.backend, self.collective_timeout_s = backend, collective_timeout_s
        self.generating_ranks = 1  # until `start` says how many ranks have an engine
        self._seeds = random.Random(seed)
        super().__init__(self.workers[0], cfg, role)

    def start(self) -> list[dict]:
        """Every rank's `info()` once the process group is up and the sharded model loaded."""
        address, port = call(self.workers[0].endpoint.remote(), f"{self.role} rank 0 endpoint")
        infos = self._gather("start-up", [w.setup.remote(address, port, self.backend, self.collective_timeout_s)
                                          for w in self.workers])
        self.generating_ranks = int(infos[0]["generating_ranks"])
        return infos

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """`Policy.generate`'s results, data-parallel: rank r of the `generating_ranks` generates block r of
        `prompts` (`prompt_blocks`: contiguous, balanced by count; by whole groups of `sampling.groups`, so a
        solver task's rollouts share a rank), seeded as in one call (`block_sampling`); the blocks come back
        concatenated in rank order, i.e. in prompt order. An unseeded call is given a seed drawn here: the
        ranks' RNGs start alike, so unseeded blocks would sample from the same random streams."""
        if self.generating_ranks > 1 and sampling.seed is None:
            sampling = replace(sampling, seed=self._seeds.randrange(2**31))
        blocks = prompt_blocks(len(prompts), self.generating_ranks, sampling.groups)
        ranks = [r for r, (a, b) in enumerate(blocks) if b > a]
        refs = [self.workers[r].generate.remote(prompts[slice(*blocks[r])], block_sampling(sampling, blocks[r][0]))
                for r in ranks]
        return [c for part in self._gather("generate", refs, ranks) for c in part]

    def update(self, batch: list) -> dict:
        ref = ray.put(batch)
        return self._gather("update", [w.update.remote(ref) for w in self.workers])[0]

    def save(self, directory: str) -> str:
        path = os.path.abspath(directory)
        return self._gather("save", [w.save.remote(path) for w in self.workers])[0]

    def load(self, directory: str) -> None:
        path = os.path.abspath(directory)
        self._gather("load", [w.load.remote(path) for w in self.workers])

    def _gather(self, what: str, refs: list[Any], ranks: Optional[list[int]] = None) -> list[Any]:
        """`gather` of one call per rank (`ranks`: which, default all); a failure names the dead ranks.

        The first failure to arrive is usually the dead rank's own ("The actor died"); a survivor's
        collective error (`RankFailure`) only echoes it, so the dead ranks are looked up and named first.
        """
        ranks = list(range(len(self.workers))) if ranks is None else ranks
        try:
            return gather(refs, [f"{self.role} rank {r} {what}" for r in ranks])
        except ActorFailure as e:
            dead = self.dead_ranks()
            _collect(refs)
            if not dead:
                raise
            raise ActorFailure(f"{self.role} rank {', '.join(map(str, dead))} of {len(self.workers)} died during "
                               f"{what}: its process is gone (killed, out of memory, or lost with its node). First "
                               f"error: {e}") from e

    def dead_ranks(self, wait_s: float = 5.0) -> list[int]:
        """The ranks whose actor is dead, asked for `ready()` (a live rank busy in a collective answers late:
        not dead)."""
        refs = [w.ready.remote() for w in self.workers]
        answered, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        dead = []
        for rank, ref in enumerate(refs):
            try:
                if ref in answered:
                    ray.get(ref)
            except RayActorError:
                dead.append(rank)
        return dead
