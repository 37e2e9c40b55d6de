"""Rank bodies for test_sharded.py: a module of its own so that spawned processes can import them
(the test modules are imported with --import-mode=importlib, under names a child cannot import)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from coevo.core.config import PolicyConfig
from coevo.core.types import SamplingParams, TrainSequence
from coevo.train.models import load_model_and_tokenizer
from coevo.train.policy import Policy
from coevo.train.sharded import ShardedPolicy

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def config(checkpointing: bool = False) -> PolicyConfig:
    """Two epochs (old log-probs forwarded where missing), a KL reference, micro-batches of two."""
    return PolicyConfig(preset="test", model="unused", engine="hf", lr=1e-2, kl_coef=0.05, ppo_epochs=2,
                        micro_batch_size=2, gradient_checkpointing=checkpointing)


def batches() -> list[list[TrainSequence]]:
    """An uneven batch of five (loss tokens 6, 3, 8, 2, 5: ranks get [1, 2, 3] and [0, 4]), then one sequence."""
    shapes = [(4, 6), (7, 3), (3, 8), (9, 2), (2, 5)]  # (prompt tokens, completion tokens)
    gen = torch.Generator().manual_seed(3)
    out = []
    for i, (prompt, done) in enumerate(shapes):
        ids = torch.randint(5, 50, (prompt + done,), generator=gen).tolist()
        old = None if i % 2 else [-4.0 + 0.1 * t for t in range(prompt + done)]
        out.append(TrainSequence(ids, [0] * prompt + [1] * done, advantage=1.5 - 0.7 * i, old_logprobs=old))
    lone = TrainSequence(torch.randint(5, 50, (9,), generator=gen).tolist(), [0] * 5 + [1] * 4, advantage=-1.0)
    return [out, [lone]]


def update_and_save(policy, out: Path) -> dict:  # noqa: ANN001  a Policy or a ShardedPolicy
    """Each batch's update metrics, the policy saved to out/<batch name> after each update."""
    record = {}
    for name, batch in zip("ab", batches()):
        record[name] = policy.update(batch)
        policy.save(out / name)
    return record


def single(model_dir: str, out: Path, checkpointing: bool = False) -> None:
    """The reference: one process, `Policy.update` on each batch, saved after each."""
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(model_dir)
    policy = Policy(config(checkpointing), model, tok, "solver")
    record = update_and_save(policy, out)
    record["generated"] = policy.generate([[5, 6, 7, 8]], GREEDY)[0][0].token_ids
    record["generated_b"] = policy.generate([[9, 10, 11]], GREEDY)[0][0].token_ids
    (out / "metrics.json").write_text(json.dumps(record))


def rank_main(rank: int, world: int, port: int, model_dir: str, out: str, checkpointing: bool = False) -> None:
    """One rank: the same updates sharded, saved after each; then a reload of the first save, saved again."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model, tok = load_model_and_tokenizer(model_dir)
        policy = ShardedPolicy(config(checkpointing), model, tok, "solver")
        record = update_and_save(policy, Path(out))
        if rank == 0:
            record["generated"] = policy.generate([[5, 6, 7, 8]], GREEDY)[0][0].token_ids
        policy.load(Path(out) / "a")
        policy.save(Path(out) / "reloaded")
        (Path(out) / f"metrics{rank}.json").write_text(json.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Reached on success only. FSDP's device mesh keeps the gloo group (and its worker threads)
    # alive past destroy_process_group; at interpreter exit they can abort the process (SIGABRT,
    # "terminate called without an active exception", about one run in seven here): skip finalization.
    os._exit(0)


def full_state(policy: ShardedPolicy) -> dict:
    """The gathered fp32 weights and AdamW state (keyed by parameter name) of a sharded policy, on every rank."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model, optimizer = policy.policy.model, policy.policy.optimizer
    return {"weights": get_model_state_dict(model, options=full),
            "optim": get_optimizer_state_dict(model, optimizer, options=full)}


def io_rank_main(rank: int, world: int, ports: tuple[int, int], model_dir: str, out: str) -> None:
    """test_sharded_io.py's rank: through `ShardedWorker.setup` (the actors' start-up), one update, a sharded
    save, a resume into a fresh policy, then a load of out/full (`Policy.save`'s format, written by the
    test); each state gathered to out/{saved,resumed,legacy}.pt. Then, in a new group with a 3 s collective
    timeout, rank 0 alone enters an all_reduce: out/timeout.json says how it ended."""
    import dataclasses
    import time

    from coevo.orchestrate.sharded_actors import ShardedWorker, join_process_group

    out_dir = Path(out)
    cfg = dataclasses.replace(config(), model=model_dir)
    worker = ShardedWorker(cfg, "solver", 0, rank, world)
    worker.setup("127.0.0.1", ports[0], "gloo", 120.0)
    policy = worker.policy
    assert policy is not None
    policy.update(batches()[0])
    policy.save(out_dir / "ckpt")
    saved = full_state(policy)
    resumed_policy = ShardedPolicy.from_config(cfg, "solver")  # the model's initial weights
    resumed_policy.load(out_dir / "ckpt")
    resumed = full_state(resumed_policy)
    resumed_policy.load(out_dir / "full")  # an older run's checkpoint: rank 0 reads it, then broadcasts
    legacy = full_state(resumed_policy)
    if rank == 0:
        for name, state in (("saved", saved), ("resumed", resumed), ("legacy", legacy)):
            torch.save(state, out_dir / f"{name}.pt")
    dist.barrier()
    dist.destroy_process_group()
    join_process_group("gloo", "127.0.0.1", ports[1], rank, world, 3.0)
    report = out_dir / "timeout.json"
    if rank == 0:
        t0, outcome = time.monotonic(), {"raised": None}
        try:
            dist.all_reduce(torch.ones(1))  # rank 1 never joins
        except RuntimeError as e:
            outcome = {"raised": type(e).__name__, "message": str(e)[:500]}
        report.write_text(json.dumps({**outcome, "seconds": time.monotonic() - t0}))
    else:  # alive (its socket open) until rank 0 is done: an exit would fail rank 0's collective at once
        deadline = time.monotonic() + 120
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    # Skip finalization, as rank_main does: FSDP's gloo groups outlive destroy_process_group.
    os._exit(0)
