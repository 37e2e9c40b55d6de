"""Rank bodies for test_dp_rollouts.py (a module of its own so that spawned ranks can import it).

Each rank of a 2-rank gloo group builds a `ShardedPolicy` with the HF engine (rank 1's generation copy on
empty memory, filled by the first sync), generates its block of `PROMPTS` as `RemoteShardedPolicy.generate`
splits them (`prompt_blocks` by `SAMPLING.groups`, seeds by `block_sampling`), then again after one update:
each rank writes the rows it generated, their token ids and log-probs.
"""
from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from coevo.core.config import PolicyConfig
from coevo.core.types import SamplingParams, TrainSequence
from coevo.train.models import load_model_and_tokenizer, meta_skeleton
from coevo.train.sharded import ShardedPolicy, block_sampling, prompt_blocks

# Four groups of two prompts (a solver task's rollouts are separate prompts of one group), two samples each.
PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 9], [10, 11, 12], [10, 11, 13, 14], [15, 16], [15, 17, 18, 19, 20],
           [21, 22, 23], [21, 24]]
SAMPLING = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=6, n=2, seed=1234,
                          groups=[0, 0, 1, 1, 2, 2, 3, 3])


def config() -> PolicyConfig:
    return PolicyConfig(preset="test", model="unused", engine="hf", lr=1e-2, kl_coef=0.0, micro_batch_size=2)


def batch() -> list[TrainSequence]:
    gen = torch.Generator().manual_seed(5)
    return [TrainSequence(torch.randint(5, 50, (9,), generator=gen).tolist(), [0] * 5 + [1] * 4, advantage=a)
            for a in (1.0, -0.5, 0.25)]


def rows(completions: list) -> list[list[dict]]:  # noqa: ANN001
    """Token ids and log-probs of each prompt's completions."""
    return [[{"ids": c.token_ids, "logprobs": c.logprobs} for c in cs] for cs in completions]


def generate_block(policy: ShardedPolicy, rank: int) -> dict:
    """This rank's block of PROMPTS, split and seeded as the driver's proxy does."""
    start, end = prompt_blocks(len(PROMPTS), policy.generating_ranks, SAMPLING.groups)[rank]
    return {"block": [start, end], "rows": rows(policy.generate(PROMPTS[start:end], block_sampling(SAMPLING, start)))}


def rank_main(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    host, tok = load_model_and_tokenizer(model_dir)
    if rank:
        host = meta_skeleton(model_dir)
    policy = ShardedPolicy(config(), host, tok, "solver")
    del host
    record = {"generating_ranks": policy.generating_ranks, "before": generate_block(policy, rank)}
    record["update"] = policy.update(batch())
    record["after"] = generate_block(policy, rank)
    Path(out, f"dp{rank}.json").write_text(json.dumps(record))
    os._exit(0)  # no collective after the update's sync; FSDP's gloo threads can abort a normal exit
