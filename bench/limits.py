"""Benchmark (not a test): this machine's limits, and each stage of a learning step as a fraction of its limit.

    .venv/bin/python -m bench.limits                                   # GEMM peaks + vLLM decode (SmolLM2-135M)
    .venv/bin/python -m bench.limits --metrics runs/x/metrics.jsonl    # ... and that run's stages against them
    .venv/bin/python -m bench.limits --tiny --no-decode                # seconds: 256^3 GEMMs, no engine
    .venv/bin/python -m bench.limits solver.group_size=8               # overrides change the default --batch

Limits, measured here:
- matmul peak: best-of-`--repeats` `torch.mm` of two `--size` square matrices (one warm-up call first), on
  `--threads` threads (default: every core), in fp32 and bf16; GFLOP/s = 2*size^3 / seconds. bf16 is measured
  either way; `"native"` says whether the CPU has bf16 instructions (avx512_bf16 or amx_bf16 in /proc/cpuinfo;
  on CUDA `torch.cuda.is_bf16_supported()`): without them torch emulates bf16 (about 1 GFLOP/s on 2 AVX2
  cores), the "peak" is no hardware limit, and it is timed once at `--bf16-size` (default at most 1024).
- decode rate: the project's vLLM engine (coevo/train/engines/vllm.py) generating `--new-tokens` tokens for each
  of `--batch` distinct `--prompt-tokens`-token prompts, EOS ignored, so every row decodes all its tokens;
  tokens/s = batch x new tokens / seconds of one generate call, after a warm-up call, engine start-up excluded.
  The timing is bench/rollout.py's `throughput`. `--no-decode` skips it (the JSON then says so).
- default --batch: the most solver rollouts one step of `experiment=small_learning` generates at once (its
  first turn batches every episode): proposer.questions_per_step x proposer.group_size (candidates, each one a
  task when accepted) x solver.group_size (rollouts per task) = 4 x 4 x 4 = 64. A step whose proposer had
  fewer tasks accepted runs `accepted x solver.group_size` rows, and later turns only the live episodes.

Stages of a run (`--metrics RUN_DIR/metrics.jsonl`), per step and their median:
- update, per role and for the whole stage: 6*N*T FLOPs over the role's update seconds
  (`update/<role>/time_s`; the stage: sum of the roles' ideal seconds over `time_s/update`) over the measured
  peak of the role's dtype. N: the role model's parameters (config.yaml beside metrics.jsonl, counted on the
  meta device; or `--params role=N`). T: `update/<role>/seq_tokens` (sequence tokens run forward and backward)
  where the run wrote it, else `update/<role>/n_tokens` (loss-masked tokens only: fewer, so the fraction is a
  lower bound); each row names the key it used. T counts each token once: the log-prob pass and further
  `ppo_epochs` are not credited, while tokens of a prompt shared in a micro-batch are credited per row.
- generation: generated tokens of the solve stage over `time_s/solve` over the decode rate. Tokens:
  `tokens/solve/decode` (every generate call of the stage, solver and ranker), else `solver/gen_tokens` +
  `ranker/gen_tokens` (coevo.solve runs). The solve stage also runs retrieval: the fraction is a lower bound.
Steps or roles lacking a key (or with a zero denominator) are counted and listed under `skipped`, never guessed.

Prints ONE JSON line (also written to `--out`):
    {"device", "threads", "cpu_flags", "bf16_native",
     "matmul": {"size", "repeats", "fp32": {"gflops", "best_s"}, "bf16": {"gflops", "best_s", "native", "size",
                "repeats"}},
     "batch": {"value", "formula", "questions_per_step", "proposer_group_size", "solver_group_size", "overrides"},
     "decode": {"tokens_per_s", "batch", "new_tokens", "prompt_tokens", "tokens", "seconds", "engine_start_s",
                "model", "dtype"} | null,
     "decode_skipped": "--no-decode" | null,
     "stages": {"steps", "update": {"rows", "steps", "median", "t_keys", "skipped"},
                "generation": {"rows", "median", "decode_tokens_per_s", "fraction_skipped", "skipped"}} | null}
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import torch

from coevo.core.config import compose
from coevo.core.io import atomic_write_text, iter_jsonl
from coevo.train import precision

REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")
PEAK_KEYS = {"float32": "fp32", "bfloat16": "bf16"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog="python -m bench.limits", description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="config overrides for the default --batch (after "
                        "experiment=small_learning)")
    parser.add_argument("--tiny", action="store_true", help="smoke sizes: 256^3 GEMMs, 1 repeat, tiny-random, "
                        "batch 4 x 16 tokens")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--size", type=int, default=None, help="GEMM M = N = K (default 4096; --tiny 256)")
    parser.add_argument("--repeats", type=int, default=None, help="timed GEMMs, best kept (default 3; --tiny 1)")
    parser.add_argument("--bf16-size", type=int, default=None, help="bf16 GEMM size (default: --size where bf16 "
                        "is native, else at most 1024, timed once)")
    parser.add_argument("--no-decode", action="store_true", help="skip the vLLM decode rate")
    parser.add_argument("--model", default=None, help="decode model (default smollm2-135m; --tiny tiny-random)")
    parser.add_argument("--dtype", default="bfloat16" if cuda else "float32", help="decode dtype")
    parser.add_argument("--batch", type=int, default=None, help="decode rows (default: a small_learning step's)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens decoded per row (default 128; "
                        "--tiny 16)")
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4 if cuda else 0.1,
                        help="vLLM's share of GPU memory (of system RAM on CPU)")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=not cuda,
                        help="skip CUDA graph capture")
    parser.add_argument("--metrics", type=Path, default=None, help="a run's metrics.jsonl: its stages' fractions")
    parser.add_argument("--params", action="append", default=[], metavar="ROLE=N",
                        help="parameters of a role's model (instead of the run's config.yaml)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON line here")
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.size = args.size or (256 if tiny else 4096)
    args.repeats = args.repeats or (1 if tiny else 3)
    args.model = args.model or ("tiny-random" if tiny else "smollm2-135m")
    args.new_tokens = args.new_tokens or (16 if tiny else 128)
    args.threads = args.threads or os.cpu_count() or 1
    return args


# ---- matmul peak ------------------------------------------------------------------------------

def cpu_flags() -> dict[str, bool]:
    """The bf16 and vector flags of the first CPU in /proc/cpuinfo (all False where it is unreadable)."""
    present = precision.cpu_flags()
    return {flag: flag in present for flag in REPORTED_FLAGS}


def bf16_native(device: str, flags: dict[str, bool]) -> bool:
    if device.startswith("cuda"):
        return bool(torch.cuda.is_bf16_supported())
    return any(flags.get(f, False) for f in precision.BF16_CPU_FLAGS)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def gemm(size: int, dtype: torch.dtype, device: str, repeats: int) -> dict[str, float]:
    """GFLOP/s of the best of `repeats` timed `size`^3 matmuls, after one untimed warm-up (allocations, kernels)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, generator=gen, device=device).to(dtype)
    b = torch.randn(size, size, generator=gen, device=device).to(dtype)
    out = torch.empty(size, size, dtype=dtype, device=device)
    torch.mm(a, b, out=out)
    _sync(device)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        _sync(device)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"gflops": round(2 * size**3 / best / 1e9, 2), "best_s": round(best, 4)}


