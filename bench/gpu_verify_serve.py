"""The serving-side phases of bench/gpu_verify.py: pi_old mismatch, a LoRA update's served weights, HF generation.

Each phase takes the run's `Ctx` and returns its JSON fields. LoRA is written here by hand (peft's layer: y =
W x + alpha/r B A x, A Kaiming-uniform, B zero), not with peft: the bare machine has no peft, and one code path
everywhere measures the same thing.
"""
from __future__ import annotations

import math
import time

import torch
from transformers import GenerationConfig

from bench.gpu_verify_lib import (
    LORA_TARGETS,
    MID,
    Ctx,
    Scorer,
    build,
    count_params,
    fit_layers,
    grad_norm,
    grpo_backward,
    model_config,
    peak,
    planner_update,
    reset_peak,
    token_batch,
)
from coevo.core.grpo import sequence_token_logprobs
from coevo.train.device_memory import reference_copy
from coevo.train.precision import allocate_optimizer_state
from coevo.train.recompute import enable_gradient_checkpointing, train_mode


def _sampling(new_tokens: int) -> GenerationConfig:
    """Temperature-1 sampling over the whole vocabulary for exactly `new_tokens` (no EOS: random weights)."""
    return GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0)


def _prompts(ctx: Ctx, rows: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (rows, length), generator=g).to(ctx.device)


@torch.no_grad()
def logprob_mismatch(ctx: Ctx) -> dict:
    """|Δ log p| of sampled tokens between the served weights (bf16, computed in bf16: what the engine scores) and
    the update's compute (fp32 masters under bf16 autocast: what the trainer's pi_old is), mean and p99."""
    s = ctx.sizes
    changes, layers = fit_layers(ctx, MID, s.mid, 4 + 2)
    config = model_config(MID, changes)
    model = build(config, ctx.device)
    served = reference_copy(model, ctx.serving)  # one parameter at a time, as a generation copy is made
    prompts = _prompts(ctx, s.score_rows, s.gen_prompt, int(config.vocab_size))
    torch.manual_seed(0)
    ids = served.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                          generation_config=_sampling(s.score_new))
    attn = torch.ones_like(ids)
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.long, device=ctx.device)
    mask[:, s.gen_prompt - 1:] = 1  # the sampled tokens
    engine = sequence_token_logprobs(served, ids, attn, positions=mask)
    with ctx.autocast():
        trainer = sequence_token_logprobs(model, ids, attn, positions=mask)
    gap = (engine - trainer).abs()[mask.bool()].float()
    return {"shape": f"Qwen2.5-3B config, {layers}", "serving_dtype": str(ctx.serving).replace("torch.", ""),
            "update_compute": "fp32 weights under bf16 autocast" if ctx.bf16 else "fp32",
            "tokens": int(gap.numel()), "mean": float(gap.mean()), "p99": float(gap.quantile(0.99)),
            "max": float(gap.max()), "mean_logp": float(trainer[mask.bool()].mean()),
            "note": (f"random weights: near-flat next-token distributions (mean log p vs -ln V = "
                     f"{-math.log(int(config.vocab_size)):.2f}); a trained model's gap is not this one")}


