"""Precision of a policy (docs/method.md §5.2): fp32 master weights and optimizer state, bf16 compute where the
hardware has it.

A trainable policy must hold fp32 weights: at the paper's lr 1e-6 an AdamW step moves each
weight by about 1e-6, below half a bf16 step for all but the smallest weights (bf16 keeps 8
significant bits: a weight of 0.02 moves only by 1.2e-4 or more), so bf16 weights keep about
98% of their values unchanged per step and the run learns almost nothing
(tests/coevo/train/test_policy.py measures both). Compute runs in bf16 under autocast on a
single CUDA device that supports it (`<role>.bf16_autocast`). On the CPU it stays plain fp32
unless `<role>.cpu_bf16_autocast` asks for bf16 and the CPU has bf16 instructions (avx512_bf16 or
amx_bf16; without them torch emulates bf16 far slower than fp32, so the key is then ignored with a
warning). The HF engine generates under the same context; a vLLM engine keeps its fp32 copy.
Frozen policies and the KL reference are never stepped, so they may hold bf16 weights; so may
the frozen base of a LoRA policy (`<role>.lora.rank > 0`), whose trainable adapter is fp32.
Whose log-probs are an update's old ones (π_old) is `<role>.old_logprobs`, decided in
`engine_logprobs_usable`; every update logs how far the engine's are from the trainer's
(`logprob_mismatch_mean` / `_p99`, coevo/train/batching.py `mismatch_metrics`).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path
from typing import Any, ContextManager

import torch

LOG = logging.getLogger("coevo.precision")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The flags of the first CPU listed in `cpuinfo` (empty where it cannot be read)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@functools.lru_cache(maxsize=1)
def cpu_native_bf16() -> bool:
    """Whether this machine's CPU has bf16 instructions (`BF16_CPU_FLAGS`)."""
    return bool(cpu_flags().intersection(BF16_CPU_FLAGS))


def check_trainable_dtype(model: torch.nn.Module, role: str, frozen: bool) -> None:
    """Refuse a trainable model whose parameters are not fp32, naming `<role>.dtype`."""
    if frozen:
        return
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters() if p.requires_grad})
    if dtypes and dtypes != ["float32"]:
        raise ValueError(f"config key {role}.dtype={'/'.join(dtypes)}: a trainable {role} keeps fp32 master weights "
                         f"and optimizer state; expected {role}.dtype=float32 (compute runs in bf16 under autocast "
                         f"on CUDA, {role}.bf16_autocast) or {role}.frozen=true")


def on_cuda(device: torch.device) -> bool:
    """Whether `device` is a usable CUDA device: the one device check of this module's decisions."""
    return device.type == "cuda" and torch.cuda.is_available()


def bf16_compute(cfg: Any, device: torch.device) -> bool:
    """Whether this policy's forward passes run in bf16: `bf16_autocast` on a CUDA device with bf16 support,
    or `cpu_bf16_autocast` on a CPU with bf16 instructions."""
    if on_cuda(device):
        return bool(getattr(cfg, "bf16_autocast", False)) and torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_bf16(cfg)


def cpu_bf16(cfg: Any) -> bool:
    """`cpu_bf16_autocast` where the CPU has bf16 instructions; asked for on a CPU without them, a warning."""
    if not getattr(cfg, "cpu_bf16_autocast", False):
        return False
    if cpu_native_bf16():
        return True
    _warn_no_cpu_bf16()
    return False


@functools.lru_cache(maxsize=1)
def _warn_no_cpu_bf16() -> None:  # once per process, not once per forward pass
    LOG.warning("cpu_bf16_autocast=true ignored: this CPU has none of %s (torch would emulate bf16, slower "
                "than fp32); computing in fp32", "/".join(BF16_CPU_FLAGS))


def compute_context(cfg: Any, device: torch.device) -> ContextManager:
    """bf16 autocast for forward passes (`bf16_compute`), else nothing: the weights' own dtype."""
    if bf16_compute(cfg, device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def serving_dtype(cfg: Any, on_cpu: bool) -> str:
    """dtype of a vLLM engine's weight copy: bf16 on a GPU when the trainer computes in bf16, else `cfg.dtype`.

    On the CPU the engine keeps the policy's dtype: fp32 gives exact greedy parity with HF.
    """
    bf16 = not on_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return "bfloat16" if bf16 and getattr(cfg, "bf16_autocast", False) else str(cfg.dtype)


def engine_logprobs_usable(cfg: Any, device: torch.device) -> bool:
    """Whether the rollout engine's log-probs are the update's old ones (π_old), per `<role>.old_logprobs`.

    `engine`: always; `trainer`: never (the trainer's own forward before the step gives π_old, free
    at one ppo epoch, one more forward per micro-batch above it). `auto`: the HF engine generates
    with the trained model under `compute_context`: its log-probs. vLLM on CUDA: never, whatever
    dtype it serves: its kernels are not the trainer's, so exp(trainer - engine log-prob), the PPO
    ratio, is not 1 before any step and clipping acts on kernel noise. vLLM elsewhere (the CPU):
    only when `serving_dtype` is the dtype the update multiplies in; under `cpu_bf16_autocast` the
    CPU engine serves fp32 while the update runs bf16 (run 8: the ranker's clip fraction 0.13-0.17
    at one epoch). Either way the gap is logged (`logprob_mismatch_*`, coevo/train/batching.py).
    """
    choice = str(getattr(cfg.old_logprobs, "value", cfg.old_logprobs))
    if choice != "auto":
        return choice == "engine"
    if str(getattr(cfg.engine, "value", cfg.engine)) != "vllm":
        return True
    if on_cuda(device):
        return False
    update_dtype = "bfloat16" if bf16_compute(cfg, device) else str(cfg.dtype)
    return serving_dtype(cfg, on_cpu=True) == update_dtype


def allocate_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state now (AdamW's fp32 moments), exactly as its first step would.

    torch allocates Adam's two moments lazily, at the first step with gradients. A role whose
    first training group comes late (the ranker's often does) then grows the process by twice
    its trainable weights mid-run: measured +1,541 MB at step 20 of a 135M-ranker run
    (docs/memory.md), and on a full machine that is an OOM kill hours in instead of at start.

    Done through the optimizer's own code path, so dtypes and devices are whatever torch picks:
    one step on zero gradients at lr 0 (AdamW's decay `p *= 1 - lr * wd` and its update
    `lr * m / (sqrt(v) + eps)` are both exactly zero then), after which each step counter is
    reset to 0 so the first real step's bias correction is unchanged.
    Shape: no change to any parameter; state[p] holds what a lazily initialised step would.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params or any(len(optimizer.state[p]) for p in params):
        return  # state exists (e.g. loaded from a checkpoint): a zero-gradient step would decay its moments
    lrs = [group["lr"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["lr"] = 0.0
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
    for p in params:
        optimizer.state[p]["step"].zero_()  # a tensor in every torch this project supports
