"""One policy sharded over the ranks of a torch.distributed process group with FSDP2 (docs/method.md §5.1-5.2).

`ShardedPolicy` runs on every rank of an initialised process group (gloo on CPU, NCCL on CUDA),
each rank built from the same weights; it offers `Policy`'s `generate` / `update` / `save` /
`load`, and every rank must call `update`, `save` and `load` together (they are collectives).
Choices a caller may rely on:
- sharding: `fully_shard` on each decoder layer, then on `Policy.scorer` (the log-prob module,
  coevo/train/policy.py `TokenLogprobs`) as the root, so embeddings, final norm and LM head are
  gathered by the root's pre-forward. The KL reference copy is sharded the same way (never
  stepped). Weights, gradients and AdamW state are fp32 shards (1/world each);
- precision: on CUDA with bf16 (`<role>.bf16_autocast`) FSDP2 gathers bf16 weights
  (`MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)`); on the CPU, plain fp32;
- the docs/method.md §5.1 mean stays exact: every rank gets the whole batch, keeps the part `split_by_tokens`
  gives it (balanced by loss-token count, deterministic), and divides each micro-batch loss by
  the loss-token count of the WHOLE batch (the local counts are all-reduced and must add up to
  it). Gradients are SUMMED over ranks (FSDP's default divides by the world size: turned off),
  so the step sees sum over ranks and micro-batches of token losses / batch tokens: the
  single-process value. One optimizer step per ppo epoch;
- every rank runs the same forwards and backwards (FSDP gathers weights collectively): ranks
  with fewer micro-batches, or none, run dummy ones (one 2-token sequence with an empty loss
  mask: zero loss and zero gradient, but the same collectives); the ranks agree per micro-batch
  on whether old log-probs need a forward (an all-reduced max); `shared_prompt` is off (a shared
  prompt runs each layer twice in one micro-batch, and only where the rows share one);
- start-up (coevo/train/device_memory.py): rank 0 loads the fp32 model on the host, the other ranks
  a `meta` skeleton; the policy and its KL reference are built on meta, sharded, given memory on
  the device (`to_empty`) and filled from rank 0 one tensor at a time (`set_model_state_dict(...,
  broadcast_from_rank0=True)`; buffers broadcast by name). No rank holds the unsharded model on
  its device; the reference shards are bf16 on a bf16 CUDA device. Then the AdamW moments, then
  `empty_cache`, then the engine, on EVERY rank (filled by a first sync): an in-process vLLM
  (`weight_sync=inprocess`, `auto` on CUDA: it shares this process's default group and creates
  groups as it starts) on dummy weights, or for `engine=hf` a generation copy in the compute dtype,
  rank 0's from the host model one parameter at a time, the others' on empty memory (ties kept,
  buffers broadcast). vLLM in its own process (`tmpfs`, the CPU default) is rank 0's alone, staged
  from the host model (other ranks have none to stage). The host model is then dropped. Closing an
  in-process vLLM tears the default group down: only at the end;
- data-parallel rollouts: the `generating_ranks` (all, or rank 0 for vLLM in its own process) each
  generate a contiguous block of a call's prompts (`prompt_blocks`: balanced by count, a solver group
  never cut), its seed moved to the block's first prompt (`block_sampling`: engines seed row (prompt
  i, sample j) `seed + i*n + j`, so a fixed seed samples the same rows however the prompts are split);
  coevo/orchestrate/sharded_actors.py sends each rank its block, concatenates in rank order;
- weight sync after every update (`gathered_weights`): every rank walks the parameters in order,
  casts its shard to the serving dtype and all-gathers it (`full_tensor`): one full parameter
  alive at a time, 2 bytes per parameter sent in bf16, nothing through the host on NCCL. Every
  rank's engine takes the stream (in-process vLLM: `load_weights`, no file; HF: copied into its
  generation copy), or rank 0's vLLM in its own process. A rank that fails leaves the others in a
  collective until the group's timeout (`cluster.collective_timeout_s`); `weight_sync=ipc` is refused;
- `save`/`load` (coevo/train/sharded_io.py): every rank writes its own shards of the fp32 weights
  and AdamW state with torch.distributed.checkpoint, atomically, never a full copy; `load`
  re-shards them onto any number of ranks, or reads `Policy.save`'s format (rank 0 reads,
  broadcasts);
- not supported (refused naming the key): LoRA (`<role>.lora.rank > 0`) and frozen roles.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Hashable, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from coevo.core.config import PolicyConfig
from coevo.core.types import Completion, SamplingParams, TrainSequence
from coevo.train.batching import loss_token_counts
from coevo.train.compiled import decoder_layers
from coevo.train.device_memory import cast_copy, empty_device_cache, reference_copy
from coevo.train.engines import build_engine
from coevo.train.engines.vllm_weights import resolved_weight_sync
from coevo.train.models import load_model_and_tokenizer, load_tokenizer, meta_skeleton, torch_dtype
from coevo.train.policy import Policy, TokenLogprobs, batch_metrics, skipped_update
from coevo.train.precision import bf16_compute, serving_dtype
from coevo.train.sharded_io import load_sharded, save_sharded


def split_by_tokens(counts: list[int], world: int) -> list[list[int]]:
    """Sequence indices per rank, balanced by loss-token count `counts`; a pure, deterministic greedy.

    Largest count first (ties: lower index), each to the rank with the fewest tokens so far
    (ties: fewer sequences, then lower rank); each rank's indices in increasing order.
    """
    if world < 1:
        raise ValueError(f"split_by_tokens: world={world}, expected at least 1 rank")
    ranks: list[list[int]] = [[] for _ in range(world)]
    totals = [0] * world
    for i in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        r = min(range(world), key=lambda r: (totals[r], len(ranks[r]), r))
        ranks[r].append(i)
        totals[r] += counts[i]
    return [sorted(r) for r in ranks]


def prompt_blocks(n: int, world: int, groups: Optional[Sequence[Hashable]] = None) -> list[tuple[int, int]]:
    """[start, end) of each rank's contiguous block of `n` prompts, balanced by count; pure and deterministic.

    Cut k (1..world-1) is the allowed boundary nearest k*n/world (ties: the higher), never before cut k-1.
    Without `groups` every boundary is allowed (sizes differ by at most one); with `groups` (a group id per
    prompt, each group's prompts contiguous: a solver task's rollouts) only boundaries between groups, so a
    group never spans ranks (a rank may then get none).
    """
    if world < 1:
        raise ValueError(f"prompt_blocks: world={world}, expected at least 1 rank")
    bounds = list(range(n + 1))
    if groups is not None:
        if len(groups) != n:
            raise ValueError(f"prompt_blocks: {len(groups)} group ids for {n} prompts, expected one per prompt")
        bounds = [0] + [i for i in range(1, n) if groups[i] != groups[i - 1]] + [n] if n else [0]
        if len({groups[b] for b in bounds[:-1]}) != len(bounds) - 1:
            raise ValueError("prompt_blocks: a group's prompts are apart; expected each group's prompts contiguous")
    cuts = [0]
    for k in range(1, world):
        cuts.append(min((b for b in bounds if b >= cuts[-1]), key=lambda b: (abs(b - k * n / world), -b)))
    return list(zip(cuts, cuts[1:] + [n]))


def block_sampling(sampling: SamplingParams, start: int) -> SamplingParams:
    """`sampling` for a block of prompts from prompt `start`: rows seeded as in the whole call, no groups."""
    return replace(sampling, seed=None if sampling.seed is None else int(sampling.seed) + start * sampling.n,
                   groups=None)


def shard_count(cfg: PolicyConfig, role: str) -> int:
    """The ranks a role is sharded over: `num_gpus` when above 1 (a whole number), else `cpu_ranks` when above 1
    (CPU processes meeting over gloo), else 0; checked shardable."""
    n, cpu = float(cfg.num_gpus), int(cfg.cpu_ranks)
    if cpu > 1 and n > 0:
        raise ValueError(f"config key {role}.cpu_ranks={cpu} with {role}.num_gpus={n:g}: CPU ranks are for a role "
                         f"without GPUs; expected {role}.cpu_ranks=0 or {role}.num_gpus=0")
    if n <= 1:
        return check_shardable(cfg, role) or cpu if cpu > 1 else 0
    if n != int(n):
        raise ValueError(f"config key {role}.num_gpus={n:g}: above 1 a role is sharded over whole GPUs; expected an "
                         "integer")
    check_shardable(cfg, role)
    return int(n)


def check_shardable(cfg: PolicyConfig, role: str) -> None:
    """Refuse what the sharded path does not do, naming the config key."""
    if cfg.frozen:
        raise ValueError(f"{role}.frozen=true with {role}.num_gpus={cfg.num_gpus:g}: a frozen role has nothing to "
                         f"shard; expected {role}.num_gpus <= 1")
    if int(cfg.lora.rank) > 0:
        raise ValueError(f"{role}.lora.rank={cfg.lora.rank} with {role}.num_gpus={cfg.num_gpus:g}: sharded updates "
                         f"train full weights only; expected {role}.lora.rank=0 or {role}.num_gpus <= 1")
    if str(cfg.engine) == "vllm" and str(cfg.weight_sync) == "ipc":
        # vLLM's IPC sender maps one process's whole live parameters; here no rank holds them whole.
        raise ValueError(f"{role}.weight_sync=ipc with {role}.num_gpus={cfg.num_gpus:g}: a sharded role's weights "
                         f"are gathered one parameter at a time; expected {role}.weight_sync=inprocess (or tmpfs)")


def shard_scorer(scorer: TokenLogprobs, mixed: Optional[MixedPrecisionPolicy]) -> None:
    """`fully_shard` each decoder layer of `scorer.model`, then `scorer` (the root), gradients summed over ranks."""
    kwargs = {"mp_policy": mixed} if mixed is not None else {}
    for layer in decoder_layers(scorer.model):
        fully_shard(layer, **kwargs)
    fully_shard(scorer, **kwargs)
    for module in scorer.modules():
        if isinstance(module, FSDPModule):
            # FSDP divides the reduced gradients by the world size (a mean of per-rank means);
            # the losses are already divided by the global token count, so the ranks' gradients
            # must be summed: factor 1, and plain SUM collectives (gloo has no PREMUL_SUM).
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


def _broadcast_from_rank0(model: torch.nn.Module, host: Optional[torch.nn.Module]) -> None:
    """Fill `model`'s shards (and buffers) from rank 0's `host` model, one tensor at a time (a collective).

    Buffers are broadcast by name too: the non-persistent ones (rotary frequencies) are in no state
    dict, and `to_empty` left them uninitialised on every rank.
    """
    full = host.state_dict() if host is not None else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    host_buffers = dict(host.named_buffers()) if host is not None else {}
    for name, buffer in model.named_buffers():
        if host is not None:
            buffer.copy_(host_buffers[name])
        dist.broadcast(buffer, src=0)


def _serving_dtype(cfg: PolicyConfig, device: torch.device) -> torch.dtype:
    """The dtype rank 0's engine serves: vLLM's (`precision.serving_dtype`), else the update's compute dtype."""
    if str(cfg.engine) == "vllm":
        return torch_dtype(serving_dtype(cfg, device.type == "cpu"))
    return torch.bfloat16 if bf16_compute(cfg, device) else torch_dtype(str(cfg.dtype))


