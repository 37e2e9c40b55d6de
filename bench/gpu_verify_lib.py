"""What the phases of bench/gpu_verify.py share: shapes, memory figures, model building, the GRPO step, the planner.

Imports torch, transformers and, from coevo, only modules whose whole import chain is torch, transformers and the
standard library (coevo.core.grpo, coevo.train.device_memory, coevo.train.precision, coevo.train.recompute,
coevo.train.public_configs): it runs on a bare torch + transformers machine. The planner (coevo.train.gpu_plan)
needs omegaconf and Hydra: `planner_*` import it when called and otherwise return why it is unavailable.
"""
from __future__ import annotations

import math
import resource
from dataclasses import dataclass
from typing import Any, Optional

import torch
from transformers import AutoModelForCausalLM

from coevo.core.grpo import clipped_surrogate_loss, sequence_token_logprobs
from coevo.train.public_configs import public_config

try:  # torch >= 2.6; older releases keep FSDP2 under _composable
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - depends on the installed torch
    from torch.distributed._composable.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

GB = 1e9  # figures are GB of 10^9 bytes, as coevo.plan prints them
BIG = "Qwen/Qwen2.5-7B-Instruct"  # the headline solver (configs/model/qwen2.5-7b.yaml)
MID = "Qwen/Qwen2.5-3B-Instruct"  # the 3B shape (configs/model/qwen2.5-3b.yaml)
HEADLINE = ["proposer=qwen3-4b", "solver=qwen2.5-7b", "rollout=vllm"]  # docs/scale.md's first-node command
SOLVER_RANKS = 4  # solver.num_gpus of configs/model/qwen2.5-7b.yaml (tests/bench/test_gpu_verify.py checks it)
VLLM_UTILIZATION = 0.35  # its gpu_memory_utilization (checked there too)
# The planner's LoRA suggestion and the paper preset's ranker: rank 64, LoraConfig's default alpha and targets.
LORA_RANK, LORA_ALPHA = 64, 32.0
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY_MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512}


@dataclass(frozen=True)
class Sizes:
    """The shapes every phase runs at: the real ones, or `--tiny`'s (same code, hidden 64 and 2 layers)."""

    startup: dict  # config changes of the 7B start-up replay
    startup_note: str
    mid: dict  # config changes of the 3B phases (their layer count may still shrink to fit: `fit_layers`)
    rows: int  # update batch: rows x seq tokens, the last `completion` of each loss-masked
    seq: int
    completion: int
    gen_rows: int  # HF generation
    gen_prompt: int
    gen_new: int
    score_rows: int  # pi_old mismatch: sampled rows and their new tokens
    score_new: int
    lora_rank: int
    lora_alpha: float = LORA_ALPHA
    lrs: tuple = (1e-6, 1e-5)
    tiny: bool = False