def matmul_peaks(args: argparse.Namespace, native: bool) -> dict[str, Any]:
    """fp32 and bf16 GEMM peaks. Emulated bf16 (no native instructions) runs at about 1 GFLOP/s on
    AVX2 cores: a 4096^3 product takes minutes, so it is measured at --bf16-size (default 1024), once."""
    torch.set_num_threads(args.threads)
    bf16_size = args.bf16_size or (args.size if native else min(args.size, 1024))
    bf16_repeats = args.repeats if native else 1
    return {"size": args.size, "repeats": args.repeats,
            "fp32": gemm(args.size, torch.float32, args.device, args.repeats),
            "bf16": {**gemm(bf16_size, torch.bfloat16, args.device, bf16_repeats), "native": native,
                     "size": bf16_size, "repeats": bf16_repeats}}


# ---- decode rate ------------------------------------------------------------------------------

def step_batch(overrides: list[str]) -> dict[str, Any]:
    """Rows of a step's first solver turn at most: questions_per_step x proposer G x solver G (module docstring)."""
    experiment = [] if any(o.startswith("experiment=") for o in overrides) else ["experiment=small_learning"]
    cfg = compose(experiment + list(overrides))
    q, pg, sg = (int(cfg.proposer.questions_per_step), int(cfg.proposer.group_size), int(cfg.solver.group_size))
    return {"value": q * pg * sg, "formula": "proposer.questions_per_step x proposer.group_size x solver.group_size",
            "questions_per_step": q, "proposer_group_size": pg, "solver_group_size": sg,
            "overrides": experiment + list(overrides)}


