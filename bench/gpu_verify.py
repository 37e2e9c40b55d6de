"""GPU check for a bare torch + transformers machine: one JSON line per phase on stdout.

    python bench/gpu_verify.py > gpu.jsonl                # from the repo root; or python -m bench.gpu_verify
    python bench/gpu_verify.py --tiny                     # every phase on the CPU at tiny shapes, < 60 s (the suite)
    python bench/gpu_verify.py --tiny --device cuda       # the same tiny shapes on the GPU: a seconds-long smoke test
    python bench/gpu_verify.py --only lora_update,hf_generate

Needs torch and transformers only: nothing is downloaded, no vLLM, Ray, omegaconf, Hydra or peft. From coevo it
imports only modules whose whole import chain is torch, transformers and the standard library (coevo.core.grpo,
coevo.train.device_memory, precision, recompute, public_configs); what needs more (coevo/train/sharded.py,
policy.py: omegaconf) is mirrored with torch's own APIs, citing the function it mirrors. Where the planner
(coevo/train/gpu_plan.py, omegaconf + Hydra) imports, each phase puts its figures beside the measured ones;
elsewhere `planner` says why it cannot. Models have random weights from the presets' public config values
(coevo/train/public_configs.py). Phases, each guarded (an exception gives `{"phase", "error"}` and the next one
runs; `--budget-s` spent gives `skipped`), in the order run:
- environment: python, torch, its CUDA, transformers, device name, capability, driver, NCCL, total / free memory,
  bf16 support, which optional packages are importable;
- startup_replay: coevo/train/sharded.py's start-up at world size 1 on one rank's share of the 4-rank headline
  solver (the 7B config with a quarter of its layers and vocabulary: 1/4 of the parameters): host copy, meta
  skeleton, fully_shard, to_empty, fill from the host, the bf16 reference, AdamW moments, empty_cache, with CUDA
  allocated / reserved / free after each; vLLM's start check (free >= 0.35 x total) after them; the planner's
  start-up terms and vLLM check for that solver;
- fsdp_update: a world-size-1 FSDP2 GRPO update (NCCL; gloo on the CPU) at the 3B shape: fp32 masters, bf16
  gathers and autocast, gradient checkpointing, one row per micro-batch: tokens/s, peak, finite grad norm, beside
  the planner's terms for the same shape and batch;
- logprob_mismatch: mean / p99 |Δ log p| of sampled tokens, served bf16 weights vs fp32 masters under autocast;
- weight_sync: GB/s of the bf16 cast + full_tensor of each parameter, one at a time, and of its copy to pinned
  host memory (world size 1: the gather is a local copy);
- lora_update: one step of a rank-64 adapter (written here; no peft) over the bf16 base at the 3B shape at lr
  1e-6 and 1e-5: peak against the planner, share of merged served weights that change;
- hf_generate: HF generate tokens/s at the 3B shape in bf16, batch 32.
A phase whose model does not fit the device at every layer halves the layer count until it does and says so
(`shape`). With --tiny every phase runs at hidden 64 and 2 layers, bf16 included, so the code paths are the
same. Exit status 0 when no phase errs, 1 otherwise.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

if __package__ in (None, ""):  # `python bench/gpu_verify.py`: the repo root, not bench/, must be importable
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.gpu_verify_lib import REAL, TINY, Ctx, free_total, gb, reset_peak  # noqa: E402
from bench.gpu_verify_serve import hf_generate, logprob_mismatch, lora_update  # noqa: E402
from bench.gpu_verify_train import fsdp_update, startup_replay, weight_sync  # noqa: E402
from coevo.train.device_memory import empty_device_cache  # noqa: E402

OPTIONAL = ("vllm", "ray", "omegaconf", "hydra", "peft")


def _driver() -> str:
    """The NVIDIA driver: /proc/driver/nvidia/version's first line, else the CUDA driver API's version number."""
    try:
        return Path("/proc/driver/nvidia/version").read_text(encoding="ascii").splitlines()[0].strip()
    except OSError:
        pass
    try:
        import ctypes

        version = ctypes.c_int()
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
        return f"CUDA driver API {version.value // 1000}.{version.value % 1000 // 10}"
    except OSError as e:
        return f"unknown ({e})"


def _nccl() -> str:
    version = torch.cuda.nccl.version()  # a tuple in current torch, an int in old ones
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def environment(ctx: Ctx) -> dict:
    """Versions, the device and its memory, bf16 support, and which optional packages this machine has."""
    import transformers

    free, total = free_total(ctx.device)
    out = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "transformers": transformers.__version__, "cuda_available": torch.cuda.is_available(),
           "device": str(ctx.device), "bf16": ctx.bf16, "tiny": ctx.sizes.tiny, "cpus": os.cpu_count(),
           "importable": {name: importlib.util.find_spec(name) is not None for name in OPTIONAL}}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        out.update(device_name=props.name, capability=f"{props.major}.{props.minor}", gpus=torch.cuda.device_count(),
                   driver=_driver(), nccl=_nccl(),
                   bf16_supported=torch.cuda.is_bf16_supported(), total_gb=gb(total), free_gb=gb(free))
    else:
        out.update(device_name=platform.processor() or platform.machine(), host_total_gb=gb(total),
                   host_available_gb=gb(free))
    return out


PHASES: dict[str, Callable[[Ctx], dict]] = {
    "environment": environment, "startup_replay": startup_replay, "fsdp_update": fsdp_update,
    "logprob_mismatch": logprob_mismatch, "weight_sync": weight_sync, "lora_update": lora_update,
    "hf_generate": hf_generate}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python bench/gpu_verify.py", description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (hidden 64, 2 layers), on the CPU by default")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda where available, cpu with --tiny)")
    parser.add_argument("--only", default="", help=f"comma-separated phases to run, of {', '.join(PHASES)}")
    parser.add_argument("--budget-s", type=float, default=480.0, help="phases not started by then are skipped")
    args = parser.parse_args(argv)
    unknown = sorted(set(filter(None, args.only.split(","))) - set(PHASES))
    if unknown:
        parser.error(f"--only: unknown phases {unknown}; expected some of {list(PHASES)}")
    return args


def make_ctx(args: argparse.Namespace) -> Ctx:
    """cuda:0 (bf16 where it is supported) or the CPU, where bf16 runs too (emulated if need be): the same paths."""
    name = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SystemExit("gpu_verify: --device cuda but torch sees no CUDA device")
        device = torch.device("cuda", torch.cuda.current_device() if name == "cuda" else int(name.split(":")[1]))
        torch.cuda.set_device(device)
        return Ctx(device, torch.cuda.is_bf16_supported(), TINY if args.tiny else REAL)
    return Ctx(torch.device("cpu"), True, TINY if args.tiny else REAL)


def open_group(ctx: Ctx, folder: str) -> None:
    """A world-size-1 process group (NCCL on CUDA, gloo on the CPU) on a file store in `folder`: no port, no env."""
    store = dist.FileStore(os.path.join(folder, "store"), 1)
    dist.init_process_group("nccl" if ctx.cuda else "gloo", store=store, rank=0, world_size=1)


def run_phase(ctx: Ctx, name: str, deadline: float) -> dict:
    """One phase's JSON record: its fields and seconds, or `error` (with where it was raised), or `skipped`."""
    if time.monotonic() > deadline:
        return {"phase": name, "skipped": "the time budget (--budget-s) was spent before it started"}
    reset_peak(ctx.device)
    t0 = time.perf_counter()
    try:
        out = PHASES[name](ctx)
    except Exception as e:  # noqa: BLE001 - one phase's failure must not hide the others
        frame = traceback.extract_tb(e.__traceback__)[-1]
        out = {"error": f"{type(e).__name__}: {e}"[:2000], "at": f"{Path(frame.filename).name}:{frame.lineno}"}
    finally:
        gc.collect()
        empty_device_cache()
    return {"phase": name, **out, "phase_s": round(time.perf_counter() - t0, 2)}


def main(argv: Optional[list[str]] = None) -> int:
    """Run the phases, print one JSON line each; 0 when none erred."""
    args = parse_args(argv)
    ctx = make_ctx(args)
    names = [n for n in PHASES if n in set(args.only.split(","))] if args.only else list(PHASES)
    deadline = time.monotonic() + args.budget_s
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu_verify_") as folder:
        open_group(ctx, folder)
        try:
            for name in names:
                record = run_phase(ctx, name, deadline)
                failed |= "error" in record
                print(json.dumps(record), flush=True)
        finally:
            dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
