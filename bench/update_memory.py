"""Benchmark (not a test): peak resident memory of one `Policy.update` against the batch size.

For each batch size (default 8, 16 and 32 sequences of `--seq-len` tokens, micro_batch_size 4)
a fresh subprocess builds the solver policy from its preset config (`Policy.from_config`:
model, reference copy when kl_coef > 0, AdamW, hf engine), runs one `Policy.update` and
reports the peak resident set size of that update; one process per size keeps one size's
peak (and the allocator's leftovers) out of the next one's. Prints one JSON line:
    {"model": ..., "seq_len": ..., "micro_batch_size": ..., "update_peak_mb": {"8": ..., ...},
     "baseline_mb": ..., "after_mb": {...}, "seconds": {...}}
(null for a size whose process was killed for passing `--rss-cap-mb`)
- baseline_mb: RSS just before the update (weights, reference copy, engine), from the first size;
- update_peak_mb: the process's peak RSS during the update (the kernel's high-water mark,
  reset right before the update; sampled with psutil where it cannot be reset). The first
  AdamW step adds its two fp32 moments (8 bytes per parameter) to every size alike;
- after_mb: RSS once the update has returned (what the update leaves behind).
Sequences are seeded random tokens: the first quarter is prompt (loss mask 0), the rest
policy tokens with advantage +1 / -1 alternately and no old log-probs (so they are recomputed,
the on-policy path). Diagnostics go to stderr.

    .venv/bin/python -m bench.update_memory                        # smollm2-135m, 1024 tokens
    .venv/bin/python -m bench.update_memory --model tiny-random --seq-len 256
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.update_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "tiny-random"),
                        help="solver preset (configs/solver/<model>.yaml)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--sizes", default="8,16,32", help="comma-separated sequence counts")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--num-gpus", type=float, default=0.0, help="> 0 puts the model on CUDA when present")
    parser.add_argument("--rss-cap-mb", type=float, default=0.0,
                        help="kill a size's process above this RSS and report null for it (0 = no cap)")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


def _rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


class PeakRss:
    """Peak RSS of this process between `start()` and `stop()`, in MiB.

    Resetting the kernel's high-water mark (clear_refs 5) makes VmHWM exact; where that is not
    allowed a thread samples RSS every 5 ms, which can miss very short spikes.
    """

    def __init__(self) -> None:
        self.exact = False
        self.sampled = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.sampled = max(self.sampled, _rss_mb())

    def start(self) -> None:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.exact = True
        except OSError:
            self.sampled = _rss_mb()
            self._thread.start()

    def stop(self) -> float:
        if self.exact:
            return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024
        self._stop.set()
        self._thread.join()
        return max(self.sampled, _rss_mb())


def child(args: argparse.Namespace) -> dict:
    """Build the policy, run one update on `args.child` sequences, return this size's numbers."""
    import torch

    from coevo.core.config import compose, to_object
    from coevo.core.types import TrainSequence
    from coevo.train.policy import Policy

    overrides = [f"solver={args.model}", "rollout=hf", f"solver.micro_batch_size={args.micro_batch_size}",
                 f"solver.num_gpus={args.num_gpus}"]
    policy = Policy.from_config(to_object(compose(overrides)).solver, role="solver")
    gen = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    n_prompt = args.seq_len // 4
    batch = [TrainSequence(torch.randint(0, vocab, (args.seq_len,), generator=gen).tolist(),
                           [0] * n_prompt + [1] * (args.seq_len - n_prompt), advantage=1.0 if i % 2 == 0 else -1.0)
             for i in range(args.child)]
    baseline = _rss_mb()
    on_cuda = policy.device.type == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    peak = PeakRss()
    peak.start()
    t0 = time.perf_counter()
    metrics = policy.update(batch)
    out = {"peak_mb": round(peak.stop(), 1), "baseline_mb": round(baseline, 1), "after_mb": round(_rss_mb(), 1),
           "seconds": round(time.perf_counter() - t0, 1), "exact_peak": peak.exact, "loss": metrics["loss"],
           "kl_coef": policy.cfg.kl_coef, "params_m": round(policy.num_parameters() / 1e6, 1)}
    if on_cuda:
        out["cuda_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def run_child(cmd: list[str], cap_mb: float) -> dict:
    """One size's numbers from its own process; {"killed_over_mb": cap} when it outgrew `cap_mb`."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if cap_mb > 0:
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                over = watched.memory_info().rss / 2**20 > cap_mb
            except psutil.NoSuchProcess:
                break
            if over:  # a shared machine must not be pushed into the OOM killer by a benchmark
                proc.kill()
                proc.wait()
                return {"killed_over_mb": cap_mb}
            time.sleep(0.2)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    runs = {}
    for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
        cmd = [sys.executable, "-m", "bench.update_memory", "--child", str(size), "--model", args.model,
               "--seq-len", str(args.seq_len), "--micro-batch-size", str(args.micro_batch_size),
               "--num-gpus", str(args.num_gpus)]
        runs[size] = run_child(cmd, args.rss_cap_mb)
        print(f"[update_memory] {size} sequences: {runs[size]}", file=sys.stderr, flush=True)
    done = [v for v in runs.values() if "peak_mb" in v]
    result = {"model": args.model, "seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size,
              "update_peak_mb": {str(k): v.get("peak_mb") for k, v in runs.items()},
              "baseline_mb": done[0]["baseline_mb"] if done else None}
    for key in ("after_mb", "seconds") + (("cuda_peak_mb",) if done and "cuda_peak_mb" in done[0] else ()):
        result[key] = {str(k): v.get(key) for k, v in runs.items()}
    if args.rss_cap_mb > 0:
        result["rss_cap_mb"] = args.rss_cap_mb
    print(json.dumps(result))


if __name__ == "__main__":
    main()