class PureDecode:
    """A `VLLMEngine` whose `generate` ignores EOS and stop strings: every row decodes `max_new_tokens`.

    The engine's own `generate` stops at EOS, so rows would drop out of the batch at random points and
    the rate would mix batch sizes. Sampling otherwise as the engine's `_vllm_params`: same seeds,
    full vocabulary, the sampled token's log-prob (training asks for it too).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[list[SimpleNamespace]]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        seed = 0 if sampling.seed is None else int(sampling.seed)
        params = [VSamplingParams(n=1, temperature=float(sampling.temperature), top_p=float(sampling.top_p), top_k=0,
                                  min_p=0.0, seed=seed + i, max_tokens=int(sampling.max_new_tokens), ignore_eos=True,
                                  logprobs=0) for i in range(len(prompts))]
        outs = self.engine.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params,
                                        use_tqdm=False)
        return [[SimpleNamespace(token_ids=list(c.token_ids)) for c in out.outputs] for out in outs]


def decode_rate(args: argparse.Namespace, batch: int) -> dict[str, Any]:
    """vLLM pure-decode tokens/s at `batch` rows (engine start-up excluded); checks every row decoded fully."""
    # After argparse: --no-decode runs never import vLLM or load a model. bench/rollout.py also
    # routes vLLM's logging to stderr on import (stdout is the one JSON line).
    from bench.rollout import throughput
    from coevo.core.config import PolicyConfig
    from coevo.core.types import SamplingParams
    from coevo.train.engines.vllm import VLLMEngine
    from coevo.train.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(args.model, args.dtype)
    # The warm-up call decodes 8 tokens: the budget must hold them whatever --new-tokens is.
    cfg = PolicyConfig(preset="bench", model=args.model, dtype=args.dtype, frozen=True, kl_coef=0.0,
                       gpu_memory_utilization=args.gpu_memory_utilization, max_prompt_tokens=args.prompt_tokens,
                       max_new_tokens=max(8, args.new_tokens))
    rng = random.Random(0)  # distinct prompts: the prefix cache must not share them
    vocab = min(len(tok), int(model.config.vocab_size))
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_tokens)] for _ in range(batch)]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=0)
    engine = VLLMEngine(model, tok, cfg, enforce_eager=args.enforce_eager, seed=0)
    try:
        tps, tokens, seconds = throughput(PureDecode(engine), prompts, sampling)
    finally:
        engine.close()
    if tokens != batch * args.new_tokens:  # the denominator: every row decoded all its tokens
        raise RuntimeError(f"vLLM returned {tokens} tokens, expected batch {batch} x {args.new_tokens}")
    return {"tokens_per_s": round(tps, 1), "batch": batch, "new_tokens": args.new_tokens,
            "prompt_tokens": args.prompt_tokens, "tokens": tokens, "seconds": round(seconds, 3),
            "engine_start_s": round(engine.startup_s, 2), "model": args.model, "dtype": args.dtype}


# ---- stages of a run --------------------------------------------------------------------------

def role_shapes(run_dir: Path, roles: set[str], params: dict[str, int], device: str) -> dict[str, dict[str, Any]]:
    """{role: {"params", "dtype", "peak"}} for the updated roles: `--params` first, else the run's config.yaml.

    The peak is the measured one of the dtype the update multiplies in: the role's dtype, or bf16 for
    fp32 weights under `bf16_autocast` on a CUDA device or `cpu_bf16_autocast` on a CPU with bf16
    instructions: `precision.bf16_compute` (the run is taken to have run on this machine).
    """
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    cfg = OmegaConf.load(path) if path.is_file() else None
    out = {}
    for role in sorted(roles):
        block = cfg.get(role) if cfg is not None else None
        dtype = str(block.get("dtype", "float32")) if block is not None else "float32"
        if dtype == "float32" and block is not None and precision.bf16_compute(block, torch.device(device)):
            dtype = "bfloat16"
        n = params.get(role)
        if n is None and block is not None:
            from coevo.train.shapes import meta_model, shape_of
            n = shape_of(meta_model(str(block.model))).params
        if n is not None:
            out[role] = {"params": int(n), "dtype": dtype, "peak": PEAK_KEYS.get(dtype)}
    return out


def _median(values: list[float]) -> Optional[float]:
    return round(statistics.median(values), 4) if values else None


def update_rows(records: list[dict], shapes: dict[str, dict], peaks: dict[str, float]) -> dict[str, Any]:
    """Per (step, role): 6*N*T / update seconds / peak; per step: the roles' ideal seconds / `time_s/update`."""
    rows, steps, skipped = [], [], []
    for rec in records:
        step, ideal_total, complete = rec.get("step"), 0.0, True
        for role, u in sorted((rec.get("update") or {}).items()):
            shape, seconds = shapes.get(role), u.get("time_s")
            t_key = "seq_tokens" if "seq_tokens" in u else "n_tokens"
            tokens = u.get(t_key)
            peak = peaks.get(shape["peak"]) if shape and shape["peak"] else None
            why = ("update skipped (frozen role or empty batch)" if u.get("skipped") else
                   f"no parameter count for {role} (--params {role}=N or config.yaml)" if shape is None else
                   f"no measured peak for dtype {shape['dtype']}" if not peak else
                   "no update/<role>/seq_tokens or n_tokens" if not tokens else
                   "no update/<role>/time_s > 0" if not seconds or seconds <= 0 else None)
            if why:
                complete = complete and bool(u.get("skipped"))  # a skipped update takes no stage time
                skipped.append({"step": step, "role": role, "why": why})
                continue
            ideal = 6 * shape["params"] * tokens / (peak * 1e9)
            ideal_total += ideal
            rows.append({"step": step, "role": role, "params": shape["params"], "tokens": tokens, "t_key": t_key,
                         "seconds": seconds, "peak": shape["peak"], "ideal_s": round(ideal, 4),
                         "fraction": round(ideal / seconds, 4)})
        stage_s = (rec.get("time_s") or {}).get("update")
        if complete and ideal_total > 0 and stage_s and stage_s > 0:
            steps.append({"step": step, "seconds": stage_s, "ideal_s": round(ideal_total, 4),
                          "fraction": round(ideal_total / stage_s, 4)})
        elif ideal_total > 0:
            skipped.append({"step": step, "role": "(stage)", "why": "a role lacks its fraction or no time_s/update"})
    medians = {role: _median([r["fraction"] for r in rows if r["role"] == role]) for role in sorted(shapes)}
    return {"rows": rows, "steps": steps, "median": {**medians, "stage": _median([s["fraction"] for s in steps])},
            "t_keys": {k: sum(1 for r in rows if r["t_key"] == k) for k in ("seq_tokens", "n_tokens")},
            "skipped": skipped}


