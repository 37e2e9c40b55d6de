"""The trainer's phases of bench/gpu_verify.py: the sharded start-up replay, an FSDP2 update, the bf16 weight sync.

Each phase takes the run's `Ctx` and returns its JSON fields (bench/gpu_verify.py adds the phase name and its
seconds). Every one runs in the world-size-1 process group bench/gpu_verify.py opens (NCCL on CUDA, gloo on the
CPU) and mirrors coevo/train/sharded.py step for step, with torch's own APIs: sharded.py itself needs omegaconf.
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from bench.gpu_verify_lib import (
    BIG,
    MID,
    SOLVER_RANKS,
    Ctx,
    Scorer,
    build,
    count_params,
    fit_layers,
    free_total,
    full_tensor,
    gb,
    grad_norm,
    grpo_backward,
    held_bytes,
    host_model,
    memory,
    mixed_policy,
    model_config,
    peak,
    planner_startup,
    planner_update,
    precondition,
    reset_peak,
    shard,
    token_batch,
)
from coevo.train.device_memory import cast_copy, empty_device_cache, reference_copy
from coevo.train.precision import allocate_optimizer_state
from coevo.train.recompute import enable_gradient_checkpointing, train_mode

UPDATE_BYTES = 20  # a parameter's bytes in an update: fp32 weight, grad, two moments, AdamW's foreach temporaries


def _fill_from_host(model: torch.nn.Module, host: torch.nn.Module) -> None:
    """coevo/train/sharded.py `_broadcast_from_rank0` at world size 1: shards filled one tensor at a time from the
    host copy, then the buffers (rotary frequencies: in no state dict, uninitialised by `to_empty`)."""
    set_model_state_dict(model, host.state_dict(),
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    host_buffers = dict(host.named_buffers())
    for name, buffer in model.named_buffers():
        buffer.copy_(host_buffers[name])
        dist.broadcast(buffer, src=0)


def startup_replay(ctx: Ctx) -> dict:
    """The sharded start-up (coevo/train/sharded.py `ShardedPolicy.__init__`), memory after each step, and whether
    vLLM's free-memory check would pass after it, beside the planner's figures for the headline solver."""
    s = ctx.sizes
    config = model_config(BIG, s.startup)
    reference_step = "reference_bf16" if ctx.bf16 else "reference"
    steps: list[dict] = []
    held_at: dict[str, int] = {}
    clock = [time.perf_counter()]

    def mark(step: str) -> None:
        ctx.sync()
        now = time.perf_counter()
        steps.append({"step": step, "s": round(now - clock[0], 2), **memory(ctx.device)})
        held_at[step] = held_bytes(ctx.device)
        clock[0] = now

    host = host_model(BIG, s.startup)  # rank 0 loads the fp32 model on the host
    mark("host_copy")
    policy = Scorer(cast_copy(host, device="meta"))
    reference = Scorer(reference_copy(host, torch.bfloat16 if ctx.bf16 else None, "meta"))
    mark("meta_skeleton")
    shard(policy, mixed_policy(ctx))
    mark("fully_shard")
    policy.to_empty(device=ctx.device)
    mark("to_empty")
    _fill_from_host(policy.model, host)
    mark("fill_from_host")
    shard(reference, mixed_policy(ctx))
    reference.to_empty(device=ctx.device)
    _fill_from_host(reference.model, host)
    mark(reference_step)
    optimizer = torch.optim.AdamW(list(policy.parameters()), lr=1e-6, weight_decay=0.0)
    allocate_optimizer_state(optimizer)
    mark("adamw_moments")
    del host
    empty_device_cache()
    mark("empty_cache")
    free, total = free_total(ctx.device)
    at = held_at  # what each part holds: the difference across the steps that allocate it
    held = {"weights": at["fill_from_host"] - at["fully_shard"], "reference": at[reference_step] - at["fill_from_host"],
            "optimizer": at["adamw_moments"] - at[reference_step]}
    full_params = count_params(model_config(BIG, s.startup if s.tiny else {}))
    where = "this GPU" if ctx.cuda else "the host (no CUDA device: the check means nothing there)"
    return {"shape": s.startup_note, "params": count_params(config),
            "per_rank_params_of_the_solver": math.ceil(full_params / SOLVER_RANKS), "world": 1,
            "backend": dist.get_backend(), "steps": steps, "held_gb": {k: gb(v) for k, v in held.items()},
            "held_measured_as": "CUDA allocated" if ctx.cuda else "process RSS (no CUDA device)",
            "vllm_start": {**precondition(free, total), "measured": f"after empty_cache, on {where}"},
            **peak(ctx.device), "planner": planner_startup(ctx)}


def fsdp_update(ctx: Ctx) -> dict:
    """One world-size-1 FSDP2 GRPO update at the 3B shape (fp32 masters, bf16 gathers and autocast, gradient
    checkpointing, AdamW with its moments made at start): tokens/s of the second step, peak memory, grad norm."""
    s = ctx.sizes
    changes, layers = fit_layers(ctx, MID, s.mid, UPDATE_BYTES)
    config = model_config(MID, changes)
    model = build(config, ctx.device)
    enable_gradient_checkpointing(model, "gpu_verify")
    scorer = Scorer(model)
    shard(scorer, mixed_policy(ctx))
    params = list(scorer.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0)
    allocate_optimizer_state(optimizer)
    batch = token_batch(ctx, int(config.vocab_size))
    times, norms = [], []
    for _ in range(2):  # the first step pays the kernels' warm-up
        reset_peak(ctx.device)
        ctx.sync()
        t0 = time.perf_counter()
        with train_mode(model, True):
            grpo_backward(ctx, scorer, batch)
        norms.append(grad_norm(params))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ctx.sync()
        times.append(time.perf_counter() - t0)
    tokens = s.rows * s.seq
    return {"shape": f"Qwen2.5-3B config, {layers}", "params": count_params(config), "world": 1,
            "backend": dist.get_backend(), "bf16": ctx.bf16, "gradient_checkpointing": True,
            "tokens": f"{s.rows}x{s.seq}", "loss_tokens_per_row": s.completion, "step_s": [round(t, 3) for t in times],
            "tokens_per_s": round(tokens / times[-1], 1), **peak(ctx.device), "grad_norm": norms[-1],
            "grad_norm_finite": all(math.isfinite(n) for n in norms), "planner": planner_update(ctx, config)}


def weight_sync(ctx: Ctx) -> dict:
    """The sync path (coevo/train/sharded.py `gathered_weights`, vLLM's untied head included): each fp32 shard cast
    to the serving dtype and gathered, one parameter at a time; then each gathered tensor copied into pinned host
    memory (plain host memory on the CPU). At world size 1 the gather is a local copy: GB/s of the cast and
    `full_tensor` path, not of NCCL between GPUs."""
    s = ctx.sizes
    changes, layers = fit_layers(ctx, MID, s.mid, 4 + 2 + 1)
    config = model_config(MID, changes)
    model = build(config, ctx.device)
    scorer = Scorer(model)
    shard(scorer, None)  # fp32 shards: what the update leaves
    named = list(model.named_parameters())
    if bool(getattr(config, "tie_word_embeddings", False)):  # vLLM runs untied: the head is sent too
        named.append(("lm_head.weight", model.get_output_embeddings().weight))
    gather_s, stage_s, sent = _gather_and_stage(ctx, named)
    return {"shape": f"Qwen2.5-3B config, {layers}", "serving_dtype": str(ctx.serving).replace("torch.", ""),
            "tensors": len(named), "bytes_sent": sent, "gb_sent": gb(sent), "gather_s": round(gather_s, 3),
            "gather_gbps": _sig(sent / 1e9 / gather_s), "stage_s": round(stage_s, 3),
            "stage_gbps": _sig(sent / 1e9 / stage_s), "pinned": ctx.cuda, **peak(ctx.device),
            "note": "world size 1: full_tensor copies locally; a 4-rank all-gather adds NCCL time"}


def _sig(rate: float) -> float:
    """A rate to 3 significant figures: two decimals would print a tiny shape's MB/s as 0.0 GB/s."""
    return float(f"{rate:.3g}")


def _gather_and_stage(ctx: Ctx, named: list[tuple[str, Any]]) -> tuple[float, float, int]:
    """(seconds gathering every tensor, seconds copying them to the host, bytes sent) over two passes."""
    reset_peak(ctx.device)
    ctx.sync()
    t0 = time.perf_counter()
    sent = 0
    for _, param in named:
        tensor = full_tensor(param, ctx.serving)
        sent += tensor.numel() * tensor.element_size()
        del tensor
    ctx.sync()
    gather_s = time.perf_counter() - t0
    largest = max(p.numel() for _, p in named)
    staging = torch.empty(largest, dtype=ctx.serving, pin_memory=ctx.cuda)
    stage_s = 0.0
    for _, param in named:
        tensor = full_tensor(param, ctx.serving).reshape(-1)
        ctx.sync()
        t0 = time.perf_counter()
        staging[:tensor.numel()].copy_(tensor, non_blocking=ctx.cuda)
        ctx.sync()
        stage_s += time.perf_counter() - t0
    return gather_s, stage_s, sent
