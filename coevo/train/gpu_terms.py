"""The GPU planner's start-up, weight-sync and checkpoint terms, and vLLM's free-memory precondition.

coevo/train/gpu_plan.py builds each role's steady terms; this module derives what the role holds
at other moments, per rank (rank 0, the busiest: its host loads the model, and it always generates), in bytes:
- start-up (`startup_terms`): the trainer state is built before any engine starts. A sharded role
  (`num_gpus = n > 1`, coevo/train/sharded.py) loads the fp32 model on rank 0's HOST (not its GPU),
  the other ranks build it on `meta`; each rank's device holds its shards of the weights (P x 4 / n),
  of the KL reference (bf16 under `bf16_autocast`, P x 2 / n) and AdamW's two fp32 moments
  (P x 8 / n, allocated at start; the gradients of that allocation step are freed, so none are
  held), the CUDA context, each rank's bf16 generation copy with `engine=hf`, and while the weights are
  broadcast from rank 0 (`broadcast`) two of the largest parameter in the load dtype (one being
  scattered, one in flight). A role on one GPU (or a share of one): its weights, the reference
  (made one parameter at a time: no second full copy), the moments and the context;
- the engine start (`engine_start`): a vLLM engine starts after that state is built and the
  cached blocks went back (`empty_cache`); except with `weight_sync=inprocess` (what `auto` is on
  CUDA) it runs in a process of its own, whose CUDA context exists before it measures. vLLM
  refuses to start when the free memory it measures is below `gpu_memory_utilization` x the
  device's total (vllm/v1/worker/utils.py `request_memory`, fed a `MemorySnapshot`). The planner
  builds that snapshot from its own figures and calls vLLM's rule, so the rule moves with the
  installed release; where vLLM cannot be imported or called, the same inequality is computed
  here and the plan's notes say so. Rank 0's host holds the loaded model at start and, for a vLLM
  engine in its own process, the served model staged in /dev/shm to start from (`startup_host`);
- weight sync (`sync_terms`): one parameter at a time is cast to the serving dtype and gathered
  (`full_tensor()`, every rank), so the device holds the largest parameter twice (the gather's
  input and output; a bound for one GPU's cast); `<role>.weight_sync=tmpfs` also stages the whole
  model (lm_head explicit, as vLLM runs untied) in the serving dtype in /dev/shm on rank 0: host RAM.
  A LoRA role's merged weights are built whole on its device first (`sync_terms`);
- checkpoints (`checkpoint_terms`): a sharded role writes per-rank shards with
  torch.distributed.checkpoint; ASSUMED: each rank stages at most its own shards of the weights and
  optimizer state on the host, nothing extra on the device. A role on one GPU saves from the device
  (HF `save_pretrained` + `torch.save` of the optimizer): its trained weights and moments on the host.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

from coevo.core.config import PolicyConfig
from coevo.train.shapes import ModelShape

CUDA_CONTEXT = 1 << 30  # a torch process's CUDA context, cuBLAS/cuDNN workspaces (assumed, ~0.5-1 GiB in practice)
HELD_AT_START = ("weights", "reference", "optimizer", "cuda_context", "generation_copy")
BROADCAST_IN_FLIGHT = 2  # parameters of the rank-0 broadcast on a device at once: one scattered, one arriving
GATHER_COPIES = 2  # a sync's gather holds one parameter twice: the cast shard gathered in, the full tensor out
VLLM_RULE = "vllm.v1.worker.utils.request_memory"


def largest_parameter(shape: ModelShape) -> int:
    """Elements of the model's largest parameter: the embedding (or untied LM head), or an MLP projection."""
    return max(shape.vocab * shape.hidden, shape.hidden * shape.intermediate)


def startup_terms(terms: dict[str, int], shape: ModelShape, ranks: int, load_bytes: int) -> dict[str, int]:
    """Device bytes per rank while the trainer state is built, from the role's steady `terms`.

    The held terms at start (`HELD_AT_START`: no gradients, no engine), plus for a sharded role
    (`ranks` > 0) the broadcast's `BROADCAST_IN_FLIGHT` largest parameters in `load_bytes` each.
    """
    start = {k: v for k, v in terms.items() if k in HELD_AT_START}
    if ranks:
        start["broadcast"] = BROADCAST_IN_FLIGHT * largest_parameter(shape) * load_bytes
    return start


def weight_sync_mode(policy: PolicyConfig) -> str:
    """`<role>.weight_sync` as a GPU engine resolves it: `auto` is `inprocess` on a CUDA build of vLLM."""
    mode = str(policy.weight_sync)
    return "inprocess" if mode == "auto" else mode


def engine_process(policy: PolicyConfig) -> bool:
    """Whether a vLLM engine runs in a process of its own (with its own CUDA context): all but `inprocess`."""
    return str(policy.engine) == "vllm" and weight_sync_mode(policy) != "inprocess"


def served_bytes(shape: ModelShape, serving_bytes: int) -> int:
    """The model as vLLM loads it: untied (lm_head explicit, engines/vllm_weights.py), in `serving_bytes`."""
    return (shape.params + (shape.vocab * shape.hidden if shape.tied else 0)) * serving_bytes