def _generated_tokens(rec: dict) -> tuple[Optional[int], Optional[str]]:
    """(tokens, key) generated in the solve stage: `tokens/solve/decode`, else the solver's + ranker's gen_tokens."""
    decode = ((rec.get("tokens") or {}).get("solve") or {}).get("decode")
    if decode is not None:
        return int(decode), "tokens/solve/decode"
    solver = (rec.get("solver") or {}).get("gen_tokens")
    if solver is None:
        return None, None
    return int(solver) + int((rec.get("ranker") or {}).get("gen_tokens") or 0), "solver/gen_tokens+ranker/gen_tokens"


def generation_rows(records: list[dict], decode_tps: Optional[float]) -> dict[str, Any]:
    """Per step: generated tokens / `time_s/solve` / decode rate (fraction null without a decode rate)."""
    rows, skipped = [], []
    for rec in records:
        step = rec.get("step")
        tokens, key = _generated_tokens(rec)
        seconds = (rec.get("time_s") or {}).get("solve")
        why = ("no tokens/solve/decode or solver/gen_tokens" if key is None else
               "no time_s/solve > 0" if not seconds or seconds <= 0 else
               "no tokens generated" if tokens <= 0 else None)
        if why:
            skipped.append({"step": step, "why": why})
            continue
        rate = tokens / seconds
        rows.append({"step": step, "tokens": tokens, "tokens_key": key, "seconds": seconds,
                     "tokens_per_s": round(rate, 1),
                     "fraction": round(rate / decode_tps, 4) if decode_tps else None})
    return {"rows": rows, "median": _median([r["fraction"] for r in rows if r["fraction"] is not None]),
            "decode_tokens_per_s": decode_tps,
            "fraction_skipped": None if decode_tps else "no decode rate (--no-decode)", "skipped": skipped}


