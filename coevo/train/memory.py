"""Peak memory of a run, estimated from its config before anything loads.

The estimate is a list of `Term`s, each a number of bytes with the role it belongs to and the
device it lives on, so a GPU planner can sum the same terms per device; `check_run_memory`
applies it to CPU RAM. Per loaded policy (parameter counts come from the model's config,
instantiated on torch's meta device: no weights are read):
- `weights`: parameters x dtype bytes (the training copy; the HF engine generates with it);
- `grads` and `optimizer` (trainable): gradients, and AdamW's two moments, in the parameter
  dtype as torch keeps them (2 x params x 4 bytes for the fp32 presets);
- `reference` (trainable, kl_coef > 0): the frozen copy the KL term compares with;
- with `lora.rank > 0`, `grads` and `optimizer` count the fp32 adapter only (its exact parameter
  count from the meta model, `shapes.adapter_parameters`, as the GPU planner counts it),
  `adapter` its weights, and there is no `reference` (the base with the adapter off is it);
- `engine` (engine=vllm): the engine's share, `gpu_memory_utilization` x the device's memory
  (on CPU its KV cache plus its weight copy, see engines/vllm_weights.py `cpu_kv_cache_bytes`);
- `engine_runtime` (vllm): the EngineCore and Worker processes themselves (`ENGINE_RUNTIME`);
- `sync_staging` (vllm, trainable): the weights written to tmpfs at each weight sync;
- `activations` (trainable): the largest micro-batch's forward activations, saved for the
  backward pass: micro_batch_size x tokens x (layers x (18 hidden + 3 intermediate) x dtype
  bytes + vocab x 4 bytes of logits); tokens = solver.max_episode_tokens (the other roles'
  sequences: prompt + completion, at most that long); with `gradient_checkpointing` only each
  layer's input (hidden x dtype bytes) is kept, plus one layer's activations while it recomputes;
- `generation` (engine=hf): one generate call over every live row of a step (all episodes
  batched per turn), each `tokens` long: the KV cache (layers x 2 x kv_heads x head_dim) plus
  the prefill's intermediates of one layer (10 hidden + 5 intermediate), in the dtype;
- `runtime`: interpreter, torch and tokenizers of each process (`PROCESS_RUNTIME`).
Stages run one at a time (rollouts, then one policy's update, then its weight sync), so the
peak holds every other term plus the largest transient one (`TRANSIENT`).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from coevo.core.config import CoevoConfig, PolicyConfig
from coevo.core.role_config import ranker_policy_config
from coevo.train.shapes import ModelShape, adapter_parameters, meta_model, shape_of

LOG = logging.getLogger("coevo.memory")
GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Saved activations per token and layer, in elements of the model dtype: 13.5k measured for
# SmolLM2-135M (hidden 576, intermediate 1536) in fp32 at 512-1536 tokens, padded or not.
ACT_PER_HIDDEN, ACT_PER_INTERMEDIATE = 18, 3
# HF generation beyond the KV cache, per token: 57 KB measured for SmolLM2 fp32 (16 rows x 528 tokens).
GEN_PER_HIDDEN, GEN_PER_INTERMEDIATE = 10, 5
ENGINE_RUNTIME = 2 * GIB  # vLLM CPU processes beyond KV and weights: EngineCore 0.76 + Worker 1.3 GB (SmolLM2)
PROCESS_RUNTIME = 3 * GIB // 5  # a Python process with torch, transformers and a tokenizer (0.55 GB measured)
TRANSIENT = ("activations", "sync_staging", "generation")


@dataclass(frozen=True)
class Term:
    """One amount of memory the run holds at its peak."""

    role: str  # proposer | solver | ranker | run
    # weights adapter grads optimizer reference engine engine_runtime sync_staging activations generation runtime
    name: str
    bytes: int
    device: str = "cpu"  # cpu | gpu: where it lives (a policy with num_gpus > 0 keeps its tensors on the GPU)
    note: str = ""  # how it was computed, for the refusal message

    @property
    def transient(self) -> bool:
        return self.name in TRANSIENT


def activation_bytes(shape: ModelShape, tokens: int, compute_bytes: int, checkpointing: bool = False,
                     input_bytes: Optional[int] = None, logit_tokens: Optional[int] = None) -> int:
    """Forward activations one micro-batch of `tokens` tokens keeps for backward, fp32 logits included.

    Every layer's activations (18 hidden + 3 intermediate elements per token, `compute_bytes`
    each), or with `checkpointing` each layer's input (`input_bytes`, default `compute_bytes`)
    plus one layer's recomputed activations; logits (vocab x 4 B) at `logit_tokens` positions,
    default every token. The CPU estimate and the GPU planner (coevo/train/gpu_plan.py) both use it.
    """
    layer = (ACT_PER_HIDDEN * shape.hidden + ACT_PER_INTERMEDIATE * shape.intermediate) * compute_bytes
    inputs = shape.layers * shape.hidden * (compute_bytes if input_bytes is None else input_bytes)
    per_token = inputs + layer if checkpointing else shape.layers * layer
    logits = (tokens if logit_tokens is None else logit_tokens) * shape.vocab * 4
    return tokens * per_token + logits


def generation_bytes(shape: ModelShape, dtype_bytes: int, rows: int, tokens: int) -> int:
    """One HF generate call over `rows` sequences of `tokens`: KV cache plus one layer's prefill intermediates."""
    kv = shape.layers * 2 * shape.kv_heads * shape.head_dim
    prefill = GEN_PER_HIDDEN * shape.hidden + GEN_PER_INTERMEDIATE * shape.intermediate
    return rows * tokens * (kv + prefill) * dtype_bytes