def startup_host(policy: PolicyConfig, shape: ModelShape, dtype_bytes: int, serving_bytes: int) -> int:
    """Rank 0's host RAM at start-up: the loaded model in its dtype (a sharded role's rank 0 keeps it there; one
    GPU's is loaded there, then moved), plus for a vLLM engine in its own process (`weight_sync` tmpfs or ipc) the
    served model staged in /dev/shm to start from; an in-process engine starts on dummy weights and is synced."""
    staged = served_bytes(shape, serving_bytes) if engine_process(policy) else 0  # inprocess starts on dummy weights
    return shape.params * dtype_bytes + staged


def sync_terms(policy: PolicyConfig, shape: ModelShape, ranks: int, serving_bytes: int,
               dtype_bytes: int) -> tuple[int, int]:
    """(device, host) bytes of one weight sync, beside what the role holds after its update.

    None for a frozen role (never updated) or an HF role on one GPU (it generates with the trained
    model itself); else the gather's `GATHER_COPIES` largest parameters in `serving_bytes`, and with
    `weight_sync=tmpfs` the served model (`served_bytes`) in /dev/shm on rank 0's host. A LoRA role
    sends merged weights, which coevo/train/lora.py `merged_state_dict` builds all at once: every
    non-embedding parameter (what the default targets wrap, an upper bound) in the base's `dtype_bytes`,
    plus one layer's fp32 sum (W, B A and W + B A).
    """
    vllm = str(policy.engine) == "vllm"
    if policy.frozen or not (vllm or ranks):
        return 0, 0
    device = GATHER_COPIES * largest_parameter(shape) * serving_bytes
    if policy.lora.rank > 0:
        embeddings = shape.vocab * shape.hidden * (1 if shape.tied else 2)
        device = (shape.params - embeddings) * dtype_bytes + 3 * shape.hidden * shape.intermediate * 4
    host = served_bytes(shape, serving_bytes) if vllm and weight_sync_mode(policy) == "tmpfs" else 0
    return device, host


def checkpoint_terms(policy: PolicyConfig, shape: ModelShape, adapter: int, ranks: int,
                     dtype_bytes: int) -> tuple[int, int]:
    """(device, host) bytes of one save: the trained weights (the adapter's fp32 with LoRA, else every
    parameter in `dtype_bytes`) plus AdamW's two fp32 moments, per rank when sharded; none when frozen."""
    if policy.frozen:
        return 0, 0
    lora = policy.lora.rank > 0
    trained = adapter if lora else shape.params
    host = (adapter * 4 if lora else shape.params * dtype_bytes) + trained * 8
    return 0, math.ceil(host / ranks) if ranks else host


@dataclass(frozen=True)
class EngineStart:
    """vLLM's start-up check on one role's GPU: the free memory it would measure against what it requests."""

    free: int  # bytes free when the engine measures: the device minus what is held then
    requested: int  # gpu_memory_utilization x the device's total, as vLLM rounds it
    ok: bool
    rule: str  # VLLM_RULE and its release, or why the inequality was computed here
    message: str = ""  # vLLM's own refusal, when it refuses

    @property
    def fallback(self) -> bool:
        return not self.rule.startswith(VLLM_RULE)


class _Unusable(Exception):
    """vLLM's check cannot be fed on this install (its snapshot or config types changed)."""


@functools.lru_cache(maxsize=1)
def _vllm_rule() -> tuple[Optional[Callable[[int, int, float], int]], str]:
    """vLLM's own check as (call(total, free, utilization) -> requested bytes, rule name), or (None, why not).

    Imported once per process (about 10 s: vLLM's package), only for roles with `engine=vllm`.
    """
    try:
        import vllm
        from vllm.config import CacheConfig
        from vllm.utils.mem_utils import MemorySnapshot
        from vllm.v1.worker.utils import request_memory
    except Exception as e:  # noqa: BLE001 - any import failure (none installed, a broken CPU build) falls back
        return None, f"{type(e).__name__}: {e}"

    def call(total: int, free: int, utilization: float) -> int:
        try:  # a snapshot with the planner's figures, measured on no device (the name only labels messages)
            snapshot = MemorySnapshot(device="cuda:0", auto_measure=False, total_memory=total, free_memory=free,
                                      cuda_memory=total - free)
            cache = CacheConfig(gpu_memory_utilization=utilization)
        except Exception as e:  # noqa: BLE001 - its types moved: not a refusal
            raise _Unusable(f"{type(e).__name__}: {e}") from e
        return int(request_memory(snapshot, cache))  # ValueError: vLLM refuses to start

    return call, f"{VLLM_RULE} (vllm {getattr(vllm, '__version__', '?')})"


def engine_start(total: int, free: int, utilization: float) -> EngineStart:
    """Whether vLLM would start on a device of `total` bytes with `free` bytes free, asked for `utilization`.

    vLLM's `request_memory` decides (it raises ValueError to refuse); where it cannot be imported
    or called, `free >= ceil(total x utilization)` is computed here and `rule` says why (not silent).
    """
    requested = math.ceil(total * utilization)
    call, rule = _vllm_rule()
    if call is not None:
        try:
            return EngineStart(free, call(total, free, utilization), True, rule)
        except _Unusable as e:
            rule = str(e)
        except ValueError as e:  # vLLM's refusal, in its words
            return EngineStart(free, requested, False, rule, str(e))
        except Exception as e:  # noqa: BLE001 - an API that moved: the same inequality, said in `rule`
            rule = f"{type(e).__name__}: {e}"
    return EngineStart(free, requested, free >= requested,
                       f"computed here, free >= ceil(gpu_memory_utilization x total): {VLLM_RULE} failed ({rule})")
