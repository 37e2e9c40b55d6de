"""Benchmark (not a test): one GRPO `Policy.update` on a shape-faithful random-weight model, beside the planner.

    .venv/bin/python -m bench.update --model qwen2.5-7b --mode lora --tokens 8x4096 --device cuda
    .venv/bin/python -m bench.update --model qwen2.5-3b --mode full --tokens 8x4096 --checkpointing
    .venv/bin/python -m bench.update --model tiny-random --tokens 4x256          # CPU, seconds

The model is built from its config (a preset's public config values, coevo/train/shapes.py,
or a local directory's config.json) with random weights: nothing is downloaded. `--tokens BxT`:
B sequences of T tokens, the last `--completion` of each loss-masked, advantages +1/-1, no
stored old log-probs (the on-policy path). `--group G`: each G consecutive sequences share their
prompt, as a GRPO group's rollouts do (`--no-shared-prompt` runs every row's prompt anyway).
`--mode lora` trains a rank-`--rank` adapter over a bf16 base. `--cpu-bf16`: the forward passes in bf16 over the
fp32 weights (`cpu_bf16_autocast`, on a CPU with bf16 instructions). `--compile`: compiled decoder layers in the
update (`cpu_compile`); `logprob_gap` is then |compiled - eager| log-prob (mean, p99) on the first micro-batch.
`--repeats R`: R updates on the same batch, `update_s` the last (the first pays the compile), `updates_s` each.
`--profile`: the update runs under torch's profiler and `profile` says where its time went: each op's self time
summed by kind (`PROFILE_KINDS`: matmul, attention, cast/copy, optimizer, softmax/loss, other: elementwise ops,
norms, indexing) and the ten slowest ops; the profiler's overhead is in `update_s` then. Prints ONE JSON line:
    {"model", "mode", "device", "tokens", "micro_batch_size", "checkpointing", "cpu_bf16", "compile", "params",
     "trained_params", "update_s", "updates_s", "logprob_gap", "tokens_per_s", "peak_mem_gb", "planner_gb",
     "planner_terms_gb", "profile": {"self_s", "by_kind": {kind: {"s", "share"}}, "top": [[op, s], ...]} | null}
peak_mem_gb: torch's peak allocated CUDA memory during the update (weights and optimizer state
included; the CUDA context is not), or on the CPU the process's peak RSS. planner_gb: the
planner's (coevo/train/gpu_plan.py) weights + reference + grads + optimizer + update peak for the
same shape and settings, the number to compare with peak_mem_gb (its engine share and CUDA
context are left out: neither is in torch's count).
"""
from __future__ import annotations

import argparse
import json
import random
import resource
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from coevo.core.config import compose, to_object
from coevo.core.types import TrainSequence
from coevo.train.gpu_plan import GB, role_plan
from coevo.train.models import _build_tiny_tokenizer, resolve_model_path
from coevo.train.policy import Policy
from coevo.train.shapes import adapter_parameters, public_config, shape_of