def policy_terms(role: str, cfg: PolicyConfig, shape: ModelShape, tokens: int, engine_share_of: int,
                 device: str = "cpu", rows: int = 0, adapter: int = 0) -> list[Term]:
    """The terms of one loaded policy: sequences up to `tokens` long, `rows` of them generated at once.

    `engine_share_of`: the bytes its gpu_memory_utilization is a fraction of; `adapter`: the
    parameters of its LoRA adapter (`shapes.adapter_parameters`), read when `lora.rank > 0`.
    """
    size = DTYPE_BYTES[str(cfg.dtype)]
    weights = shape.params * size
    terms = [Term(role, "weights", weights, device, f"{shape.params / 1e6:.3g}M params x {size} B")]
    if not cfg.frozen:
        lora = cfg.lora.rank > 0
        if lora and adapter <= 0:
            raise ValueError(f"{role}.lora.rank={cfg.lora.rank}: the estimate needs the adapter's parameter count")
        trained = 4 * adapter if lora else weights
        if lora:
            terms.append(Term(role, "adapter", trained, device, f"LoRA rank {cfg.lora.rank}, fp32"))
        act = activation_bytes(shape, max(1, cfg.micro_batch_size) * tokens, size, bool(cfg.gradient_checkpointing))
        terms += [Term(role, "grads", trained, device),
                  Term(role, "optimizer", 2 * trained, device, "AdamW: 2 moments"),
                  Term(role, "activations", act, device, f"micro_batch_size {cfg.micro_batch_size} x {tokens} tokens")]
        if cfg.kl_coef > 0 and not lora:
            terms.append(Term(role, "reference", weights, device, f"kl_coef {cfg.kl_coef}"))
    rows = rows_at_once(cfg, rows)
    if str(cfg.engine) == "hf" and rows > 0:
        terms.append(Term(role, "generation", generation_bytes(shape, size, rows, tokens), device,
                          f"{rows} rows x {tokens} tokens"))
    if str(cfg.engine) == "vllm":
        untied = weights + (shape.vocab * shape.hidden * size if shape.tied else 0)
        share = int(cfg.gpu_memory_utilization * engine_share_of)
        terms += [Term(role, "engine", share, device, f"gpu_memory_utilization {cfg.gpu_memory_utilization}"),
                  Term(role, "engine_runtime", ENGINE_RUNTIME, "cpu", "EngineCore + Worker processes")]
        if not cfg.frozen:
            terms.append(Term(role, "sync_staging", untied, "cpu", "weights in tmpfs during a sync"))
    return terms


def cpu_rank_terms(role: str, policy: PolicyConfig, shape: ModelShape, own: list[Term]) -> list[Term]:
    """What a role sharded over `cpu_ranks` > 1 CPU processes holds beyond its one-process terms `own`.

    Its weights, gradients, optimizer and reference are split over the ranks (the same total), but
    every rank beyond the first also runs its own forward and backward at the same moment (its
    activations, counted always: they coincide) and keeps its own HF generation copy with its rows.
    """
    ranks = int(policy.cpu_ranks) if policy.num_gpus == 0 else 0
    if ranks <= 1:
        return []
    copy = shape.params * DTYPE_BYTES[str(policy.dtype)] if str(policy.engine) == "hf" else 0
    per_rank = copy + sum(t.bytes for t in own if t.name in ("activations", "generation"))
    return [Term(role, "cpu_ranks", (ranks - 1) * per_rank, "cpu",
                 f"{ranks - 1} more CPU rank(s): activations, generation copy and rows each")]