class LoraLinear(torch.nn.Module):
    """peft's LoRA layer without peft: the frozen `base` plus alpha/r B A x, A fp32 Kaiming-uniform, B fp32 zero."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base, self.scale = base, alpha / rank
        device = base.weight.device
        self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features, device=device))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank, device=device))
        self.reset()  # peft's (and nn.Linear's) init of A

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        lora = (x.to(self.lora_A.dtype) @ self.lora_A.t()) @ self.lora_B.t()
        return out + (lora * self.scale).to(out.dtype)

    def reset(self) -> None:
        """A fresh adapter: A drawn again (Kaiming-uniform), B zero, so the merged weights start unchanged."""
        with torch.no_grad():
            torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
            self.lora_B.zero_()

    def delta(self) -> torch.Tensor:
        """alpha/r B A in fp32, [out, in]: what merging adds to the base weight."""
        return (self.lora_B @ self.lora_A) * self.scale


def add_lora(model: torch.nn.Module, rank: int, alpha: float) -> dict[str, LoraLinear]:
    """Wrap every Linear whose name ends with one of `LORA_TARGETS` (peft's rule for plain names)."""
    wrapped = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in LORA_TARGETS:
            parent = model.get_submodule(name.rpartition(".")[0])
            wrapped[name] = LoraLinear(module, rank, alpha)
            setattr(parent, name.rpartition(".")[2], wrapped[name])
    return wrapped


def lora_update(ctx: Ctx) -> dict:
    """One GRPO step of a rank-r adapter over the frozen base (in the serving dtype) at the 3B shape, at each lr of
    the sizes: its time, peak and grad norm, and the share of merged served weights that change (the merge: W + B A
    in fp32 from fp32 originals, cast once to the serving dtype; or from the base's own bf16 values, a checkpoint
    stored in bf16), beside the planner's LoRA terms."""
    s = ctx.sizes
    changes, layers = fit_layers(ctx, MID, s.mid, 4 + 2 + 1)
    config = model_config(MID, changes)
    model = build(config, ctx.device)  # its fp32 weights stand for a checkpoint's fp32 originals
    originals = {name: m.weight.detach().to("cpu", copy=True) for name, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in LORA_TARGETS}
    model.to(ctx.serving).requires_grad_(False)
    enable_gradient_checkpointing(model, "gpu_verify")
    served = sum(p.numel() for p in model.parameters())
    wrapped = add_lora(model, s.lora_rank, s.lora_alpha)
    params = [p for layer in wrapped.values() for p in (layer.lora_A, layer.lora_B)]
    scorer, batch = Scorer(model), token_batch(ctx, int(config.vocab_size))
    per_lr = {}
    for lr in s.lrs:
        torch.manual_seed(1)
        for layer in wrapped.values():
            layer.reset()
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        allocate_optimizer_state(optimizer)
        reset_peak(ctx.device)
        ctx.sync()
        t0 = time.perf_counter()
        with train_mode(model, True):
            grpo_backward(ctx, scorer, batch)
        norm = grad_norm(params)
        optimizer.step()
        ctx.sync()
        per_lr[f"{lr:g}"] = {"update_s": round(time.perf_counter() - t0, 3), "grad_norm": norm, **peak(ctx.device),
                             **_served_change(ctx, wrapped, originals, served)}
        del optimizer
    return {"shape": f"Qwen2.5-3B config, {layers}", "rank": s.lora_rank, "alpha": s.lora_alpha,
            "targets": list(LORA_TARGETS), "base_dtype": str(ctx.serving).replace("torch.", ""),
            "adapter_params": sum(p.numel() for p in params), "served_params": served,
            "tokens": f"{s.rows}x{s.seq}", "steps": 1, "by_lr": per_lr,
            "planner": planner_update(ctx, config, s.lora_rank)}


@torch.no_grad()
def _served_change(ctx: Ctx, wrapped: dict[str, LoraLinear], originals: dict[str, torch.Tensor],
                   served: int) -> dict:
    """How many served weights the merged adapter changes: from fp32 originals and from the bf16 base's values."""
    from_fp32 = from_base = targets = 0
    for name, layer in wrapped.items():
        delta = layer.delta()
        w32 = originals[name].to(ctx.device)
        from_fp32 += int(((w32 + delta).to(ctx.serving) != w32.to(ctx.serving)).sum())
        base = layer.base.weight
        from_base += int(((base.float() + delta).to(ctx.serving) != base).sum())
        targets += w32.numel()

    def share(changed: int) -> dict:
        return {"changed": changed, "share_of_targets": changed / targets, "share_of_served": changed / served}
    return {"merged_from_fp32_originals": share(from_fp32), "merged_from_the_served_base": share(from_base)}


@torch.no_grad()
def hf_generate(ctx: Ctx) -> dict:
    """HF `generate` tokens/s at the 3B shape in the serving dtype: `gen_rows` rows sampled at temperature 1 for
    exactly `gen_new` tokens each after a `gen_prompt`-token prompt, after a 2-token warm-up."""
    s = ctx.sizes
    changes, layers = fit_layers(ctx, MID, s.mid, 4 + 2)
    config = model_config(MID, changes)
    model = build(config, ctx.device, ctx.serving)
    prompts = _prompts(ctx, s.gen_rows, s.gen_prompt, int(config.vocab_size))
    attn = torch.ones_like(prompts)
    model.generate(input_ids=prompts, attention_mask=attn, generation_config=_sampling(2))
    reset_peak(ctx.device)
    ctx.sync()
    t0 = time.perf_counter()
    out = model.generate(input_ids=prompts, attention_mask=attn, generation_config=_sampling(s.gen_new))
    ctx.sync()
    seconds = time.perf_counter() - t0
    new = int(out.shape[0] * (out.shape[1] - s.gen_prompt))
    return {"shape": f"Qwen2.5-3B config, {layers}", "params": count_params(config),
            "dtype": str(ctx.serving).replace("torch.", ""), "batch": s.gen_rows, "prompt_tokens": s.gen_prompt,
            "new_tokens": new, "generate_s": round(seconds, 3), "tokens_per_s": round(new / seconds, 1),
            **peak(ctx.device)}