@torch.no_grad()
def gathered_weights(model: torch.nn.Module, dtype: torch.dtype,
                     untied_head: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor in `dtype`) for each parameter of sharded `model`, gathered one at a time.

    A collective per parameter: every rank must drain the iterator. Each shard is cast before the
    gather, so a rank sends its shard in `dtype` (2 bytes per parameter in bf16, not 4) and holds one
    full parameter at a time; nothing goes through the host unless the process group is gloo.
    `untied_head`: tied output embeddings are also sent as `lm_head.weight` (a second gather).
    """
    names = set()
    for name, param in model.named_parameters():
        names.add(name)
        yield name, _full_tensor(param, dtype)
    head = model.get_output_embeddings() if untied_head else None
    if head is not None and "lm_head.weight" not in names:
        yield "lm_head.weight", _full_tensor(head.weight, dtype)


def _full_tensor(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    local = param.detach().to(dtype)
    return local.full_tensor() if isinstance(local, DTensor) else local


class _NoEngine:
    """The engine of ranks > 0 when vLLM runs in its own process (tmpfs): rank 0 alone generates."""

    def __init__(self, role: str, rank: int) -> None:
        self.role, self.rank = role, rank

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        raise RuntimeError(f"{self.role} rank {self.rank} has no generation engine: vLLM in its own process "
                           f"({self.role}.weight_sync tmpfs) generates on rank 0 alone")

    def sync_weights(self, model: torch.nn.Module) -> None:  # the sharded policy syncs the engines itself
        pass


def _comm_device() -> torch.device:
    """Where small collective tensors live: the current CUDA device under NCCL, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_reduce(values: list[float], op: dist.ReduceOp = dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=op)
    return t.tolist()


