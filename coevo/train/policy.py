"""One trainable (or frozen) policy: model, reference copy, optimizer, generation engine (docs/method.md §5).

`Policy.update` runs GRPO on sequences whose `loss_mask` marks the policy's own tokens:
- every ppo epoch is one optimizer step over the whole batch (gradients are accumulated over
  micro-batches of `micro_batch_size` sequences, each micro-batch loss divided by the token
  count of the *whole* batch, so the step sees the exact token-level mean of docs/method.md §5.1);
- the model stays in eval mode throughout: RL ratios must compare the same deterministic
  function that generated the tokens, so dropout stays off while gradients still flow;
- log-probs are those of the raw model (no temperature), matching `HFEngine` logprobs;
- precision (coevo/train/precision.py): fp32 weights and AdamW state (bf16 ones refused), forward
  passes in bf16 under autocast where `bf16_autocast` (CUDA) or `cpu_bf16_autocast` (a CPU with bf16
  instructions) applies, else fp32; loss math in fp32; engine log-probs are π_old per `<role>.old_logprobs`
  (auto: not vLLM's on CUDA, nor of another precision), their gap to the trainer's logged (logprob_mismatch_*);
- compute: the LM head runs only on loss-masked positions (`sequence_token_logprobs`'s
  `positions`), and with one epoch missing old log-probs are the trained forward's own,
  detached (on-policy: ratio 1 at the only step), so an update costs one forward + backward;
- `<role>.shared_prompt` (default on): sequences with one prompt (a GRPO group's rollouts)
  fill micro-batches together, and a micro-batch whose rows share a prompt runs it once as a
  batch of one with its keys/values repeated for the rows (`grpo.sequence_token_logprobs`'s
  `prefix_len`): same values and gradients, the prompt's compute paid once per micro-batch
  instead of once per row. Off with gradient checkpointing (HF drops the cache in train mode);
- memory is bounded by one micro-batch, not the batch: old and reference log-probs are
  computed one micro-batch at a time under no_grad and kept as [b, T-1] floats on the CPU;
  each micro-batch is padded to its own longest sequence, put on the device only for its
  forward/backward, and its logits and activations are released before the next one;
- `<role>.gradient_checkpointing=true`: HF's non-reentrant checkpointing recomputes each decoder
  layer in backward instead of keeping its activations. It only works in train mode, so every
  dropout probability is set to 0 at load (asserted) and the model is in train mode only for
  a micro-batch's forward + backward (coevo/train/recompute.py): the function is unchanged;
- `<role>.cpu_compile=true` (CPU): that forward + backward alone runs compiled decoder layers (compiled.py);
- `<role>.lora.rank > 0` (coevo/train/lora.py): the model is a peft LoRA model; the base weights
  are frozen (and may be bf16), the fp32 adapter is all the optimizer sees; the KL reference is
  the base with the adapter disabled (no copy); the HF engine generates through the peft model,
  vLLM receives merged weights under the base names; checkpoints hold the adapter only. A
  frozen policy ignores both keys (nothing trains). A `checkpoint` that is an adapter is merged
  into the base at load (`load_model_and_tokenizer`), and a LoRA policy trains a new adapter on it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, ContextManager, Optional

import torch

from coevo.core.budget import check_prompts_fit
from coevo.core.config import PolicyConfig
from coevo.core.grpo import clipped_surrogate_loss, k3_kl, masked_mean, sequence_token_logprobs
from coevo.core.io import atomic_dir
from coevo.core.stages import stage
from coevo.core.types import Completion, GenerationEngine, SamplingParams, TrainSequence
from coevo.train import batching, precision
from coevo.train.allocator import pin_mmap_threshold
from coevo.train.batching import FixedLogprobs, MicroBatch, PreparedBatch, loss_token_counts
from coevo.train.checkpoint import OPTIMIZER_FILE
from coevo.train.compiled import update_layers
from coevo.train.device_memory import empty_device_cache, reference_copy
from coevo.train.engines import build_engine
from coevo.train.lora import apply_lora, hf_model, is_adapter_dir, load_adapter_weights
from coevo.train.models import load_model_and_tokenizer
from coevo.train.preflight import require_gpus
from coevo.train.recompute import enable_gradient_checkpointing, train_mode
from coevo.train.sharded_io import load_model_weights, read_optimizer_state, trained_names


class Policy:
    """Holds a model and everything needed to sample from it and train it with GRPO.

    Its network, and the handles on it:
    - `model`: the module that trains, saves, loads and syncs to the engine: the HF causal LM, or
      under LoRA peft's wrapper around it (adapter state, `disable_adapter`, adapter-only saves);
    - `scorer`: `TokenLogprobs` over the HF causal LM (`hf_model(model)`, which under LoRA runs the
      adapter): the one way the update runs forwards, and the root FSDP shards (sharded.py);
    - `ref_model` / `ref_scorer`: the same two for the KL reference copy (None with LoRA, whose
      reference is `scorer` with the adapter disabled, or without a reference).
    """

    def __init__(self, cfg: PolicyConfig, model, tokenizer, role: str = "policy",  # noqa: ANN001
                 engine: Optional[GenerationEngine] = None, optimizer_now: bool = True) -> None:
        """`optimizer_now=False`: the caller builds the optimizer later (sharded.py, over sharded parameters)."""
        self.cfg = cfg
        self.role = role
        self.frozen = bool(cfg.frozen)
        # A frozen policy never steps: an adapter or recomputation would change nothing but its cost.
        self.lora = not self.frozen and int(cfg.lora.rank) > 0
        self.checkpointing = not self.frozen and bool(cfg.gradient_checkpointing)
        # HF's checkpointed layers run without a KV cache in train mode, so no prompt can be shared then.
        self.shared_prompt = bool(cfg.shared_prompt) and not self.checkpointing
        if self.checkpointing:
            enable_gradient_checkpointing(model, role)  # on the HF model, before peft wraps it
        if self.lora:
            model = apply_lora(model, cfg.lora, role)
        precision.check_trainable_dtype(model, role, self.frozen)
        self.model = model.eval()
        self.scorer = TokenLogprobs(hf_model(self.model))
        self.update_layers = update_layers(cfg, hf_model(self.model), role, self.shared_prompt, self.frozen)
        self.tokenizer = tokenizer
        self.ref_model = None
        # With LoRA the reference is the base itself, adapter disabled: no copy of the weights.
        self.has_reference = not self.frozen and cfg.kl_coef > 0
        self.optimizer: Optional[torch.optim.Optimizer] = None
        if self.frozen:
            self.model.requires_grad_(False)
        else:
            # Freed activations must go back to the system, or every update leaves the process
            # larger (coevo/train/allocator.py has the numbers).
            pin_mmap_threshold()
            if self.has_reference and not self.lora:
                bf16 = precision.bf16_compute(cfg, self.device)  # never stepped: bf16 halves it, computes as the policy
                self.ref_model = reference_copy(model, torch.bfloat16 if bf16 else None)  # one parameter at a time
            if optimizer_now:
                self.build_optimizer()
        self.ref_scorer = TokenLogprobs(self.ref_model) if self.ref_model is not None else None
        self.engine = engine if engine is not None else build_engine(cfg, self.model, tokenizer)  # empties the cache

    def build_optimizer(self) -> None:
        """A fresh AdamW over the trainable parameters (again once coevo/train/sharded.py has sharded them)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        # Moments now, not at this role's first training group: the process reaches its size at start.
        precision.allocate_optimizer_state(self.optimizer)

    @classmethod
    def from_config(cls, cfg: PolicyConfig, role: str = "policy") -> "Policy":
        """Load `cfg.model` (`cfg.checkpoint` weights if set), on the GPU when `num_gpus > 0`. Never silently on
        the CPU: `num_gpus > 0` without a CUDA device is a PreflightError naming `<role>.num_gpus`, before loading."""
        require_gpus(role, cfg.num_gpus)
        model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.dtype, cfg.checkpoint)
        if cfg.num_gpus > 0:
            model = model.to("cuda")  # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU: device 0 is it
        return cls(cfg, model, tokenizer, role)

    @property
    def device(self) -> torch.device:
        """Where the policy's weights (and each micro-batch during its forward/backward) live."""
        return next(self.model.parameters()).device

    def num_parameters(self) -> int:
        """Parameters of the policy model (the reference copy is not counted)."""
        return sum(p.numel() for p in self.model.parameters())

    # ---- generation -------------------------------------------------------------------------

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` rendered with the chat template, ending in the assistant turn.

        Without a chat template (base models) the fallback is one "role: content" line per
        message followed by "assistant:", so prompts stay readable and deterministic.
        """
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            # The template already holds BOS and role markers; adding special tokens would double them.
            return list(tok(text, add_special_tokens=False)["input_ids"])
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return list(tok(text)["input_ids"])

    def sampling_from_config(self, greedy: bool = False, **overrides) -> SamplingParams:  # noqa: ANN003
        """SamplingParams from this policy's config (temperature 0 when `greedy`), then `overrides`."""
        params = dict(temperature=0.0 if greedy else self.cfg.temperature, top_p=self.cfg.top_p,
                      max_new_tokens=self.cfg.max_new_tokens)
        params.update(overrides)
        return SamplingParams(**params)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """`sampling.n` completions per prompt; a prompt over `max_prompt_tokens` is a PromptBudgetError.

        Never a cut: the roles keep their prompts inside the budget themselves (coevo/core/budget.py).
        """
        check_prompts_fit(prompts, self.cfg.max_prompt_tokens, self.role)
        with self.compute():  # the HF engine generates with this model: old log-probs in the update's precision
            return self.engine.generate([list(p) for p in prompts], sampling)

    def compute(self) -> ContextManager:
        """Forward-pass precision: bf16 autocast over fp32 weights where `precision.bf16_compute` holds, else plain."""
        return precision.compute_context(self.cfg, self.device)

    # ---- training ---------------------------------------------------------------------------

    def micro_batches(self, batch: list[TrainSequence]) -> list[list[TrainSequence]]:
        """`batch` in micro-batches of `micro_batch_size` (by prompt with `shared_prompt`); engine log-probs that
        are not π_old (`precision.engine_logprobs_usable`) set aside (`batching.Rescored`): the policy's own are."""
        if not precision.engine_logprobs_usable(self.cfg, self.device):
            batch = batching.without_engine_old(batch)
        return batching.micro_batches(batch, self.cfg.micro_batch_size, self.shared_prompt)

    def micro_batch_tensors(self, seqs: list[TrainSequence]) -> MicroBatch:
        """The padded tensors of micro-batch `seqs` on this policy's device ([b, T] ids, see `MicroBatch`)."""
        return batching.micro_batch_tensors(seqs, self.tokenizer.pad_token_id or 0, self.device, self.shared_prompt)

    def update(self, batch: list[TrainSequence]) -> dict:
        """GRPO update (`ppo_epochs` optimizer steps) on `batch`; returns metrics averaged over epochs.

        Metrics: loss, pg_loss, kl, clip_frac, grad_norm, n_seqs, n_tokens (loss-masked tokens),
        seq_tokens (every token of the batch's sequences: what each epoch runs forward and backward),
        time_s. A frozen policy returns {"skipped": True}; a batch without any loss-masked token
        is skipped too (no step, so weight decay cannot move the weights either).
        """
        if self.frozen:
            return {"skipped": True}
        t0 = time.perf_counter()
        n_tokens = sum(loss_token_counts(batch))
        if n_tokens == 0:
            return skipped_update(batch)
        metrics = self.update_micro_batches(self.micro_batches(batch), n_tokens)
        return {**metrics, **batch_metrics(batch, n_tokens, t0)}

    def update_micro_batches(self, micro_batches: list[list[TrainSequence]], n_tokens: int,
                             forward_old: Optional[list[bool]] = None,
                             sync: Optional[Callable[[], None]] = None) -> dict:
        """`update`'s work on `micro_batches`: fixed log-probs, `ppo_epochs` optimizer steps, the engine sync.

        `n_tokens`: loss tokens of the whole batch (the loss denominator). `forward_old` and `sync`
        are what a sharded update (coevo/train/sharded.py) changes: see `prepare`, and the engine
        sync (default `sync_engine`). Returns loss, pg_loss, kl, clip_frac and grad_norm, each
        averaged over the epochs.
        """
        # Published stages (COEVO_STAGE_FILE): bench/memory.py measures each one's memory.
        self.release_engine_memory()
        with stage(self.role):
            with stage("logprobs"):
                prepared = self.prepare(micro_batches, n_tokens, forward_old)
            with stage("backward"):  # forward + backward of every micro-batch, then the optimizer step
                epochs = [self.optimizer_step(prepared) for _ in range(max(1, int(self.cfg.ppo_epochs)))]
            with stage("sync"):
                (sync or self.sync_engine)()
        return {k: sum(e[k] for e in epochs) / len(epochs) for k in epochs[0]}

    @torch.no_grad()
    def prepare(self, micro_batches: list[list[TrainSequence]], n_tokens: int,
                forward_old: Optional[list[bool]] = None) -> PreparedBatch:
        """Old (π_old) and KL-reference log-probs of every micro-batch: the forwards before any step.

        Per micro-batch a `FixedLogprobs` of [b, T-1] float32 CPU tensors (one micro-batch on the device
        at a time). Missing old log-probs come from the weights before any step: with one epoch the only
        step's own forward gives them (`old_filled` False: filled in `_backward` from its detached
        log-probs, as verl does on-policy), so no extra forward is spent here. `forward_old[i]` (sharded
        updates) overrides whether micro-batch i runs that forward: every rank must run the same ones.
        """
        fixed = []
        for i, seqs in enumerate(micro_batches):
            mb = self.micro_batch_tensors(seqs)
            old, filled = mb.old, bool(mb.has_old.all())
            needed = not filled if forward_old is None else forward_old[i]
            with self.compute():
                if needed and int(self.cfg.ppo_epochs) > 1:
                    current = self.scorer(mb.ids, mb.attn, mb.mask, mb.prefix)
                    old, filled = torch.where(mb.has_old.unsqueeze(-1), old, current), True
                ref = self._reference_logprobs(mb).float().cpu() if self.has_reference else None
            fixed.append(FixedLogprobs(old=old.float().cpu(), old_filled=filled, ref=ref))
        return PreparedBatch(micro_batches=micro_batches, fixed=fixed, n_tokens=n_tokens)

    def _reference_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """Log-probs of micro-batch `mb` under the KL reference: the base with the adapter off, else the copy."""
        if self.lora:
            with self.model.disable_adapter():
                return self.scorer(mb.ids, mb.attn, mb.mask, mb.prefix)
        assert self.ref_scorer is not None
        return self.ref_scorer(mb.ids, mb.attn, mb.mask, mb.prefix)

    def optimizer_step(self, prepared: PreparedBatch) -> dict:
        """One ppo epoch: gradients accumulated over every micro-batch, clipped, one optimizer step.

        Returns this epoch's loss, pg_loss, kl (sums of the micro-batches' shares of the token mean), clip_frac
        (clipped share of `prepared.n_tokens`), grad_norm (before clipping, global), and logprob_mismatch_mean/_p99
        (`batching.mismatch_metrics`, where the batch has engine log-probs: the first epoch's, repeated after).
        """
        cfg = self.cfg
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        pg_total, kl_total, clipped = 0.0, 0.0, 0.0
        gaps: Optional[list[torch.Tensor]] = [] if prepared.mismatch is None else None  # first epoch only
        for seqs, fixed in zip(prepared.micro_batches, prepared.fixed):
            pg, kl, n_clipped = self._backward(seqs, fixed, prepared.n_tokens, gaps)
            pg_total, kl_total, clipped = pg_total + pg, kl_total + kl, clipped + n_clipped
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        sharded = hasattr(norm, "full_tensor")  # sharded gradients (DTensors) give a sharded norm, all ranks here
        grad_norm = float(norm.full_tensor() if sharded else norm)
        if gaps is not None:
            prepared.mismatch = batching.mismatch_metrics(gaps, across_ranks=sharded)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": pg_total + cfg.kl_coef * kl_total, "pg_loss": pg_total, "kl": kl_total,
                "clip_frac": clipped / prepared.n_tokens, "grad_norm": grad_norm, **(prepared.mismatch or {})}

    def _backward(self, seqs: list[TrainSequence], fixed: FixedLogprobs, n_tokens: int,
                  gaps: Optional[list[torch.Tensor]] = None) -> tuple[float, float, float]:
        """Forward + backward of one micro-batch (gradients accumulate); returns (pg, kl, clipped tokens).

        `gaps` (first epoch): gets the micro-batch's `batching.engine_gap`, from this same forward.
        A method of its own so that the micro-batch's tensors and graph are released on return.
        """
        cfg = self.cfg
        mb = self.micro_batch_tensors(seqs)
        old = fixed.old.to(self.device)
        # Checkpointed layers recompute in backward only in train mode; their dropout is 0 (recompute.py).
        with train_mode(self.model, self.checkpointing), self.update_layers.active():
            with self.compute():  # forward in bf16 on CUDA; the loss math below runs on fp32 log-probs
                token_logprobs = self.scorer(mb.ids, mb.attn, mb.mask, mb.prefix).float()  # [b, T-1]
            if gaps is not None:
                gaps.append(batching.engine_gap(mb, token_logprobs))
            if not fixed.old_filled:  # one epoch: the old policy is these weights (ratio 1 at the step)
                old = torch.where(mb.has_old.unsqueeze(-1), old, token_logprobs.detach())
            pg, m = clipped_surrogate_loss(token_logprobs, old, mb.adv, mb.mask, cfg.clip_eps, denom=n_tokens)
            loss, kl_value = pg, 0.0
            if fixed.ref is not None:
                kl_tokens = k3_kl(token_logprobs, fixed.ref.to(self.device), mb.mask)
                kl = masked_mean(kl_tokens, mb.mask, denom=n_tokens)
                loss = loss + cfg.kl_coef * kl
                kl_value = float(kl.detach())
            loss.backward()  # outside autocast, as torch recommends: gradients land on the fp32 master weights
        return float(pg.detach()), kl_value, m["clip_frac"] * m["n_tokens"]

    def sync_engine(self) -> None:
        """Serve the current weights from the generation engine (a sleeping vLLM engine wakes for it)."""
        self.engine.sync_weights(self.model)

    def release_engine_memory(self) -> None:
        """Before an update: a vLLM engine with sleep_mode frees its GPU memory; the sync after it wakes it."""
        if getattr(self.engine, "sleep_mode", False):
            self.engine.sleep()
            empty_device_cache()  # what vLLM released goes back to the device, for the update to use

    # ---- checkpoints ------------------------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write model + tokenizer (HF format) and optimizer state to `directory`, atomically.

        A LoRA policy writes its adapter only (peft's adapter_config.json + adapter_model.safetensors):
        the base is the config's `model`, unchanged by training.
        """
        with atomic_dir(directory) as tmp:
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            if self.optimizer is not None:
                torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        return Path(directory)

    def load(self, directory: str | Path) -> None:
        """Restore weights (and a trainable policy's optimizer state) from `save`'s or a sharded role's checkpoint.

        Either format loads in this one process (coevo/train/sharded_io.py); the reference copy is
        kept: it stays the initial model on purpose, resuming must not move the KL anchor.
        A trainable policy's directory without optimizer state is an error: a fresh AdamW would
        restart its moment estimates and silently change the run. A LoRA policy loads its adapter
        (the base stays as loaded); an adapter directory and a full model do not stand in for each other.
        """
        directory = Path(directory)
        optim = None
        if self.optimizer is not None:  # read first: a missing optimizer state fails before any weight changes
            optim = read_optimizer_state(directory, self.role, trained_names(self.model), self.device)
        if self.lora:
            load_adapter_weights(self.model, directory, self.role)
        else:
            self._load_full(directory)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(optim)
        self.sync_engine()

    def _load_full(self, directory: Path) -> None:
        """Copy the weights of the full model in `directory` (either checkpoint format) into this policy's model."""
        if is_adapter_dir(directory):
            raise ValueError(f"{directory} holds a LoRA adapter but {self.role}.lora.rank=0 (full fine-tuning); set "
                             f"{self.role}.lora.rank to the adapter's rank to resume it")
        self.model.load_state_dict(load_model_weights(directory, next(self.model.parameters()).dtype))


def skipped_update(batch: list[TrainSequence]) -> dict:
    """The metrics of an update whose batch has no loss token: no step at all."""
    return {"skipped": True, "n_seqs": len(batch), "n_tokens": 0}


def batch_metrics(batch: list[TrainSequence], n_tokens: int, t0: float) -> dict:
    """n_seqs, n_tokens, seq_tokens (every token: what each epoch runs) and time_s since `t0` of an update."""
    return dict(n_seqs=len(batch), n_tokens=n_tokens, seq_tokens=sum(len(s.input_ids) for s in batch),
                time_s=time.perf_counter() - t0)


class TokenLogprobs(torch.nn.Module):
    """`sequence_token_logprobs(model, ...)` as a module call, the one way the update runs the model.

    A module so that FSDP2 (coevo/train/sharded.py) can make it the root: the root's pre-forward
    gathers the parameters outside the decoder layers (embeddings, final norm, LM head), which
    the positions path calls directly (`base_model`, `get_output_embeddings`), never through the
    HF model's own forward. Holds no parameters of its own.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, prefix: int = 0) -> torch.Tensor:
        """ids, attn: [b, T]; mask: [b, T-1] wanted positions; prefix: shared prompt length (0: none).

        Returns [b, T-1] float32 next-token log-probs, 0 off `mask` (`sequence_token_logprobs`).
        """
        return sequence_token_logprobs(self.model, ids, attn, positions=mask, prefix_len=prefix)