_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.update", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-random", help="model preset (configs/model), hub id or local dir")
    parser.add_argument("--mode", choices=["full", "lora"], default="full")
    parser.add_argument("--rank", type=int, default=64, help="LoRA rank with --mode lora")
    parser.add_argument("--tokens", default="8x4096", help="BxT: B sequences of T tokens")
    parser.add_argument("--completion", type=int, default=512, help="loss-masked tokens at the end of each sequence")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--group", type=int, default=1, help="sequences per shared prompt (a GRPO group)")
    parser.add_argument("--no-shared-prompt", action="store_true", help="solver.shared_prompt=false")
    parser.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    parser.add_argument("--kl", type=float, default=0.001, help="kl_coef (> 0: a reference copy, or LoRA's base)")
    parser.add_argument("--cpu-bf16", action="store_true", help="solver.cpu_bf16_autocast=true")
    parser.add_argument("--compile", action="store_true", help="solver.cpu_compile=true (compiled decoder layers)")
    parser.add_argument("--repeats", type=int, default=1, help="updates run; update_s is the last (the first compiles)")
    parser.add_argument("--profile", action="store_true", help="self time by op kind (torch.profiler)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args(argv)


def role_config(args: argparse.Namespace, seq_len: int) -> tuple:
    """The solver block the update runs with (and the run config the planner reads)."""
    model_override = [f"solver={args.model}"] if (_ROOT / "configs/model" / f"{args.model}.yaml").exists() \
        else [f"solver.model={args.model}"]
    overrides = model_override + [
        f"solver.micro_batch_size={args.micro_batch}",
        f"solver.shared_prompt={str(not args.no_shared_prompt).lower()}", f"solver.kl_coef={args.kl}", "solver.lr=1e-6",
        f"solver.gradient_checkpointing={str(args.checkpointing).lower()}", f"solver.max_episode_tokens={seq_len}",
        f"solver.max_prompt_tokens={seq_len}", "solver.max_turns=1", f"solver.max_new_tokens={args.completion}",
        f"solver.num_gpus={1 if args.device.startswith('cuda') else 0}", "rollout=hf", "run.plan_check=false",
        f"solver.cpu_bf16_autocast={str(args.cpu_bf16).lower()}", f"solver.cpu_compile={str(args.compile).lower()}"]
    if args.mode == "lora":
        overrides += [f"solver.lora.rank={args.rank}", "solver.dtype=bfloat16"]
    cfg = to_object(compose(overrides))
    return cfg, cfg.solver


def build_model(name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """Random weights in the model's real shape: from public config values or the config file, never a download."""
    config = public_config(name) or AutoConfig.from_pretrained(resolve_model_path(name))
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def batch(n: int, length: int, completion: int, vocab: int, group: int = 1) -> list[TrainSequence]:
    """`n` random sequences; each `group` consecutive ones share their prompt (the first length - completion tokens)."""
    rng = random.Random(0)
    prompt = max(1, length - completion)
    prompts = [[rng.randrange(1, vocab) for _ in range(prompt)] for _ in range(0, n, max(1, group))]
    return [TrainSequence(prompts[i // max(1, group)] + [rng.randrange(1, vocab) for _ in range(length - prompt)],
                          [0] * prompt + [1] * (length - prompt), advantage=1.0 if i % 2 == 0 else -1.0)
            for i in range(n)]


# Op-name fragments of each kind, tried in order; an op matching none is "other".
PROFILE_KINDS = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
                 ("attention", ("scaled_dot_product", "flash_attention")),
                 ("cast/copy", ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous")),
                 ("optimizer", ("_foreach_", "addcdiv", "addcmul", "lerp")),
                 ("softmax/loss", ("softmax", "logsumexp", "gather")))


def op_kind(name: str) -> str:
    """The `PROFILE_KINDS` kind of an op name."""
    return next((kind for kind, parts in PROFILE_KINDS if any(p in name for p in parts)), "other")


def profile_summary(events: list[tuple[str, float]], top: int = 10) -> dict:
    """(op name, self seconds) pairs -> total self seconds, seconds and share by kind, the `top` slowest ops."""
    total = sum(s for _, s in events)
    by_kind: dict[str, float] = {}
    for name, s in events:
        by_kind[op_kind(name)] = by_kind.get(op_kind(name), 0.0) + s
    return {"self_s": round(total, 3),
            "by_kind": {k: {"s": round(v, 3), "share": round(v / total, 4) if total else None}
                        for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "top": [[name, round(s, 3)] for name, s in sorted(events, key=lambda e: -e[1])[:top]]}


def timed_update(policy: Policy, seqs: list[TrainSequence], device: str,
                 profile: bool) -> tuple[dict, float, dict | None]:
    """(update metrics, seconds, profile summary or None)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profile else None
    t0 = time.perf_counter()
    if prof is None:
        metrics = policy.update(seqs)
    else:
        with prof:
            metrics = policy.update(seqs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if prof is None:
        return metrics, seconds, None
    events = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()]
    return metrics, seconds, profile_summary(events)


def logprob_gap(policy: Policy, seqs: list[TrainSequence]) -> dict:
    """Mean and p99 |compiled - eager| next-token log-prob over the first micro-batch's loss tokens (`--compile`)."""
    mb = policy.micro_batch_tensors(policy.micro_batches(seqs)[0])
    with torch.no_grad(), policy.compute():
        eager = policy.scorer(mb.ids, mb.attn, mb.mask, mb.prefix).float()
        with policy.update_layers.active():
            fused = policy.scorer(mb.ids, mb.attn, mb.mask, mb.prefix).float()
    gap = (fused - eager).abs()[mb.mask.bool()]
    return {"mean": float(gap.mean()), "p99": float(gap.quantile(0.99)), "tokens": int(gap.numel())}


def peak_gb(device: str) -> float:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / GB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    n, length = (int(x) for x in args.tokens.lower().split("x"))
    cfg, policy_cfg = role_config(args, length)
    model = build_model(policy_cfg.model, torch.bfloat16 if args.mode == "lora" else torch.float32, args.device)
    shape, adapter = shape_of(model), adapter_parameters(model, policy_cfg.lora)  # before any adapter is added
    tokenizer = _build_tiny_tokenizer()  # only its pad id is read: the batch is token ids already
    policy = Policy(policy_cfg, model, tokenizer, role="solver")
    seqs = batch(n, length, args.completion, shape.vocab, args.group)
    runs = [timed_update(policy, seqs, args.device, args.profile) for _ in range(max(1, args.repeats))]
    gap = logprob_gap(policy, seqs) if args.compile else None
    metrics, update_s, profile = runs[-1]
    plan = role_plan(cfg, "solver", policy_cfg, shape, adapter, int(cfg.cluster.gpu_memory_gb * GB))
    counted = {k: v for k, v in plan.terms.items() if k not in ("engine", "cuda_context")}
    planner = sum(counted.values()) + plan.transient.get("update", 0)
    terms = {**counted, "update": plan.transient["update"]}
    trained = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    return {"model": args.model, "mode": args.mode, "device": args.device, "tokens": args.tokens,
            "micro_batch_size": args.micro_batch, "group": args.group, "shared_prompt": not args.no_shared_prompt,
            "checkpointing": args.checkpointing, "cpu_bf16": args.cpu_bf16, "compile": args.compile,
            "params": shape.params, "trained_params": trained, "update_s": round(update_s, 2),
            "updates_s": [round(r[1], 2) for r in runs], "logprob_gap": gap,
            "tokens_per_s": round(n * length / update_s, 1),
            "peak_mem_gb": round(peak_gb(args.device), 2), "planner_gb": round(planner / GB, 2),
            "planner_terms_gb": {k: round(v / GB, 2) for k, v in terms.items()}, "grad_norm": metrics.get("grad_norm"),
            "profile": profile}


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