def loaded_policies(cfg: CoevoConfig, with_proposer: bool = True) -> dict[str, PolicyConfig]:
    """Role -> config of every policy the run loads (as `create_actors` and `create_local_actors` do)."""
    roles: dict[str, PolicyConfig] = {"proposer": cfg.proposer} if with_proposer else {}
    roles["solver"] = cfg.solver
    ranker = ranker_policy_config(cfg.ranker, cfg.solver)  # None: no ranker model, or the solver's own
    if ranker is not None:
        roles["ranker"] = ranker
    return roles


def sequence_tokens(cfg: CoevoConfig, role: str, policy: PolicyConfig) -> int:
    """Longest training sequence of `role`: an episode for the solver, prompt + completion otherwise."""
    cap = cfg.solver.max_episode_tokens
    return cap if role == "solver" else min(cap, policy.max_prompt_tokens + policy.max_new_tokens)


def generated_rows(cfg: CoevoConfig, role: str, with_proposer: bool = True) -> int:
    """Sequences `role` generates in one call: every candidate, or every live episode (one ranker call each)."""
    candidates = cfg.proposer.questions_per_step * cfg.proposer.group_size
    if role == "proposer":
        return candidates
    solve = getattr(cfg, "solve", None)  # coevo.solve: labelled questions instead of accepted candidates
    tasks = solve.batch_questions if solve is not None and not with_proposer else candidates
    return tasks * cfg.solver.group_size


def rows_at_once(policy: PolicyConfig, rows: int) -> int:
    """Rows of one HF generate call when the role generates `rows` sequences: `generation_rows` caps it."""
    return min(rows, policy.generation_rows) if policy.generation_rows > 0 else rows


def run_terms(cfg: CoevoConfig, shapes: dict[str, ModelShape], memory_total: int, with_proposer: bool = True,
              gpu_memory: Optional[int] = None, adapters: Optional[dict[str, int]] = None) -> list[Term]:
    """Every term of the run: its policies (`shapes`: role -> ModelShape; `adapters`: role -> LoRA
    adapter parameters, for roles with `lora.rank > 0`) and its processes.

    `memory_total`: the machine's RAM (the CPU engines' share is a fraction of it); `gpu_memory`:
    one GPU's memory when policies with num_gpus > 0 get one (None: everything on the CPU).
    """
    terms, extra_ranks = [], 0
    roles = loaded_policies(cfg, with_proposer)
    for role, policy in roles.items():
        on_gpu = gpu_memory is not None and policy.num_gpus > 0
        own = policy_terms(role, policy, shapes[role], sequence_tokens(cfg, role, policy),
                           gpu_memory if on_gpu and gpu_memory is not None else memory_total,
                           "gpu" if on_gpu else "cpu", generated_rows(cfg, role, with_proposer),
                           (adapters or {}).get(role, 0))
        terms += own + cpu_rank_terms(role, policy, shapes[role], own)
        extra_ranks += max(int(policy.cpu_ranks), 1) - 1 if policy.num_gpus == 0 else 0
    ray = not cfg.ray.local and with_proposer  # coevo.solve runs in one process
    # driver (+ policy actors, each CPU rank one, the retrieval replicas, the evidence actor)
    processes = 1 + (len(roles) + extra_ranks + cfg.retrieval.replicas + 1 if ray else 0)
    terms.append(Term("run", "runtime", processes * PROCESS_RUNTIME, "cpu",
                      f"{processes} process{'es' if processes > 1 else ''}"))
    return terms


def peak_bytes(terms: list[Term], device: str = "cpu") -> int:
    """Peak on `device`: every lasting term plus the largest transient one."""
    mine = [t for t in terms if t.device == device]
    return sum(t.bytes for t in mine if not t.transient) + max((t.bytes for t in mine if t.transient), default=0)


# ---- inputs from the machine and the model configs -------------------------------------------

def meminfo(key: str) -> int:
    """A /proc/meminfo value in bytes (MemTotal, MemAvailable); psutil where there is no /proc."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == key:
                    return int(value.split()[0]) * 1024
    except OSError:
        pass
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total if key == "MemTotal" else vm.available)


def _gpu_memory() -> Optional[int]:
    try:
        import torch
    except ImportError:
        return None
    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


def estimate_run(cfg: CoevoConfig, with_proposer: bool = True) -> list[Term]:
    """`run_terms` for this machine (RAM, GPU if any) and the configured models."""
    models: dict[tuple[str, Optional[str]], object] = {}
    by_role, adapters = {}, {}
    for role, policy in loaded_policies(cfg, with_proposer).items():
        key = (policy.model, policy.checkpoint)
        model = models[key] = models.get(key) or meta_model(*key)
        by_role[role], adapters[role] = shape_of(model), adapter_parameters(model, policy.lora)
    return run_terms(cfg, by_role, meminfo("MemTotal"), with_proposer, _gpu_memory(), adapters)


# ---- the check before a run starts ----------------------------------------------------------

class MemoryBudgetError(RuntimeError):
    """The configuration's estimated peak exceeds the memory available; the message says what to shrink."""


