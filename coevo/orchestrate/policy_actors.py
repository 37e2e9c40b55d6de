"""Policy actors: one Ray actor per policy (`PolicyWorker`) and the driver-side proxy that makes
it look like a local `Policy` (`RemotePolicy`).

A sharded role's rank workers are in coevo/orchestrate/sharded_actors.py (this module's actor
processes never import FSDP); `call` (coevo/orchestrate/remote.py) turns actor crashes into one
`ActorFailure`; coevo/orchestrate/actors.py creates and wires these actors with the others.
"""
from __future__ import annotations

import os
from typing import Any

from coevo.core.config import PolicyConfig
from coevo.core.types import Completion, SamplingParams
from coevo.orchestrate.hostpaths import Need, check_host_paths
from coevo.orchestrate.remote import call, limit_threads, where
from coevo.train.models import resolve_model_path
from coevo.train.policy import Policy


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


class RemotePolicy:
    """Driver-side stand-in for a `Policy`: the same `RolePolicy` surface (coevo/core/types.py), work done in the actor.

    `generate` is one hop to the actor: `PolicyWorker.generate` runs `Policy.generate` there.
    """

    def __init__(self, actor: Any, cfg: PolicyConfig, role: str) -> None:
        from transformers import AutoTokenizer


        self.actor, self.cfg, self.role = actor, cfg, role
        self.frozen = cfg.frozen
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.checkpoint or resolve_model_path(cfg.model))

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        return call(self.actor.chat_prompt_ids.remote([messages]), f"{self.role} prompt")[0]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return call(self.actor.generate.remote(prompts, sampling), f"{self.role} generate")

    def update(self, batch: list) -> dict:
        return call(self.actor.update.remote(batch), f"{self.role} update")

    # Absolute: the actor's working directory (on another node) is not the driver's.
    def save(self, directory: str) -> str:
        return call(self.actor.save.remote(os.path.abspath(directory)), f"{self.role} save")

    def load(self, directory: str) -> None:
        call(self.actor.load.remote(os.path.abspath(directory)), f"{self.role} load")


def rank_names(role: str, ranks: int) -> list[str]:
    """Actor names of a role's workers: the role itself for rank 0, `<role>.<rank>` for the others."""
    return [role] + [f"{role}.{r}" for r in range(1, ranks)]
