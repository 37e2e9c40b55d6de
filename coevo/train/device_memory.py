"""What a policy holds on its device at start-up, and when the device's cached memory goes back (docs/method.md §5.2).

Two rules every policy (coevo/train/policy.py, coevo/train/sharded.py) and engine (engines/vllm.py) follow:
- **No second full-precision copy on the device.** A never-stepped copy of the weights (the KL reference,
  a sharded role's HF generation copy) is made by `reference_copy`: one parameter at a time, straight
  into its own dtype, so the peak is the copy itself plus one parameter, never a whole fp32 model first
  (`copy.deepcopy(model).to(bfloat16)` holds both: on a 7B model 30 GB more than needed, at start).
- **Cached memory is returned before anything sizes itself from free memory** (`empty_device_cache`):
  before a vLLM engine starts (vLLM refuses to start when free memory is below
  `gpu_memory_utilization` x total, vllm/v1/worker/utils.py `request_memory`, and PyTorch's caching
  allocator keeps what the start-up freed as "reserved", which the device reports as used), after an
  engine sleeps (so the update can reuse what it released) and before it wakes (so its weights and
  KV cache can come back). On a machine without CUDA the call does nothing.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch


def empty_device_cache() -> None:
    """Return PyTorch's cached, unused CUDA blocks to the device (a no-op where CUDA never started).

    Always called, never guarded here by "is this a GPU run": `torch.cuda.empty_cache` itself does
    nothing until CUDA is initialised, and one unconditional call is what tests can observe.
    """
    torch.cuda.empty_cache()


@torch.no_grad()
def cast_copy(model: torch.nn.Module, dtype: Optional[torch.dtype] = None,
              device: Optional[torch.device | str] = None, empty: bool = False) -> torch.nn.Module:
    """A copy of `model` with its parameters cast to `dtype` on `device` (None: as they are), made one parameter
    at a time: each copy is allocated in its own dtype and place directly, so the source device holds the
    model, the copy (if it is there) and nothing more. Tied parameters stay tied (one copy per parameter
    object); `requires_grad` is kept; buffers are cloned to `device` in their own dtype (rotary frequencies
    keep their precision). On `device="meta"` it allocates nothing: coevo/train/sharded.py's skeletons.
    `empty`: the memory only, values left uninitialised (to be filled, e.g. by a weight sync): the only
    way from a meta `model` to real memory with its ties kept (`to_empty` unties them).
    """
    memo: dict[int, object] = {}
    for param in model.parameters():  # each parameter object once, so tied weights stay one tensor
        where, kind = device or param.device, dtype or param.dtype
        data = torch.empty(param.shape, dtype=kind, device=where) if empty else \
            param.detach().to(device=where, dtype=kind, copy=True)
        memo[id(param)] = torch.nn.Parameter(data, requires_grad=param.requires_grad)
    for buffer in model.buffers():
        where = device or buffer.device
        memo[id(buffer)] = torch.empty_like(buffer, device=where) if empty else \
            buffer.detach().to(device=where, copy=True)
    return copy.deepcopy(model, memo)


def reference_copy(model: torch.nn.Module, dtype: Optional[torch.dtype] = None,
                   device: Optional[torch.device | str] = None, empty: bool = False) -> torch.nn.Module:
    """A frozen `cast_copy` (eval mode, no gradients): the KL reference, a generation copy."""
    return cast_copy(model, dtype, device, empty).eval().requires_grad_(False)