def read_metrics(path: Path) -> list[dict]:
    """The step records of a metrics.jsonl (a torn last line, from a killed run, is dropped)."""
    if not path.is_file():
        raise FileNotFoundError(f"--metrics {path}: no such file (a run directory's metrics.jsonl)")
    return [rec for _, rec in iter_jsonl(path, objects=True, skip_torn_last=True)]


def stage_fractions(records: list[dict], shapes: dict[str, dict], peaks: dict[str, float],
                    decode_tps: Optional[float]) -> dict[str, Any]:
    """Both stages of every step against their limits; `peaks` in GFLOP/s by "fp32"/"bf16"."""
    return {"steps": len(records), "update": update_rows(records, shapes, peaks),
            "generation": generation_rows(records, decode_tps)}


def parse_params(items: list[str]) -> dict[str, int]:
    """`--params solver=1.35e8` -> {"solver": 135000000}."""
    out = {}
    for item in items:
        role, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--params {item!r}: expected ROLE=N, e.g. solver=134515008")
        out[role] = int(float(value))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    flags = cpu_flags()
    native = bf16_native(args.device, flags)
    matmul = matmul_peaks(args, native)
    batch = step_batch(args.overrides)
    rows = args.batch or (4 if args.tiny else batch["value"])  # --tiny: a smoke batch (`decode.batch` says which)
    decode = None if args.no_decode else decode_rate(args, rows)
    stages = None
    if args.metrics is not None:
        records = read_metrics(args.metrics)
        roles = {role for rec in records for role in (rec.get("update") or {})}
        shapes = role_shapes(args.metrics.parent, roles, parse_params(args.params), args.device)
        peaks = {"fp32": matmul["fp32"]["gflops"], "bf16": matmul["bf16"]["gflops"]}
        stages = stage_fractions(records, shapes, peaks, decode["tokens_per_s"] if decode else None)
    result = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
              "threads": torch.get_num_threads(), "cpu_flags": flags, "bf16_native": native, "matmul": matmul,
              "batch": batch, "decode": decode, "decode_skipped": "--no-decode" if args.no_decode else None,
              "stages": stages}
    if args.out is not None:
        atomic_write_text(args.out, json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
