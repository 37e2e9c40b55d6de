"""Benchmark (not a test): rollout throughput of the `hf` and `vllm` engines, vLLM start-up and weight sync.

64 solver prompts (the solver's opening chat, `solver.agent.solver_messages`, on wiki_mini dev
questions) x 128 new tokens, sampled as in training (temperature 1, top-p 1, one seed). Prints one
JSON line with exactly:
    {"tokens_per_s": {"hf": ..., "vllm": ...}, "vllm_startup_s": ..., "weight_sync_s": ...}
- tokens_per_s: generated tokens (EOS included, as the engines return them) / seconds of one
  `generate` call over all prompts, after a small warm-up call on each engine;
- vllm_startup_s: `VLLMEngine(...)` construction: staging the weights in /dev/shm, starting the
  engine processes, loading weights, allocating the KV cache;
- weight_sync_s: median of 3 `sync_weights(model)` calls (save to tmpfs + reload_weights +
  reset_prefix_cache; or CUDA IPC with --weight-sync ipc).
Diagnostics (device, dtype, token counts, seconds) go to stderr.

    .venv/bin/python -m bench.rollout                     # CPU: SmolLM2-135M, fp32
    python -m bench.rollout --model Qwen/Qwen2.5-3B-Instruct --no-enforce-eager   # GPU: bf16 by default
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from coevo.core.config import PolicyConfig
from coevo.core.inputs import load_labelled_questions
from coevo.core.types import SamplingParams
from coevo.train.engines.hf import HFEngine
from coevo.train.models import load_model_and_tokenizer
from coevo.train.policy import Policy
from solver.agent import solver_messages

# vLLM logs to stdout by default; this script's stdout is one JSON line (engine processes inherit it).
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
DEFAULT_QUESTIONS = Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data")) / "wiki_mini" / "questions_dev.jsonl"


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="preset, local HF dir or hub id")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS, help="JSONL with a 'question' field")
    parser.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4 if cuda else 0.1,
                        help="vLLM's share of GPU memory (of system RAM on CPU)")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True,
                        help="skip CUDA graph capture (use --no-enforce-eager on GPUs for speed)")
    parser.add_argument("--weight-sync", choices=("tmpfs", "ipc"), default="tmpfs")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def solver_prompts(policy: Policy, path: Path, count: int) -> list[list[int]]:
    """Token ids of the solver's opening turn for the first `count` questions of `path`."""
    if not path.exists():
        raise FileNotFoundError(f"questions file {path} not found: pass --questions or set COEVO_SHARED_DATA")
    questions = [q.question for q in load_labelled_questions(path)[0]]
    if len(questions) < count:
        raise ValueError(f"{path} holds {len(questions)} questions, fewer than --prompts {count}")
    return [policy.chat_prompt_ids(solver_messages(q, max_searches=3)) for q in questions[:count]]


def throughput(engine, prompts: list[list[int]], sampling: SamplingParams) -> tuple[float, int, float]:  # noqa: ANN001
    """(tokens/s, tokens, seconds) of one generate call over all prompts, after a 2-prompt warm-up."""
    engine.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=8, seed=sampling.seed))
    t0 = time.perf_counter()
    out = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for row in out for c in row)
    return tokens / seconds, tokens, seconds


def main() -> None:
    args = parse_args()
    from coevo.train.engines.vllm import VLLMEngine  # after argparse: --help works without vLLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load_model_and_tokenizer(args.model, args.dtype)
    model = model.to(device).eval()
    cfg = PolicyConfig(preset="bench", model=args.model, dtype=args.dtype, frozen=True, kl_coef=0.0,
                       gpu_memory_utilization=args.gpu_memory_utilization)
    hf_engine = HFEngine(model, tok)
    prompts = solver_prompts(Policy(cfg, model, tok, engine=hf_engine), args.questions, args.prompts)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    t0 = time.perf_counter()
    engine = VLLMEngine(model, tok, cfg, enforce_eager=args.enforce_eager, weight_sync=args.weight_sync,
                        seed=args.seed)
    startup_s = time.perf_counter() - t0
    try:
        vllm_tps, vllm_tokens, vllm_s = throughput(engine, prompts, sampling)
        syncs = []
        for _ in range(3):
            engine.sync_weights(model)
            syncs.append(engine.last_sync_s)
    finally:
        engine.close()
    with torch.no_grad():  # after vLLM, so a vLLM failure shows before the long HF run
        hf_tps, hf_tokens, hf_s = throughput(hf_engine, prompts, sampling)
    print(json.dumps({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "model": args.model,
                      "dtype": args.dtype, "prompts": len(prompts), "mean_prompt_tokens":
                      round(sum(map(len, prompts)) / len(prompts), 1), "tokens": {"hf": hf_tokens, "vllm": vllm_tokens},
                      "generate_s": {"hf": round(hf_s, 2), "vllm": round(vllm_s, 2)},
                      "llm_start_s": round(engine.startup_s, 2), "syncs_s": [round(s, 3) for s in syncs],
                      "weight_sync": args.weight_sync, "enforce_eager": args.enforce_eager}), file=sys.stderr)
    print(json.dumps({"tokens_per_s": {"hf": round(hf_tps, 1), "vllm": round(vllm_tps, 1)},
                      "vllm_startup_s": round(startup_s, 2), "weight_sync_s": round(statistics.median(syncs), 3)}),
          flush=True)


if __name__ == "__main__":
    main()
