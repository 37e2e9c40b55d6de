"""One policy sharded over the ranks of a torch.distributed process group with FSDP2 (SPEC §5.1-5.2).

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
- the §5.1 mean stays exact: every rank gets the whole batch, keeps the part `split_by_tokens`
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
- generation runs on rank 0 alone, on its own unsharded copy of the weights (bf16 on a bf16
  CUDA device, else the policy's dtype; on the CPU for `engine=vllm`, which only stages from it),
  refreshed after every update from a full state dict gathered to rank 0. Other ranks refuse
  `generate`;
- `save` gathers the full fp32 weights and optimizer state to rank 0, which writes them
  atomically in `Policy.save`'s format (HF model directory + optimizer state keyed by parameter
  index); `load` reads that format on rank 0 and broadcasts it, each rank keeping its shards;
- start-up: every rank loads the full model onto its device and shards it there (the KL copy
  and rank 0's generation copy are made first), so the peak per GPU at start is an unsharded
  model plus those copies, once; rank 0 needs host memory for one full fp32 copy at each sync;
- not supported (refused naming the key): LoRA (`<role>.lora.rank > 0`) and frozen roles.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from coevo.core.config import PolicyConfig
from coevo.core.io import atomic_dir
from coevo.core.types import Completion, SamplingParams, TrainSequence
from coevo.train.batching import loss_token_counts
from coevo.train.checkpoint import OPTIMIZER_FILE
from coevo.train.compiled import decoder_layers
from coevo.train.engines import build_engine
from coevo.train.models import load_model_and_tokenizer
from coevo.train.policy import Policy, TokenLogprobs, batch_metrics, skipped_update
from coevo.train.precision import bf16_compute

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


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


def shard_count(cfg: PolicyConfig, role: str) -> int:
    """The ranks a role is sharded over: `num_gpus` when above 1 (a whole number, checked shardable), else 0."""
    n = float(cfg.num_gpus)
    if n <= 1:
        return 0
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


class _NoEngine:
    """The engine of ranks > 0: generation runs on rank 0 only."""

    def __init__(self, role: str, rank: int) -> None:
        self.role, self.rank = role, rank

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        raise RuntimeError(f"{self.role} rank {self.rank} has no generation engine: a sharded role generates on rank 0")

    def sync_weights(self, model: torch.nn.Module) -> None:  # the sharded policy refreshes rank 0's copy itself
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

    def __init__(self, cfg: PolicyConfig, model: torch.nn.Module, tokenizer, role: str = "policy") -> None:  # noqa: ANN001
        if not dist.is_initialized():
            raise RuntimeError(f"{role}: ShardedPolicy needs an initialised torch.distributed process group")
        check_shardable(cfg, role)
        self.rank, self.world, self.role = dist.get_rank(), dist.get_world_size(), role
        device = next(model.parameters()).device
        self.gen_model: Optional[torch.nn.Module] = None
        engine = _NoEngine(role, self.rank)
        if self.rank == 0:  # before sharding: a plain copy rank 0 generates with
            gen = copy.deepcopy(model).eval().requires_grad_(False)
            if str(cfg.engine) == "vllm":
                gen = gen.cpu()  # vLLM holds its own weights; this copy only stages them
            elif bf16_compute(cfg, device):
                gen = gen.to(torch.bfloat16)
            self.gen_model, engine = gen, build_engine(cfg, gen, tokenizer)
        self.policy = Policy(cfg, model, tokenizer, role, engine=engine, optimizer_now=False)  # built once sharded
        self.policy.shared_prompt = False  # ranks must run the same forwards (module docstring)
        bf16 = bf16_compute(cfg, device)
        mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        shard_scorer(self.policy.scorer, mixed)
        if self.policy.ref_scorer is not None:
            shard_scorer(self.policy.ref_scorer, mixed)
        self.policy.build_optimizer()  # over the sharded parameters that replaced the originals

    @classmethod
    def from_config(cls, cfg: PolicyConfig, role: str = "policy") -> "ShardedPolicy":
        """Every rank loads `cfg.model` (and `cfg.checkpoint`), on its CUDA device when `num_gpus > 0`."""
        model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.dtype, cfg.checkpoint)
        if cfg.num_gpus > 0:
            model = model.to("cuda")  # Ray gives each worker one GPU: device 0 is it
        return cls(cfg, model, tokenizer, role)

    @property
    def frozen(self) -> bool:
        """Always False (a frozen role is refused), as `Policy.frozen`."""
        return self.policy.frozen

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """`Policy.chat_prompt_ids`: the same on every rank."""
        return self.policy.chat_prompt_ids(messages)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """Rank 0 only (the others have no engine); same budget check and results as `Policy.generate`."""
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
        """Gather the full weights to rank 0 and serve them from its generation copy (a collective)."""
        full = get_model_state_dict(self.policy.model, options=FULL)
        if self.rank == 0:
            assert self.gen_model is not None
            self.gen_model.load_state_dict(full)  # copy_ casts to the copy's dtype
            self.policy.engine.sync_weights(self.gen_model)

    def save(self, directory: str | Path) -> Path:
        """Gather the full fp32 weights and optimizer state; rank 0 writes `Policy.save`'s format atomically."""
        p = self.policy
        assert p.optimizer is not None
        weights = get_model_state_dict(p.model, options=FULL)
        optim = get_optimizer_state_dict(p.model, p.optimizer, options=FULL)
        if self.rank == 0:
            assert self.gen_model is not None
            with atomic_dir(directory) as tmp:
                # The copy gives config and names only; tied names must share one tensor for HF to write one.
                self.gen_model.save_pretrained(tmp, state_dict=_tie_like(weights, self.gen_model))
                p.tokenizer.save_pretrained(tmp)
                torch.save(_by_index(optim, _trained_names(p.model)), tmp / OPTIMIZER_FILE)
        dist.barrier()  # nobody returns before the directory is in place
        return Path(directory)

    def load(self, directory: str | Path) -> None:
        """Restore `save`'s (or `Policy.save`'s) weights and optimizer state.

        Rank 0 reads the directory and broadcasts; each rank keeps its shards (one full copy in host
        memory, not one per rank). Every rank checks the optimizer file, so all fail together.
        """
        from transformers import AutoModelForCausalLM

        p = self.policy
        assert p.optimizer is not None
        directory = Path(directory)
        opt_path = directory / OPTIMIZER_FILE
        if not opt_path.is_file():
            raise FileNotFoundError(f"{opt_path} is missing: the trainable {self.role} cannot resume without its "
                                    "optimizer state")
        weights: dict = {}
        optim: dict = {}
        if self.rank == 0:
            weights = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).state_dict()
            optim = _by_name(torch.load(opt_path, map_location="cpu", weights_only=True), _trained_names(p.model))
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(p.model, weights, options=options)
        set_optimizer_state_dict(p.model, p.optimizer, optim, options=options)
        self._sync_engine()


def _trained_names(model: torch.nn.Module) -> list[str]:
    """Names of the optimizer's parameters in `Policy.build_optimizer`'s order: index i is names[i]."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _by_index(optim: dict, names: list[str]) -> dict:
    """A full optimizer state keyed by parameter name -> `torch.optim` keys (indices), as `Policy.save` writes it."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in optim["param_groups"]]
    for g in groups:  # a state loaded through set_optimizer_state_dict comes back with AdamW's betas as a list
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    return {"state": {index[n]: v for n, v in optim["state"].items()}, "param_groups": groups}


def _by_name(optim: dict, names: list[str]) -> dict:
    """The inverse of `_by_index`: `Policy.save`'s optimizer state keyed by parameter name."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]]
    return {"state": {names[int(i)]: v for i, v in optim["state"].items()}, "param_groups": groups}


def _tie_like(weights: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`weights` with names that share one parameter in `model` (tied embeddings) sharing one tensor."""
    first: dict[int, str] = {}
    out = dict(weights)
    for name, param in model.state_dict(keep_vars=True).items():
        out[name] = out[first.setdefault(id(param), name)]
    return out