REAL = Sizes(startup={"num_hidden_layers": 28 // SOLVER_RANKS, "vocab_size": 152064 // SOLVER_RANKS},
             startup_note=(f"the Qwen2.5-7B config with num_hidden_layers 28->{28 // SOLVER_RANKS} and vocab_size "
                           f"152064->{152064 // SOLVER_RANKS}: 1/{SOLVER_RANKS} of its parameters, i.e. one rank's "
                           f"shard bytes of the {SOLVER_RANKS}-rank headline solver, replayed at world size 1 (a "
                           "real rank also holds a 4-rank NCCL group's buffers, and its largest parameters, the "
                           "embeddings in flight at start-up and gathered at sync, are 4x the replay's)"),
             mid={}, rows=4, seq=2048, completion=512, gen_rows=32, gen_prompt=128, gen_new=128, score_rows=16,
             score_new=128, lora_rank=LORA_RANK)
TINY = Sizes(startup=TINY_MODEL, startup_note="tiny (--tiny): the Qwen2.5-7B config at hidden 64, 2 layers, vocab 512",
             mid=TINY_MODEL, rows=2, seq=32, completion=8, gen_rows=4, gen_prompt=8, gen_new=8, score_rows=4,
             score_new=8, lora_rank=8, tiny=True)


@dataclass
class Ctx:
    """Where the phases run: the device, whether compute and serving are bf16, the sizes."""

    device: torch.device
    bf16: bool  # bf16 autocast, bf16 FSDP gathers, bf16 reference and served weights (the CUDA code path)
    sizes: Sizes

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def serving(self) -> torch.dtype:
        return torch.bfloat16 if self.bf16 else torch.float32

    def autocast(self) -> torch.autocast:
        """The update's compute context: bf16 autocast over fp32 master weights (coevo/train/precision.py)."""
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


def gb(n: float) -> float:
    """Bytes as GB to 4 significant digits (tiny shapes' figures stay visible)."""
    return float(f"{n / GB:.4g}")


def _meminfo(key: str) -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(f"/proc/meminfo has no {key}")


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def free_total(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of the device; on the CPU, the host's MemAvailable and MemTotal."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    return _meminfo("MemAvailable"), _meminfo("MemTotal")


def held_bytes(device: torch.device) -> int:
    """Bytes this process holds now: CUDA allocated, or on the CPU its RSS."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else _rss()


def memory(device: torch.device) -> dict:
    """Now: CUDA allocated / reserved / free / total, or on the CPU the process RSS and the host's available RAM."""
    free, total = free_total(device)
    if device.type == "cuda":
        return {"allocated_gb": gb(torch.cuda.memory_allocated(device)),
                "reserved_gb": gb(torch.cuda.memory_reserved(device)), "free_gb": gb(free), "total_gb": gb(total)}
    return {"rss_gb": gb(_rss()), "host_available_gb": gb(free), "host_total_gb": gb(total)}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak(device: torch.device) -> dict:
    """Peak since `reset_peak`: CUDA allocated and reserved; on the CPU the process's peak RSS (since it started)."""
    if device.type == "cuda":
        return {"peak_allocated_gb": gb(torch.cuda.max_memory_allocated(device)),
                "peak_reserved_gb": gb(torch.cuda.max_memory_reserved(device))}
    return {"peak_rss_gb": gb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)}


def model_config(name: str, changes: dict) -> Any:
    """The public config of `name` with `changes` (the sizes' and any layer cut); never read from a hub."""
    config = public_config(name, **changes)
    if config is None:
        raise ValueError(f"{name} has no public config values in coevo/train/public_configs.py")
    return config


def build(config: Any, device: torch.device | str, dtype: torch.dtype = torch.float32, seed: int = 0) -> Any:
    """A causal LM of `config` with random weights made on `device` (fast on a GPU), in eval mode, in `dtype`."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    return model.to(dtype).eval()


@torch.no_grad()
def host_model(name: str, changes: dict, seed: int = 0) -> Any:
    """Random fp32 weights of `config` on the host, drawn tensor by tensor as HF's init draws them (matrices
    N(0, initializer_range), norms 1, biases 0): its per-module init is ~3x slower on a CPU, and rank 0's host copy
    is 7.6 GB here. Buffers (rotary frequencies) come from a layerless twin built normally: `to_empty` leaves
    them uninitialised. The model is `name`'s public config with `changes`."""
    config = model_config(name, changes)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    for key, param in model.named_parameters():
        if param.dim() > 1:
            param.normal_(0.0, float(config.initializer_range))
        else:
            param.fill_(1.0 if "norm" in key else 0.0)
    twin = AutoModelForCausalLM.from_config(model_config(name, {**changes, "num_hidden_layers": 0, "vocab_size": 2,
                                                                "intermediate_size": 1}))
    twin_buffers = dict(twin.named_buffers())
    for key, buffer in model.named_buffers():
        if key not in twin_buffers:
            raise ValueError(f"host_model: buffer {key} is not in the layerless twin: cannot initialise it")
        buffer.copy_(twin_buffers[key])
    return model.eval()


def count_params(config: Any) -> int:
    """Parameters of `config`'s model, built on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def fit_layers(ctx: Ctx, name: str, changes: dict, bytes_per_param: float) -> tuple[dict, str]:
    """`changes` plus, on a device too small for every layer at `bytes_per_param` (+10 %), half the layers
    (repeatedly) so the phase fits 90 % of free memory; returns (changes, what was done and why)."""
    config = model_config(name, changes)
    layers = int(config.num_hidden_layers)
    if not ctx.cuda:
        return changes, f"{layers} layers (all)"
    total = count_params(config)
    per_layer = (total - count_params(model_config(name, {**changes, "num_hidden_layers": 0}))) / layers
    free = free_total(ctx.device)[0]
    kept = layers
    while kept > 1 and (total - (layers - kept) * per_layer) * bytes_per_param * 1.1 > 0.9 * free:
        kept //= 2
    if kept == layers:
        return changes, f"{layers} layers (all)"
    return {**changes, "num_hidden_layers": kept}, (f"{kept} of {layers} layers: all of them at {bytes_per_param:g} "
                                                    f"bytes a parameter need more than 90 % of {gb(free)} GB free")


class Scorer(torch.nn.Module):
    """coevo/train/policy.py `TokenLogprobs` (not importable here: policy.py needs omegaconf): the one call the
    update makes, and the FSDP2 root coevo/train/sharded.py shards (embeddings, norm and head gathered by it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return sequence_token_logprobs(self.model, ids, attn, positions=mask)


def mixed_policy(ctx: Ctx) -> Optional[MixedPrecisionPolicy]:
    """coevo/train/sharded.py's: bf16 gathers and fp32 gradient reduction under bf16, else none (fp32)."""
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if ctx.bf16 else None


def shard(scorer: Scorer, mixed: Optional[MixedPrecisionPolicy]) -> None:
    """coevo/train/sharded.py `shard_scorer`: each decoder layer, then the root; gradients summed over ranks."""
    kwargs = {"mp_policy": mixed} if mixed is not None else {}
    for layer in scorer.model.base_model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(scorer, **kwargs)
    for module in scorer.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if hasattr(module, "set_force_sum_reduction_for_comms"):  # absent before torch 2.8: a mean at world 1
                module.set_force_sum_reduction_for_comms(True)


def full_tensor(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """coevo/train/sharded.py `_full_tensor`: the shard cast to `dtype`, then all-gathered (a collective)."""
    local = param.detach().to(dtype)
    return local.full_tensor() if isinstance(local, DTensor) else local


def token_batch(ctx: Ctx, vocab: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """(ids, attention mask, loss mask [rows, seq-1] over the last `completion` tokens, advantages +1/-1)."""
    s = ctx.sizes
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (s.rows, s.seq), generator=g)
    mask = torch.zeros(s.rows, s.seq - 1, dtype=torch.long)
    mask[:, s.seq - 1 - s.completion:] = 1
    adv = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(s.rows)])
    return tuple(t.to(ctx.device) for t in (ids, torch.ones_like(ids), mask, adv))


