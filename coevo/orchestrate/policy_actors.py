"""Policy actors: one Ray actor per policy, or a sharded role's group of rank workers, and the
driver-side proxies that make them look like a local `Policy` (`RemotePolicy`, `RemoteShardedPolicy`).

A policy with `num_gpus = n > 1` is n worker actors, one GPU each, sharing one torch.distributed
process group (coevo/train/sharded.py), behind a proxy with the single actor's interface.
`call` / `gather` turn actor crashes into one `ActorFailure`; coevo/orchestrate/actors.py creates
and wires these actors with the retrieval and evidence ones.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Optional

import ray

from coevo.core.config import PolicyConfig
from coevo.core.types import Completion, SamplingParams
from coevo.orchestrate.hostpaths import Need, check_host_paths
from coevo.orchestrate.remote import call, limit_threads, where
from coevo.train.models import resolve_model_path
from coevo.train.policy import Policy
from coevo.train.sharded import ShardedPolicy


class PolicyWorker:
    """Actor body for one policy: generation and GRPO updates on its own process."""

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, wanted: tuple[Need, ...] = ()) -> None:
        import torch

        check_host_paths(role, list(wanted))  # before anything loads: a missing path names node and key
        limit_threads(cfg.num_cpus)
        torch.manual_seed(seed)
        self.policy = Policy.from_config(cfg, role)

    def ready(self) -> dict:
        return where()

    def info(self) -> dict:
        return {"params": self.policy.num_parameters(), "frozen": self.policy.frozen,
                "device": str(self.policy.device)}

    def chat_prompt_ids(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return [self.policy.chat_prompt_ids(m) for m in messages_batch]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self.policy.generate(prompts, sampling)

    def update(self, batch: list) -> dict:
        return self.policy.update(batch)

    def save(self, directory: str) -> str:
        return str(self.policy.save(directory))

    def load(self, directory: str) -> None:
        self.policy.load(directory)


class ShardedWorker:
    """Actor body for one rank of a sharded policy (`RemoteShardedPolicy`): built in two steps,
    because every rank must be alive before any of them can join the process group."""

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, rank: int, world: int,
                 wanted: tuple[Need, ...] = ()) -> None:
        import torch

        check_host_paths(role, list(wanted))
        limit_threads(max(1.0, cfg.num_cpus / world))
        torch.manual_seed(seed)  # the same on every rank: the ranks must start from the same weights
        self.cfg, self.role, self.rank, self.world = cfg, role, rank, world
        self.policy: Optional[ShardedPolicy] = None

    def ready(self) -> dict:
        return where()

    def endpoint(self) -> tuple[str, int]:
        """Rank 0's address and a free port on it: where the process group meets."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def setup(self, address: str, port: int, backend: str) -> dict:
        """Join the process group (every rank at once), then load and shard the policy."""
        import torch.distributed as dist

        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=self.rank,
                                world_size=self.world)
        self.policy = ShardedPolicy.from_config(self.cfg, self.role)
        return self.info()

    def _policy(self) -> ShardedPolicy:
        if self.policy is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: setup() has not run")
        return self.policy

    def info(self) -> dict:
        policy = self._policy()
        return {"params": policy.num_parameters(), "frozen": policy.frozen, "device": str(policy.policy.device),
                "rank": self.rank, "world": self.world}

    def chat_prompt_ids(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return [self._policy().chat_prompt_ids(m) for m in messages_batch]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self._policy().generate(prompts, sampling)

    def update(self, batch: list) -> dict:
        return self._policy().update(batch)

    def save(self, directory: str) -> str:
        return str(self._policy().save(directory))

    def load(self, directory: str) -> None:
        self._policy().load(directory)


class RemotePolicy:
    """Driver-side stand-in for a `Policy`: same generation surface, work done in the actor."""

    def __init__(self, actor: Any, cfg: PolicyConfig, role: str) -> None:
        from transformers import AutoTokenizer


        self.actor, self.cfg, self.role = actor, cfg, role
        self.frozen = cfg.frozen
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.checkpoint or resolve_model_path(cfg.model))

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.chat_prompt_ids_batch([messages])[0]

    def chat_prompt_ids_batch(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return call(self.actor.chat_prompt_ids.remote(messages_batch), f"{self.role} prompt")

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return call(self.actor.generate.remote(prompts, sampling), f"{self.role} generate")

    def update(self, batch: list) -> dict:
        return call(self.actor.update.remote(batch), f"{self.role} update")

    # Absolute: the actor's working directory (on another node) is not the driver's.
    def save(self, directory: str) -> str:
        return call(self.actor.save.remote(os.path.abspath(directory)), f"{self.role} save")

    def load(self, directory: str) -> None:
        call(self.actor.load.remote(os.path.abspath(directory)), f"{self.role} load")


def gather(refs: list[Any], what: str) -> list[Any]:
    """Every result of `refs`, failing at the first that fails: the other ranks of a sharded
    policy may then wait forever in a collective, so waiting for all of them in order would hang."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            call(ref, what)
    return [call(ref, what) for ref in refs]


class RemoteShardedPolicy(RemotePolicy):
    """Driver-side stand-in for a sharded policy: `RemotePolicy`'s interface over one worker per rank.

    `update`, `save` and `load` go to every rank (they are collectives; the batch is put in the
    object store once); generation and prompts go to rank 0, which generates with its own copy
    of the weights (coevo/train/sharded.py). `actor` is rank 0, `workers` all of them. Each worker
    gets `options[rank]` (its bundle); `backend` is NCCL for GPUs, gloo for CPU workers (tests).
    `start()` joins the process group and loads the model once every worker is placed.
    """

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, options: list[dict], wanted: tuple[Need, ...] = (),
                 backend: str = "nccl") -> None:
        remote = ray.remote(ShardedWorker)
        self.workers = [remote.options(**opts).remote(cfg, role, seed, rank, len(options), wanted)
                        for rank, opts in enumerate(options)]
        self.backend = backend
        super().__init__(self.workers[0], cfg, role)

    def start(self) -> list[dict]:
        """Every rank's `info()` once the process group is up and the sharded model loaded."""
        address, port = call(self.workers[0].endpoint.remote(), f"{self.role} rank 0 endpoint")
        return gather([w.setup.remote(address, port, self.backend) for w in self.workers], f"{self.role} start-up")

    def update(self, batch: list) -> dict:
        ref = ray.put(batch)
        return gather([w.update.remote(ref) for w in self.workers], f"{self.role} update")[0]

    def save(self, directory: str) -> str:
        path = os.path.abspath(directory)
        return gather([w.save.remote(path) for w in self.workers], f"{self.role} save")[0]

    def load(self, directory: str) -> None:
        path = os.path.abspath(directory)
        gather([w.load.remote(path) for w in self.workers], f"{self.role} load")


def rank_names(role: str, ranks: int) -> list[str]:
    """Actor names of a role's workers: the role itself for rank 0, `<role>.<rank>` for the others."""
    return [role] + [f"{role}.{r}" for r in range(1, ranks)]
