"""GPU memory planner: what each role holds on one of its GPUs, before anything starts.

`python -m coevo.plan` prints `plan_roles`' records; `coevo.run` refuses a plan that does not
fit (`check_gpu_plan`, `run.plan_check`). It models the code as it runs today: a policy with
`num_gpus = 1` keeps its whole model on its GPU, a fractional `num_gpus` gets that share of one
GPU, and `num_gpus = n > 1` is n ranks sharded with FSDP2 (coevo/train/sharded.py), planned on
rank 0 (each rank also generates its share of the rollouts: `generating_ranks`, all of them but
for vLLM in its own process, rank 0 alone); the hardware is `cluster.*`. It plans the roles as validation
placed them (coevo/core/config.py `resolve_placement`): an unset `ranker.num_gpus` takes the GPUs the
other roles leave, and `engine=auto` is vLLM on a GPU, whatever machine the plan is made on.
Per GPU role, in bytes (`GpuPlan.terms`):
- `weights`: parameters x dtype bytes (fp32 masters for a trained full fine-tune; with LoRA the
  frozen base in its dtype plus the fp32 adapter);
- `grads`, `optimizer`: fp32 gradients and AdamW's two fp32 moments of the trained parameters
  (all of them, or the adapter's);
- `reference`: the KL copy (`kl_coef > 0`, full fine-tuning), bf16 under `bf16_autocast`;
  LoRA's reference is the base with the adapter disabled: no copy;
- `engine`: vLLM's `gpu_memory_utilization` x the GPU (its weights and KV cache), held
  throughout; with `sleep_mode` it is freed for each update, so it is a transient beside `update`;
- `cuda_context`: the trainer process's CUDA context and kernels (`CUDA_CONTEXT`, assumed);
  `engine_context` (engine=vllm in a process of its own: `weight_sync` tmpfs or ipc): that process's,
  outside its utilization share;
- sharded (`num_gpus = n > 1`): `weights`, `grads`, `optimizer` and `reference` are divided by n
  (FSDP2 keeps 1/n of each on every rank); activations, the engine and the CUDA context stay per
  GPU; every rank adds `generation_copy` for `engine=hf` (its own unsharded weights to generate with,
  bf16 under `bf16_autocast`); the update's autocast copy of the weights becomes the units FSDP
  gathers (`gathered_bytes`: the root's embeddings/norm/head and two decoder layers in compute
  precision, plus their fp32 gradients before the reduce-scatter);
- transient, largest one counted: `update` (one micro-batch's saved activations, bf16 under
  autocast, with or without gradient checkpointing; the LM head's logits at the completion
  positions only, coevo/core/grpo.py; the autocast bf16 copy of fp32 weights) or
  `generation` (HF engine: KV cache of the rows of one generate call, `generation_rows` of them at most)
  or `weight_sync` (the sync's gather after an update, `sync["device"]`; plus the engine under sleep_mode).
Other moments (coevo/train/gpu_terms.py has the model of each): `startup` (per rank while the trainer
state is built, before any engine: `startup_peak` must fit too), `engine_start` (vLLM's own check that
the memory free when it starts covers `gpu_memory_utilization` x the GPU: a plan that fails it does not
fit), `sync` and `checkpoint` (device and host bytes of one weight sync and one save) and `host` (rank
0's host RAM at start-up, sync and save; reported, not checked against anything).
The activation constants are coevo/train/memory.py's, measured on the CPU; on a GPU they are
unverified until `bench/update.py` measures them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from coevo.core.config import CoevoConfig, PolicyConfig, gpus_asked
from coevo.train.gpu_terms import (
    CUDA_CONTEXT,
    EngineStart,
    checkpoint_terms,
    engine_process,
    engine_start,
    startup_host,
    startup_terms,
    sync_terms,
)
from coevo.train.memory import (
    DTYPE_BYTES,
    activation_bytes,
    generated_rows,
    generation_bytes,
    loaded_policies,
    rows_at_once,
    sequence_tokens,
)
from coevo.train.preflight import PreflightError, check_sources, locate
from coevo.train.shapes import ModelShape, adapter_parameters, meta_model, public_config, shape_of
from coevo.train.sharded import shard_count

GB = 1e9
HEADROOM = 0.05  # share of a GPU left to allocator fragmentation: a plan above 95 % does not fit
LORA_SUGGESTION = 64  # rank the planner tries when full fine-tuning does not fit
GENERATION_ROWS_SUGGESTION = 32  # HF rows per generate call the planner tries when the KV cache does not fit


class PlanError(PreflightError):
    """A role does not fit its GPUs (or the roles' GPUs exceed the cluster); the message says what would."""


@dataclass
class GpuPlan:
    """One role's plan on one of its GPUs."""

    role: str
    gpus: float
    budget: int  # bytes of GPU memory this role may use on one GPU
    terms: dict[str, int] = field(default_factory=dict)
    transient: dict[str, int] = field(default_factory=dict)
    startup: dict[str, int] = field(default_factory=dict)  # device bytes per rank while the state is built
    engine_start: Optional[EngineStart] = None  # vLLM's free-memory precondition (engine=vllm)
    sync: dict[str, int] = field(default_factory=dict)  # one weight sync: "device", "host" bytes
    checkpoint: dict[str, int] = field(default_factory=dict)  # one save: "device", "host" bytes
    host: dict[str, int] = field(default_factory=dict)  # rank 0's host RAM at start-up, sync, checkpoint
    notes: list[str] = field(default_factory=list)
    generating_ranks: int = 1  # ranks that generate rollouts (a sharded role's data-parallel generation)
    would_fit: list[str] = field(default_factory=list)  # the fewest cumulative overrides that fit (`_ladder`)

    @property
    def total(self) -> int:
        return sum(self.terms.values()) + max(self.transient.values(), default=0)

    @property
    def startup_peak(self) -> int:
        return sum(self.startup.values())

    @property
    def usable(self) -> float:
        return self.budget * (1 - HEADROOM)

    @property
    def fits(self) -> bool:
        """Steady peak and start-up peak within the usable budget, and a vLLM engine that would start."""
        starts = self.engine_start is None or self.engine_start.ok
        return self.total <= self.usable and self.startup_peak <= self.usable and starts

    def to_record(self) -> dict:
        """The JSON line of `coevo.plan`: sizes in GB (10^9 bytes)."""
        def gb(terms: dict[str, int]) -> dict[str, float]:
            return {k: round(v / GB, 2) for k, v in terms.items()}

        start = self.engine_start
        vllm = None if start is None else {"free_gb": round(start.free / GB, 2), "requested_gb": round(
            start.requested / GB, 2), "ok": start.ok, "rule": start.rule}
        return {"role": self.role, "gpus": self.gpus, **gb({**self.terms, **self.transient}),
                "total_per_gpu_gb": round(self.total / GB, 2), "gpu_budget_gb": round(self.budget / GB, 2),
                "startup_peak_gb": round(self.startup_peak / GB, 2), "startup_gb": gb(self.startup),
                "vllm_start": vllm, "sync_gb": gb(self.sync), "checkpoint_gb": gb(self.checkpoint),
                "host_gb": gb(self.host), "generating_ranks": self.generating_ranks, "fits": self.fits,
                "would_fit": self.would_fit, "notes": self.notes}


def completion_tokens(cfg: CoevoConfig, role: str, policy: PolicyConfig) -> int:
    """Loss-masked tokens of one sequence, where the LM head runs: every solver turn, one call otherwise."""
    turns = cfg.solver.max_turns if role == "solver" else 1
    return min(sequence_tokens(cfg, role, policy), turns * policy.max_new_tokens)


def _trained_terms(plan: GpuPlan, policy: PolicyConfig, shape: ModelShape, adapter: int, bf16: bool) -> None:
    """weights / grads / optimizer / reference of a trained policy (full fine-tuning or LoRA)."""
    size = DTYPE_BYTES[str(policy.dtype)]
    if policy.lora.rank > 0:
        plan.terms["weights"] = shape.params * size + adapter * 4
        trained = adapter
    else:
        plan.terms["weights"] = shape.params * size
        trained = shape.params
        if policy.kl_coef > 0:
            plan.terms["reference"] = shape.params * (2 if bf16 else size)
    plan.terms["grads"] = trained * 4
    plan.terms["optimizer"] = trained * 8


def gathered_bytes(shape: ModelShape, compute: int) -> int:
    """What FSDP2 holds unsharded during a sharded update: the root's parameters (embeddings, final norm,
    LM head) for the whole forward/backward and two decoder layers (one computing, one prefetched), in
    `compute` bytes, plus fp32 gradients of the root and of one layer before their reduce-scatter."""
    root = shape.vocab * shape.hidden * (1 if shape.tied else 2) + shape.hidden
    layer = max(0, shape.params - root) // max(1, shape.layers)
    return (root + 2 * layer) * compute + (root + layer) * 4


def _shard_terms(plan: GpuPlan, policy: PolicyConfig, shape: ModelShape, ranks: int, bf16: bool) -> None:
    """Divide the sharded terms by `ranks`; add each rank's generation copy (HF engine)."""
    for key in ("weights", "grads", "optimizer", "reference"):
        if key in plan.terms:
            plan.terms[key] = math.ceil(plan.terms[key] / ranks)
    if str(policy.engine) == "hf":
        plan.terms["generation_copy"] = shape.params * (2 if bf16 else DTYPE_BYTES[str(policy.dtype)])


def role_plan(cfg: CoevoConfig, role: str, policy: PolicyConfig, shape: ModelShape, adapter: int,
              gpu_bytes: int, with_proposer: bool = True) -> GpuPlan:
    """The plan of one GPU role (`adapter`: its LoRA parameter count at `policy.lora.rank`)."""
    plan = GpuPlan(role, float(policy.num_gpus), int(gpu_bytes * min(1.0, float(policy.num_gpus))))
    bf16 = bool(policy.bf16_autocast)  # the planner assumes a bf16-capable GPU (A100/H100/H200)
    ranks = shard_count(policy, role)  # refuses what cannot be sharded, naming the key
    size = DTYPE_BYTES[str(policy.dtype)]
    if policy.frozen:
        plan.terms["weights"] = shape.params * size
    else:
        _trained_terms(plan, policy, shape, adapter, bf16)
        compute = 2 if bf16 else size
        rows = max(1, policy.micro_batch_size)
        cast = shape.params * 2 if bf16 and size == 4 else 0  # autocast keeps a bf16 copy of each weight it used
        if ranks:  # FSDP2 gathers a few units at a time (in bf16 with its mixed precision), never the whole model
            cast = gathered_bytes(shape, compute)
        # Checkpointed layer inputs stay fp32 (the residual stream); the LM head runs at completion positions only.
        plan.transient["update"] = cast + activation_bytes(
            shape, sequence_tokens(cfg, role, policy) * rows, compute, policy.gradient_checkpointing, input_bytes=4,
            logit_tokens=completion_tokens(cfg, role, policy) * rows)
    if str(policy.engine) == "vllm":  # sleep_mode frees it for the update: the larger of the two counts, not both
        (plan.transient if policy.sleep_mode else plan.terms)["engine"] = int(policy.gpu_memory_utilization * gpu_bytes)
        if engine_process(policy):  # its own process's context, outside its utilization share
            plan.terms["engine_context"] = CUDA_CONTEXT
    else:
        rows = rows_at_once(policy, generated_rows(cfg, role, with_proposer))
        plan.transient["generation"] = generation_bytes(shape, 2 if bf16 else size, rows,
                                                        sequence_tokens(cfg, role, policy))
    plan.terms["cuda_context"] = CUDA_CONTEXT
    if ranks:
        _shard_terms(plan, policy, shape, ranks, bf16)
        plan.generating_ranks = 1 if engine_process(policy) else ranks  # coevo/train/sharded.py: data-parallel
        plan.notes.append(f"{role}.num_gpus={ranks}: FSDP2 shards weights, gradients, optimizer state and reference "
                          f"over {ranks} GPUs; activations and the engine are per GPU; planned: rank 0")
    _moment_terms(plan, policy, shape, adapter, ranks, bf16, gpu_bytes)
    return plan


def _moment_terms(plan: GpuPlan, policy: PolicyConfig, shape: ModelShape, adapter: int, ranks: int, bf16: bool,
                  gpu_bytes: int) -> None:
    """Start-up, vLLM's precondition, weight sync and checkpoint (coevo/train/gpu_terms.py), from the steady terms."""
    size = DTYPE_BYTES[str(policy.dtype)]
    serving = 2 if bf16 else size
    plan.startup = startup_terms(plan.terms, shape, ranks, size)
    sync_device, sync_host = sync_terms(policy, shape, ranks, serving, size)
    plan.sync = {"device": sync_device, "host": sync_host}
    if sync_device:  # after the update; a sleeping engine wakes around the sync: both at once
        plan.transient["weight_sync"] = sync_device + plan.transient.get("engine", 0)
    save_device, save_host = checkpoint_terms(policy, shape, adapter, ranks, size)
    plan.checkpoint = {"device": save_device, "host": save_host}
    plan.host = {"startup": startup_host(policy, shape, size, serving), "sync": sync_host, "checkpoint": save_host}
    if str(policy.engine) != "vllm":
        return
    # What vLLM measures: the trainer state built (the broadcast's buffers gone with empty_cache), an engine
    # process's own CUDA context; on a share of a GPU the other shares are taken.
    held = plan.startup_peak - plan.startup.get("broadcast", 0) + plan.terms.get("engine_context", 0)
    plan.engine_start = engine_start(gpu_bytes, plan.budget - held, float(policy.gpu_memory_utilization))
    if plan.engine_start.fallback:
        plan.notes.append(f"vLLM start-up precondition {plan.engine_start.rule}")
    if plan.budget < gpu_bytes:
        plan.notes.append(f"{plan.role}.num_gpus={plan.gpus:g}: vLLM's free memory assumes the GPU's other "
                          "shares are in use")


def _ladder(role: str, policy: PolicyConfig, cfg: CoevoConfig) -> list[tuple[str, PolicyConfig, CoevoConfig]]:
    """Cumulative changes the planner tries when a role does not fit, cheapest first: each rung
    keeps the ones before it. Returns (the overrides so far, the changed role config, run config)."""
    rungs: list[tuple[str, dict]] = []
    if not policy.frozen and not policy.gradient_checkpointing:
        rungs.append((f"{role}.gradient_checkpointing=true", {"gradient_checkpointing": True}))
    if str(policy.engine) == "hf" and not 0 < policy.generation_rows <= GENERATION_ROWS_SUGGESTION:
        rungs.append((f"{role}.generation_rows={GENERATION_ROWS_SUGGESTION}",  # same samples, smaller KV cache
                      {"generation_rows": GENERATION_ROWS_SUGGESTION}))
    if not policy.frozen and policy.lora.rank == 0 and policy.num_gpus <= 1:  # sharded roles train full weights
        rungs.append((f"{role}.lora.rank={LORA_SUGGESTION} {role}.dtype=bfloat16",
                      {"lora": dataclasses.replace(policy.lora, rank=LORA_SUGGESTION), "dtype": "bfloat16"}))
    if not policy.frozen and policy.micro_batch_size > 1:
        rungs.append((f"{role}.micro_batch_size=1", {"micro_batch_size": 1}))
    if str(policy.engine) == "vllm" and not policy.sleep_mode and not policy.frozen:
        rungs.append((f"{role}.sleep_mode=true", {"sleep_mode": True}))
    if str(policy.engine) == "vllm" and policy.gpu_memory_utilization > 0.2:
        util = round(policy.gpu_memory_utilization / 2, 3)
        rungs.append((f"{role}.gpu_memory_utilization={util:g}", {"gpu_memory_utilization": util}))
    out, texts, changed = [], [], policy
    for text, fields in rungs:
        texts.append(text)
        changed = dataclasses.replace(changed, **fields)
        out.append((" ".join(texts), changed, cfg))
    half = cfg.solver.max_episode_tokens // 2
    if role == "solver" and half >= 512:  # last: it changes what the solver can do, not only how it is stored
        shorter = dataclasses.replace(cfg, solver=dataclasses.replace(changed, max_episode_tokens=half))
        out.append((" ".join(texts + [f"solver.max_episode_tokens={half}"]), shorter.solver, shorter))
    return out


def plan_roles(cfg: CoevoConfig, with_proposer: bool = True, shapes: Optional[dict[str, Any]] = None) -> list[GpuPlan]:
    """A `GpuPlan` for every loaded role with `num_gpus > 0`, suggestions filled in for those that do not fit.

    `shapes`: role -> (ModelShape, meta model) to skip reading model configs (tests).
    """
    gpu_bytes = int(cfg.cluster.gpu_memory_gb * GB)
    plans = []
    for role, policy in loaded_policies(cfg, with_proposer).items():
        if policy.num_gpus <= 0:
            continue
        shape, model = (shapes or {}).get(role) or _shape_and_model(role, policy)
        plan = role_plan(cfg, role, policy, shape, adapter_parameters(model, policy.lora), gpu_bytes, with_proposer)
        for text, changed, changed_cfg in _ladder(role, policy, cfg) if not plan.fits else []:
            adapter = adapter_parameters(model, changed.lora)
            if role_plan(changed_cfg, role, changed, shape, adapter, gpu_bytes, with_proposer).fits:
                plan.would_fit.append(text)
                break
        plans.append(plan)
    return plans


def _shape_and_model(role: str, policy: PolicyConfig) -> tuple[ModelShape, Any]:
    if public_config(policy.model) is None:  # (a checkpoint directory is located without the hub)
        # Not a shipped shape: ask the hub the preflight way (one request, a hard deadline), not
        # through transformers, which retries an unreachable hub for ~25 s before failing.
        try:
            check_sources([locate(role, policy)])
        except PreflightError as e:
            raise PlanError(f"the GPU plan cannot read the config of {role}.model={policy.model}: {e}") from e
    try:
        model = meta_model(policy.model, policy.checkpoint)
    except Exception as e:  # noqa: BLE001 - an unknown hub id offline, a missing dir: say which key
        raise PlanError(f"the GPU plan cannot read the config of {role}.model={policy.model}: {e}. Known offline: "
                        "the shipped presets; else point the key at a local model directory") from e
    return shape_of(model), model


def gpus_needed(cfg: CoevoConfig, with_proposer: bool = True) -> float:
    """GPUs the roles ask for together (`config.gpus_asked`: whole GPUs for num_gpus >= 1, fractional shares
    summed), the ranker's as `config.resolve_placement` decided it."""
    return gpus_asked([p.num_gpus for p in loaded_policies(cfg, with_proposer).values() if p.num_gpus > 0])


def plan_message(plans: list[GpuPlan], cfg: CoevoConfig, with_proposer: bool = True) -> Optional[str]:
    """Why the plan cannot run (a role over its GPU, or more GPUs than the cluster has); None when it can."""
    lines = []
    have = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    need = gpus_needed(cfg, with_proposer)
    if need > have:
        lines.append(f"the roles ask for {need:g} GPUs but cluster.nodes x cluster.gpus_per_node = "
                     f"{cfg.cluster.nodes} x {cfg.cluster.gpus_per_node} = {have}")
    for p in plans:
        if not p.fits:
            lines += _reasons(p, cfg)
    if not lines:
        return None
    return ("coevo: the GPU plan does not fit (python -m coevo.plan with the same overrides prints every term):\n  "
            + "\n  ".join(lines) + "\nSkip this check with run.plan_check=false.")


def _reasons(p: GpuPlan, cfg: CoevoConfig) -> list[str]:
    """Why one role does not fit: its steady peak, its start-up peak, vLLM's precondition; then what would fit."""
    out, usable = [], f"{p.usable / GB:.1f} GB usable of cluster.gpu_memory_gb={cfg.cluster.gpu_memory_gb:g}"
    if p.total > p.usable:
        biggest = sorted({**p.terms, **p.transient}.items(), key=lambda kv: -kv[1])[:3]
        terms = ", ".join(f"{k} {v / GB:.1f}" for k, v in biggest)
        out.append(f"{p.role} needs {p.total / GB:.1f} GB on one GPU, {usable} (largest: {terms} GB)")
    if p.startup_peak > p.usable:
        out.append(f"{p.role} needs {p.startup_peak / GB:.1f} GB per GPU at start-up (before any engine), {usable}; "
                   f"a larger {p.role}.num_gpus shards what it holds then")
    start = p.engine_start
    if start is not None and not start.ok:
        most = max(0.0, math.floor(start.free / (cfg.cluster.gpu_memory_gb * GB) * 1000) / 1000)
        out.append(f"{p.role}'s vLLM engine would refuse to start ({start.rule}): {start.free / GB:.1f} GB free when "
                   f"it starts (after the trainer state) < {start.requested / GB:.1f} GB requested; set "
                   f"{p.role}.gpu_memory_utilization <= {most:g} or a larger {p.role}.num_gpus"
                   + (f". vLLM: {start.message.rstrip('.')}" if start.message else ""))
    fix = (f"fits with {' | '.join(p.would_fit)}" if p.would_fit
           else f"none of the changes the planner tries fits; a larger {p.role}.num_gpus (FSDP2) shares its weights, "
                "gradients and optimizer state out")
    out[-1] += f"; {fix}"
    return out


def check_gpu_plan(cfg: CoevoConfig, with_proposer: bool = True) -> Optional[list[GpuPlan]]:
    """Refuse (PlanError) a run whose GPU roles do not fit; None when no role asks for a GPU or the check is off."""
    if not cfg.run.plan_check or not any(p.num_gpus > 0 for p in loaded_policies(cfg, with_proposer).values()):
        return None
    plans = plan_roles(cfg, with_proposer)
    message = plan_message(plans, cfg, with_proposer)
    if message:
        raise PlanError(message)
    return plans