class ShardedPolicy:
    """One rank's part of a sharded policy; see the module docstring for the contract."""

    def __init__(self, cfg: PolicyConfig, model: torch.nn.Module, tokenizer, role: str = "policy",  # noqa: ANN001
                 device: Optional[torch.device | str] = None) -> None:
        """`model`: on rank 0 the loaded weights (on the host), elsewhere anything of the same shape (a `meta`
        skeleton: its values are never read); `device`: where this rank's shards live (default: the CPU)."""
        if not dist.is_initialized():
            raise RuntimeError(f"{role}: ShardedPolicy needs an initialised torch.distributed process group")
        check_shardable(cfg, role)
        self.rank, self.world, self.role = dist.get_rank(), dist.get_world_size(), role
        device = torch.device(device or "cpu")
        host = model if self.rank == 0 else None
        # The policy is built on a meta skeleton (its KL reference too: a meta copy costs nothing), sharded, and
        # only then given memory on the device: no rank ever holds the unsharded model there.
        self.policy = Policy(cfg, cast_copy(model, device="meta"), tokenizer, role, engine=_NoEngine(role, self.rank),
                             optimizer_now=False)
        self.policy.shared_prompt = False  # ranks must run the same forwards (module docstring)
        bf16 = bf16_compute(cfg, device)
        if self.policy.ref_model is not None and bf16:
            self.policy.ref_model.to(torch.bfloat16)  # never stepped: bf16 shards, as a 1-process policy's copy
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        for scorer in (self.policy.scorer, self.policy.ref_scorer):
            if scorer is not None:
                shard_scorer(scorer, mixed)
                scorer.to_empty(device=device)
                _broadcast_from_rank0(scorer.model, host)
        self.policy.build_optimizer()  # over the sharded parameters
        self.serving_dtype = _serving_dtype(cfg, device)
        self.gen_model: Optional[torch.nn.Module] = None
        self.own_process = str(cfg.engine) == "vllm" and resolved_weight_sync(str(cfg.weight_sync)) != "inprocess"
        self.generating_ranks = 1 if self.own_process else self.world  # module docstring: data-parallel rollouts
        self._start_engine(cfg, model, host, tokenizer, device)

    def _start_engine(self, cfg: PolicyConfig, model: torch.nn.Module, host: Optional[torch.nn.Module],
                      tokenizer, device: torch.device) -> None:  # noqa: ANN001
        """This rank's engine, once the shards are in place and the cache emptied (module docstring): vLLM in
        its own process on rank 0 alone, staged from `host`; else every rank's, filled by a first sync (a
        collective): an in-process vLLM on dummy weights, or an HF generation copy in the serving dtype."""
        empty_device_cache()  # a GPU engine checks free memory at start: what start-up freed must not count as used
        if self.own_process:
            if host is not None:
                self.policy.engine = build_engine(cfg, host, tokenizer)
            return
        if str(cfg.engine) == "vllm":
            self.policy.engine = build_engine(cfg, cast_copy(model, device="meta"), tokenizer)
        else:
            self.gen_model = self._generation_copy(model, host, device)
            self.policy.engine = build_engine(cfg, self.gen_model, tokenizer)
        self._sync_engine()

    def _generation_copy(self, model: torch.nn.Module, host: Optional[torch.nn.Module],
                         device: torch.device) -> torch.nn.Module:
        """The HF engine's weights in the serving dtype on `device`: rank 0's from `host` (itself when it is
        already that), the other ranks' on empty memory, each parameter object once (ties kept); buffers
        (rotary frequencies: in no gathered stream) broadcast from rank 0."""
        if host is not None and host.device == device and next(host.parameters()).dtype == self.serving_dtype:
            gen = host.eval().requires_grad_(False)
        elif host is not None:
            gen = reference_copy(host, self.serving_dtype, device)
        else:
            gen = reference_copy(model, self.serving_dtype, device, empty=True)
        for buffer in gen.buffers():
            dist.broadcast(buffer, src=0)
        return gen

    @classmethod
    def from_config(cls, cfg: PolicyConfig, role: str = "policy") -> "ShardedPolicy":
        """Rank 0 loads `cfg.model` (and `cfg.checkpoint`) on the host, the other ranks a meta skeleton; the shards
        live on this rank's CUDA device when `num_gpus > 0` (Ray gives each worker one GPU), else on the CPU."""
        if dist.get_rank() == 0:
            model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.dtype, cfg.checkpoint)
        else:
            model = meta_skeleton(cfg.model, cfg.dtype, cfg.checkpoint)
            tokenizer = load_tokenizer(cfg.model, cfg.checkpoint)
        device = torch.device("cuda", torch.cuda.current_device()) if cfg.num_gpus > 0 else torch.device("cpu")
        return cls(cfg, model, tokenizer, role, device=device)

    @property
    def frozen(self) -> bool:
        """Always False (a frozen role is refused), as `Policy.frozen`."""
        return self.policy.frozen

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """`Policy.chat_prompt_ids`: the same on every rank."""
        return self.policy.chat_prompt_ids(messages)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """`prompts` (this rank's block, `sampling` from `block_sampling`) on this rank's engine: ranks below
        `generating_ranks` only; same budget check and results as `Policy.generate`."""
        return self.policy.generate(prompts, sampling)

    def num_parameters(self) -> int:
        """Parameters of the whole model (not of this rank's shards)."""
        return sum(p.numel() for p in self.policy.model.parameters())

    def update(self, batch: list[TrainSequence]) -> dict:
        """`Policy.update` over the ranks: same metrics (global values), every rank must call it with the same batch."""
        t0 = time.perf_counter()
        counts = loss_token_counts(batch)
        n_tokens = sum(counts)
        if n_tokens == 0:  # every rank has the same batch: all skip together
            return skipped_update(batch)
        mine = split_by_tokens(counts, self.world)[self.rank]
        # The global count is the batch's own; all-reducing the shares' counts checks every rank got that batch.
        shared = int(_all_reduce([sum(counts[i] for i in mine)])[0])
        if shared != n_tokens:
            raise RuntimeError(f"{self.role}: the ranks' shares hold {shared} loss tokens, the batch {n_tokens}: "
                               "every rank must call update with the same batch")
        micro_batches, forward_old = self._aligned_micro_batches([batch[i] for i in mine])
        metrics = self.policy.update_micro_batches(micro_batches, n_tokens, forward_old, sync=self._sync_engine)
        # Each rank's loss terms are its share of the global mean (divided by the batch's tokens): they add up.
        # logprob_mismatch_* are global already (Policy.optimizer_step gathers every rank's per-token gaps).
        summed = _all_reduce([metrics[k] for k in ("loss", "pg_loss", "kl", "clip_frac")])
        metrics.update(zip(("loss", "pg_loss", "kl", "clip_frac"), summed))
        return {**metrics, **batch_metrics(batch, n_tokens, t0)}

    def _aligned_micro_batches(self, mine: list[TrainSequence]) -> tuple[list[list[TrainSequence]], list[bool]]:
        """This rank's micro-batches, as many as every other rank's, and whether each needs an old-log-prob forward.

        Ranks with fewer micro-batches get dummy ones; the forward decision is the ranks' max (module docstring).
        """
        micro_batches = self.policy.micro_batches(mine)
        n_micro = int(_all_reduce([len(micro_batches)], dist.ReduceOp.MAX)[0])
        micro_batches += [[self._dummy()] for _ in range(n_micro - len(micro_batches))]
        needs = [float(any(s.old_logprobs is None for s in mb)) for mb in micro_batches]  # dummies have old log-probs
        return micro_batches, [bool(x) for x in _all_reduce(needs, dist.ReduceOp.MAX)]

    def _dummy(self) -> TrainSequence:
        """A micro-batch that trains nothing but runs the same collectives (two pad tokens, empty loss mask)."""
        pad = self.policy.tokenizer.pad_token_id or 0
        return TrainSequence(input_ids=[pad, pad], loss_mask=[0, 0], advantage=0.0, old_logprobs=[0.0, 0.0])

    def _sync_engine(self) -> None:
        """Serve the updated weights: every rank gathers them one parameter at a time (a collective per
        parameter, in the serving dtype), and each rank with an engine takes them as they come."""
        # vLLM runs untied (engines/vllm_weights.py `engine_tensors`): it gets lm_head.weight even when tied.
        stream = gathered_weights(self.policy.model, self.serving_dtype, str(self.policy.cfg.engine) == "vllm")
        try:
            if self.gen_model is not None:  # every rank's HF generation copy
                params = dict(self.gen_model.named_parameters())
                for name, tensor in stream:
                    params[name].copy_(tensor)
            elif self.rank < self.generating_ranks:  # every rank's in-process vLLM; rank 0's in its own process
                self.policy.engine.load_weights(stream)
        finally:
            for _ in stream:  # every rank runs every gather, whatever its engine consumed or raised
                pass

    def save(self, directory: str | Path) -> Path:
        """Every rank writes its shards of the weights and AdamW state, atomically (coevo/train/sharded_io.py)."""
        assert self.policy.optimizer is not None
        return save_sharded(directory, self.policy.model, self.policy.optimizer, self.policy.tokenizer)

    def load(self, directory: str | Path) -> None:
        """Restore `save`'s weights and optimizer state (saved on any number of ranks), or `Policy.save`'s
        (rank 0 reads, then broadcasts); then serve them (coevo/train/sharded_io.py `load_sharded`)."""
        assert self.policy.optimizer is not None
        load_sharded(directory, self.policy.model, self.policy.optimizer, self.role)
        self._sync_engine()