def _micro_batch_hint(terms: list[Term], cfg: CoevoConfig, target: int) -> str:
    """micro_batch_size overrides that bring every role's activations (linear in it) under `target` bytes."""
    sizes = []
    for t in terms:
        mb = getattr(cfg, t.role).micro_batch_size if t.name == "activations" else 1
        if t.bytes > target and mb > 1:
            sizes.append(f"{t.role}.micro_batch_size={max(1, min(mb - 1, target * mb // t.bytes))} ")
    return "".join(sizes) + "or a smaller solver.max_episode_tokens"


def _hint(term: Term, cfg: CoevoConfig, excess: int, terms: list[Term]) -> str:
    """Overrides that shrink `term`; `excess`: bytes the peak is over the budget."""
    role = term.role
    policy = getattr(cfg, role, None)
    if term.name == "activations":
        return _micro_batch_hint(terms, cfg, term.bytes - excess)
    if term.name in ("grads", "optimizer"):
        return f"{role}.lora.rank=16, " + ("ranker.mode=frozen" if role == "ranker" else f"{role}.frozen=true")
    if term.name == "reference":
        return f"{role}.kl_coef=0"
    if term.name == "weights":
        return f"{role}.dtype=bfloat16"
    if term.name == "engine":
        assert policy is not None
        return f"{role}.gpu_memory_utilization={policy.gpu_memory_utilization / 2:g}, rollout=hf"
    if term.name in ("engine_runtime", "sync_staging"):
        return "rollout=hf"
    if term.name == "generation":
        fewer = "solve.batch_questions" if hasattr(cfg, "solve") else "proposer.questions_per_step"
        return f"a smaller {fewer} or solver.group_size, rollout=vllm (its KV cache has a fixed size)"
    if term.name == "cpu_ranks":
        return f"{role}.cpu_ranks=0"
    return "ray.local=true" if term.name == "runtime" and term.bytes > PROCESS_RUNTIME else ""


def budget_message(terms: list[Term], cfg: CoevoConfig, available: int, top: int = 5) -> str:
    """Why a run does not fit: its peak, the largest terms counted in it and the overrides that shrink them."""
    cpu = [t for t in terms if t.device == "cpu"]
    transient = max((t for t in cpu if t.transient), key=lambda t: t.bytes, default=None)
    counted = sorted([t for t in cpu if not t.transient] + ([transient] if transient else []), key=lambda t: -t.bytes)
    lines = [f"coevo: this run needs about {peak_bytes(terms) / GIB:.1f} GiB of RAM at its peak, but "
             f"{available / GIB:.1f} GiB is available (MemAvailable): the kernel would kill it part-way. "
             "Largest terms (coevo/train/memory.py):"]
    for t in counted[:top]:
        hint = _hint(t, cfg, peak_bytes(terms) - available, cpu)
        lines.append(f"  {t.role}.{t.name}: {t.bytes / GIB:.2f} GiB" + (f" ({t.note})" if t.note else "")
                     + (f"; shrink with {hint}" if hint else ""))
    lines.append("Skip this check with run.memory_check=false.")
    return "\n".join(lines)


def check_run_memory(cfg: CoevoConfig, with_proposer: bool = True,
                     available: Optional[int] = None) -> Optional[list[Term]]:
    """Refuse (MemoryBudgetError) a run whose estimated peak exceeds the available RAM; returns the terms.

    None without a check: `run.memory_check=false`, the actors run on an external Ray cluster
    (`ray.address`: not this machine's memory), or a model config cannot be read.
    """
    if not cfg.run.memory_check or (cfg.ray.address and not cfg.ray.local and with_proposer):
        return None
    try:
        terms = estimate_run(cfg, with_proposer)
    except Exception as e:  # noqa: BLE001 - an unreadable model config fails its own load, with its own message
        LOG.warning("memory: check skipped, cannot read a model config: %s", e)
        return None
    available = meminfo("MemAvailable") if available is None else available
    if peak_bytes(terms) > available:
        raise MemoryBudgetError(budget_message(terms, cfg, available))
    LOG.info("memory: %s", estimate_text(terms, available))
    return terms


def estimate_text(terms: list[Term], available: Optional[int] = None) -> str:
    """`estimated peak <x> GiB of RAM[, <y> GiB available]`: the entry points' start line quotes it."""
    text = f"estimated peak {peak_bytes(terms) / GIB:.1f} GiB of RAM"
    return text if available is None else f"{text}, {available / GIB:.1f} GiB available"