def grpo_backward(ctx: Ctx, scorer: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> float:
    """One GRPO update's forwards and backwards, one row per micro-batch (`micro_batch_size: 1`, the GPU presets'):
    the clipped surrogate on-policy (old log-probs = the forward's own), each micro-batch divided by the batch's
    loss tokens (coevo/train/sharded.py's exact mean). Returns the summed loss."""
    ids, attn, mask, adv = batch
    total = float(mask.sum())
    summed = 0.0
    for i in range(ids.shape[0]):
        with ctx.autocast():
            lp = scorer(ids[i:i + 1], attn[i:i + 1], mask[i:i + 1])
        loss, _ = clipped_surrogate_loss(lp, lp.detach(), adv[i:i + 1], mask[i:i + 1], denom=total)
        loss.backward()
        summed += float(loss.detach())
    return summed


def grad_norm(params: list[torch.nn.Parameter], max_norm: float = 1.0) -> float:
    """Total gradient norm before clipping to `max_norm` (a DTensor under FSDP2: made whole)."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def planner_unavailable() -> Optional[str]:
    """None where coevo's planner imports (it needs omegaconf and Hydra), else why not, in one line."""
    try:
        import coevo.core.config  # noqa: F401
        import coevo.train.gpu_plan  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure: the bare machine's ModuleNotFoundError, mostly
        return f"the planner cannot be imported here ({type(e).__name__}: {e})"
    return None


def planner_startup(ctx: Ctx) -> dict:
    """The planner's headline solver (`HEADLINE`) on one of its GPUs: start-up terms, start-up peak, vLLM's start
    check, for a GPU of this device's size (on the CPU: the cluster's configured size)."""
    why = planner_unavailable()
    if why:
        return {"unavailable": why}
    from coevo.core.config import compose, to_object
    from coevo.train.gpu_plan import plan_roles

    overrides = list(HEADLINE)
    if ctx.cuda:
        overrides.append(f"cluster.gpu_memory_gb={free_total(ctx.device)[1] / GB:.2f}")
    plan = next(p for p in plan_roles(to_object(compose(overrides))) if p.role == "solver").to_record()
    return {"overrides": overrides, **{k: plan[k] for k in ("startup_gb", "startup_peak_gb", "vllm_start")}}


def planner_update(ctx: Ctx, config: Any, lora_rank: int = 0) -> dict:
    """The planner's terms for one GPU's update of `config`'s shape at this batch (one row per micro-batch,
    checkpointing, no KL reference; LoRA: a bf16 base under an fp32 adapter), GB: what `peak_allocated_gb`
    is compared with (the engine's share and the CUDA context are in neither)."""
    why = planner_unavailable()
    if why:
        return {"unavailable": why}
    from coevo.core.config import compose, to_object
    from coevo.train.gpu_plan import role_plan
    from coevo.train.shapes import adapter_parameters, shape_of

    s = ctx.sizes
    overrides = ["solver=qwen2.5-3b", "rollout=hf", "run.plan_check=false", "solver.num_gpus=1",
                 "solver.micro_batch_size=1", "solver.gradient_checkpointing=true", "solver.kl_coef=0",
                 f"solver.max_episode_tokens={s.seq}", f"solver.max_prompt_tokens={s.seq}", "solver.max_turns=1",
                 f"solver.max_new_tokens={s.completion}"]
    if lora_rank:
        overrides += [f"solver.lora.rank={lora_rank}", f"solver.lora.alpha={s.lora_alpha}", "solver.dtype=bfloat16"]
    cfg = to_object(compose(overrides))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    gpu_bytes = free_total(ctx.device)[1] if ctx.cuda else int(cfg.cluster.gpu_memory_gb * GB)
    plan = role_plan(cfg, "solver", cfg.solver, shape_of(meta), adapter_parameters(meta, cfg.solver.lora), gpu_bytes)
    terms = {k: v for k, v in plan.terms.items() if k in ("weights", "grads", "optimizer", "reference")}
    terms["update"] = plan.transient["update"]
    return {"terms_gb": {k: gb(v) for k, v in terms.items()}, "total_gb": gb(sum(terms.values()))}


def precondition(free: int, total: int, utilization: float = VLLM_UTILIZATION) -> dict:
    """vLLM's start check as the planner computes it without vLLM: free >= ceil(utilization x total)."""
    requested = math.ceil(total * utilization)
    return {"utilization": utilization, "free_gb": gb(free), "requested_gb": gb(requested), "ok": free >= requested}
