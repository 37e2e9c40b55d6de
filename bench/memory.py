"""Benchmark (not a test): memory of the whole `coevo.solve` process tree, per stage, per batch size.

    .venv/bin/python -m bench.memory [--engines hf vllm] [--sizes 8 16 32] [--steps 20] [--long-size 16]
        [--size-steps 3] [--group-size 4] [--model-args HYDRA_OVERRIDE ...] [--out FILE] [--png FILE]
        [--rss-cap-mb MB] [--run-timeout S] [--interval 0.5] [--pss-interval 5]
    .venv/bin/python -m bench.memory --merge A.json B.json --out all.json   # join parts run separately

Full measurement (SmolLM2-135M solver + trainable ranker, the default config, G=4 so 2/4/8 questions
a step; the machine to itself). Estimated 2-4 h on the 2-core 24 GB machine, not measured: it
assumes 2-5 min a step at 16 sequences, so the two 20-step runs take most of it. Six runs, one
after the other; each prints its wall_s to stderr when it ends. Both engines at once:
    .venv/bin/python -m bench.memory --engines hf vllm --sizes 8 16 32 --steps 20 \\
        --rss-cap-mb 21000 --out runs/memory/memory.json --png docs/memory.png
or in two parts (1-2 h each), joined afterwards:
    .venv/bin/python -m bench.memory --engines hf --rss-cap-mb 21000 --out runs/memory/hf.json
    .venv/bin/python -m bench.memory --engines vllm --rss-cap-mb 21000 --out runs/memory/vllm.json
    .venv/bin/python -m bench.memory --merge runs/memory/hf.json runs/memory/vllm.json \\
        --out runs/memory/memory.json --png docs/memory.png
Smoke check (tiny random models; about 1 min with hf, 7 min with vllm, whose two tiny engines
take 3 min to start each run; tree peak 4.4 GB):
    .venv/bin/python -m bench.memory --engines hf vllm --sizes 4 8 --steps 3 --size-steps 2 --group-size 2 \\
        --model-args experiment=smoke solver.gpu_memory_utilization=0.01 ranker.gpu_memory_utilization=0.01

Each run is `python -m coevo.solve` in a subprocess (the real stack: driver, its reaper, the
vLLM EngineCore and Worker processes; coevo.solve loads every role in the driver whatever the
ray.* keys say), with
`rollout=<engine> solve.batch_questions=<size / group size> solver.group_size=<group size>` and
`solver.keep_zero_advantage=true ranker.keep_zero_advantage=true`, so the solver's update gets
exactly `size` sequences (one per episode) whatever the rewards; the ranker's update gets its
generated calls (their counts are in `runs.<key>.sequences`). `--model-args` come first.
Per engine there is one run per size, `--size-steps` steps each, except the `--long-size` run,
which gives `rss_after_step_mb` for `--steps` steps (it runs one more, so that the last reported
step is not followed by the run's shutdown).

Sampling, every `--interval` s and at once on each stage change and step end: the driver and
all its descendants from /proc (`rss`: sum of VmRSS, the measure everything below reports
unless named `pss`; a page shared by several processes counts in each; `anon`: sum of RssAnon,
private heap only). `pss` (sum of Pss from smaps_rollup: shared pages split between their users,
no double counting) costs ~60 ms per GB of tree, so it is read every `--pss-interval` s and at
step ends only. `shm`: growth of /dev/shm since the run started (vLLM's weight-sync staging
lives there and in no process's RSS). Stages come from the run itself: `COEVO_STAGE_FILE`
(coevo/core/stages.py) makes the driver append each stage transition, with its time, to a
file; a sample belongs to the stage open at its time: `load` (before the first stage),
`rollout` (solve), `update` (the whole update stage, every policy), inside it `logprobs` (old
and reference log-probs), `backward` (forward + backward + optimizer step) and `sync` (weight
sync to the engine), `other` (between stages). A stage shorter than the 50 ms poll may have no
sample. Step ends are the step lines the run prints (their metrics read from its metrics.jsonl).

Stdout is ONE JSON line, also written atomically to `--out` after every run (default
runs/memory-<stamp>/memory.json); the samples go to `<out>.samples.json`, each run's output to
`<out dir>/<engine>-<size>.log`, the plot to `--png` (default `<out>.png`). MB = MiB. Keys:
  update_peak_mb {engine: {size: peak rss in the update stage over the first --size-steps steps}},
  update_peak_pss_mb (same, pss), stage_peak_mb {engine: {size: {stage: peak rss}}},
  rss_after_step_mb / pss_after_step_mb {engine: [tree right after each step of the long run]},
  anon_after_step_by_process_mb {engine: {driver | <comm>:<pid>: [its RssAnon after each step]}} (which
  process grows),
  checks {engine: {update_growth: peak at the largest size / at the smallest - 1 (done: <= 0.15),
  rss_drift: after the last step / after step 2 - 1 (done: <= 0.05)}}, runs {<engine>-<size>: the
  run's command, returncode, error, wall_s, steps_done, sequences, estimate_peak_mb (the run's own
  pre-start estimate), peaks, leftover_processes (what the bench had to kill after the run's own
  reaper: should be empty)}, config, wall_s. A run killed over `--rss-cap-mb` or `--run-timeout`
  keeps its samples, with `error` set; the exit status is then 1 (also when a process outlived a run).
The run's own memory check (run.memory_check) stays on: a refused size reports its message as
`error` (`--model-args run.memory_check=false` measures it anyway).
Nothing a run starts outlives the benchmark: the benchmark's reaper (coevo/core/lifetime.py) covers
a killed benchmark; after each run the bench waits for the run's reaper, then kills what is left.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from bench.memory_trace import Trace, end_tree, stage_keys, summarize, watch
from coevo.core.io import atomic_write_text
from coevo.core.lifetime import ensure_reaper
from coevo.core.stages import STAGE_FILE_ENV

ROOT = Path(__file__).resolve().parent.parent

STAGE_COLORS = {"load": "#bbbbbb", "rollout": "#9ecae1", "update": "#fcbba1", "logprobs": "#fdae6b",
                "backward": "#fb6a4a", "sync": "#bcbddc"}


# ---- pure parts: the plan, the overrides, the report's tables ---------------------------------

def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else round(a / b - 1, 4)


def aggregate(runs: Mapping[str, dict]) -> dict[str, Any]:
    """The report's tables from the runs' summaries (also what `--merge` recomputes)."""
    out: dict[str, Any] = {k: {} for k in ("update_peak_mb", "update_peak_pss_mb", "stage_peak_mb",
                                           "rss_after_step_mb", "pss_after_step_mb",
                                           "anon_after_step_by_process_mb", "checks")}
    for run in sorted(runs.values(), key=lambda r: (r["engine"], r["size"])):
        eng, size = run["engine"], str(run["size"])
        for key in ("update_peak_mb", "update_peak_pss_mb", "stage_peak_mb"):
            out[key].setdefault(eng, {})[size] = run.get(key)
        if run["long"]:
            out["rss_after_step_mb"][eng] = run.get("rss_after_step_mb", [])
            out["pss_after_step_mb"][eng] = run.get("pss_after_step_mb", [])
            out["anon_after_step_by_process_mb"][eng] = run.get("anon_after_step_by_process_mb", {})
    for eng, peaks in out["update_peak_mb"].items():
        sizes = sorted(peaks, key=int)
        after = out["rss_after_step_mb"].get(eng, [])
        out["checks"][eng] = {"update_growth": _ratio(peaks[sizes[-1]], peaks[sizes[0]]) if len(sizes) > 1 else None,
                              "rss_drift": _ratio(after[-1], after[1]) if len(after) > 2 else None}
    return out


def plan_runs(engines: Sequence[str], sizes: Sequence[int], group_size: int, steps: int, size_steps: int,
              long_size: Optional[int]) -> list[dict[str, Any]]:
    """One run per engine and size (the long one reports `steps` steps); sizes must be multiples of the group size."""
    bad = [s for s in sizes if s <= 0 or s % group_size]
    if bad:
        raise ValueError(f"--sizes {bad}: sequences per update must be positive multiples of --group-size "
                         f"{group_size} (batch_questions = size / group size)")
    long_size = long_size if long_size is not None else sorted(sizes)[len(sizes) // 2]
    if long_size not in sizes:
        raise ValueError(f"--long-size {long_size} is not one of --sizes {list(sizes)}")
    # The long run does one step more: its step `steps` ends into a rollout, not into the run's shutdown,
    # which frees memory while the "after step" sample is read.
    return [{"engine": e, "size": s, "batch_questions": s // group_size, "group_size": group_size,
             "long": s == long_size, "steps": steps + 1 if s == long_size else size_steps,
             "after_steps": steps if s == long_size else size_steps} for e in engines for s in sizes]


def run_overrides(spec: Mapping[str, Any], model_args: Sequence[str], run_dir: Path) -> list[str]:
    return [*model_args, f"rollout={spec['engine']}", f"solve.steps={spec['steps']}",
            f"solve.batch_questions={spec['batch_questions']}", f"solver.group_size={spec['group_size']}",
            "solver.keep_zero_advantage=true", "ranker.keep_zero_advantage=true", f"run.dir={run_dir}"]


def run_one(spec: dict[str, Any], args: argparse.Namespace, out_dir: Path, token: Optional[str]) -> tuple[dict, dict]:
    """Run and sample one `coevo.solve`; returns (its summary, its timeline for the samples file)."""
    key = f"{spec['engine']}-{spec['size']}"
    run_dir, stage_file = out_dir / "runs" / key, out_dir / f"{key}.stages.jsonl"
    stage_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "coevo.solve", *run_overrides(spec, args.model_args, run_dir)]
    env = {**os.environ, STAGE_FILE_ENV: str(stage_file),
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    print(f"[memory] {key}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    trace = Trace(stage_file, run_dir / "metrics.jsonl")
    with open(out_dir / f"{key}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
        error = None
        try:
            error = watch(proc, trace, log, args)
        finally:
            leftover = end_tree(proc, trace, token)
            trace.finish()
    if error is None and proc.returncode != 0:
        error = f"exited with code {proc.returncode}: " + " | ".join(x for x in trace.tail[-3:] if x.strip())[-600:]
    summary = {**spec, "command": " ".join(["python", *cmd[1:]]), "log": str(out_dir / f"{key}.log"),
               "returncode": proc.returncode, "error": error, "wall_s": round(time.time() - trace.t0, 1),
               "steps_done": len(trace.metrics), "leftover_processes": leftover,
               "estimate_peak_mb": None if trace.estimate_gib is None else round(trace.estimate_gib * 1024),
               "sequences": {role: [m.get("update", {}).get(role, {}).get("n_seqs") for m in trace.metrics]
                             for role in ("solver", "ranker")},
               **summarize(trace.samples, trace.transitions, trace.step_ends, args.size_steps)}
    for series in ("rss_after_step_mb", "pss_after_step_mb"):
        summary[series] = summary[series][:spec["after_steps"]]
    summary["anon_after_step_by_process_mb"] = {k: v[:spec["after_steps"]]
                                                for k, v in summary["anon_after_step_by_process_mb"].items()}
    timeline = {"t0": trace.t0, "samples": [{**s, "t": round(s["t"] - trace.t0, 3)} for s in trace.samples],
                "transitions": [(round(t - trace.t0, 3), st) for t, st in trace.transitions],
                "step_ends": [round(t - trace.t0, 3) for t in trace.step_ends]}
    print(f"[memory] {key}: {json.dumps({k: summary[k] for k in ('error', 'wall_s', 'update_peak_mb', 'peak_mb')})}",
          file=sys.stderr, flush=True)
    return summary, timeline


# ---- plot ------------------------------------------------------------------------------------

def _shade(ax: Any, timeline: dict) -> None:
    """Stage spans of one run as coloured bands (the innermost stage: an update sub-stage over `update`)."""
    marks = timeline["transitions"]
    end = timeline["samples"][-1]["t"] if timeline["samples"] else 0.0
    spans = [(0.0, marks[0][0] if marks else end, "load")]
    spans += [(t, marks[i + 1][0] if i + 1 < len(marks) else end, st) for i, (t, st) in enumerate(marks)]
    for a, b, path in spans:
        color = STAGE_COLORS.get(stage_keys(path)[-1])
        if color and b > a:
            ax.axvspan(a, b, color=color, lw=0)


def _from_zero(ax: Any) -> None:
    """y from 0 to a bit above the highest point: a flat series must look flat."""
    top = max((y for line in ax.get_lines() for y in line.get_ydata() if math.isfinite(y)), default=1.0)
    ax.set_ylim(0, 1.1 * top or 1.0)


def plot(result: dict, timelines: Mapping[str, dict], path: Path) -> None:
    """Per run: tree RSS (and PSS) over time on stage bands, dots after each step; last row: the tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    runs = result["runs"]
    engines = sorted({r["engine"] for r in runs.values()})
    sizes = sorted({r["size"] for r in runs.values()})
    fig, axes = plt.subplots(len(sizes) + 1, max(2, len(engines)), figsize=(7 * max(2, len(engines)),
                             2.6 * (len(sizes) + 1)), squeeze=False)
    for col, eng in enumerate(engines):
        for row, size in enumerate(sizes):
            ax, key = axes[row][col], f"{eng}-{size}"
            tl = timelines.get(key)
            if tl is None or not tl["samples"]:
                continue
            _shade(ax, tl)
            xs = [s["t"] for s in tl["samples"]]
            ax.plot(xs, [s["rss"] / 1024 for s in tl["samples"]], color="black", lw=1, label="RSS")
            pss = [(s["t"], s["pss"] / 1024) for s in tl["samples"] if s["pss"] is not None]
            if pss:
                ax.plot(*zip(*pss), color="tab:green", lw=0.8, ls="--", label="PSS")
            after = runs[key].get("rss_after_step_mb") or []
            ax.plot(tl["step_ends"][:len(after)], [a / 1024 if a else math.nan for a in after], "o", ms=3,
                    color="tab:blue", label="after step")
            ax.set_title(f"{eng}: {size} sequences/update, {runs[key]['steps']} steps", fontsize=9)
            ax.set(ylabel="GiB", xlabel="seconds")
            _from_zero(ax)
            ax.legend(fontsize=7, loc="best")
    bottom = axes[-1]
    for eng in engines:
        peaks = result["update_peak_mb"].get(eng, {})
        ks = sorted(peaks, key=int)
        bottom[0].plot([int(k) for k in ks], [peaks[k] / 1024 if peaks[k] else math.nan for k in ks], "o-", label=eng)
        after = result["rss_after_step_mb"].get(eng, [])
        bottom[1].plot(range(1, len(after) + 1), [a / 1024 if a else math.nan for a in after], "o-", ms=3, label=eng)
    bottom[0].set(title="update-stage peak of the tree", xlabel="sequences per update", ylabel="GiB")
    bottom[1].set(title="tree RSS after each step (long run)", xlabel="step", ylabel="GiB")
    for ax in bottom[:2]:
        _from_zero(ax)
        ax.legend(fontsize=8)
    for ax in [a for row in axes for a in row]:
        ax.set_visible(ax.has_data())  # a missing run, or the second column beside a single engine
    fig.legend(handles=[Patch(color=c, label=n) for n, c in STAGE_COLORS.items()], loc="upper center",
               ncol=len(STAGE_COLORS), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the report: one JSON line, the samples, merging parts ------------------------------------

def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: null instead, so every reader parses the line."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    return [_finite(v) for v in x] if isinstance(x, (list, tuple)) else x


def write_report(runs: dict[str, dict], timelines: dict[str, dict], config: dict, out: Path, png: Optional[Path],
                 wall_s: float) -> dict[str, Any]:
    """Tables + runs to `out` (one JSON line), timelines to `<out>.samples.json`, the plot to `png`."""
    samples = out.with_suffix(".samples.json")
    result = {**aggregate(runs), "runs": runs, "config": config, "wall_s": round(wall_s, 1),
              "samples_file": str(samples), "png": str(png) if png else None}
    atomic_write_text(samples, json.dumps(_finite(timelines)))
    if png is not None and runs:
        try:
            plot(result, timelines, png)
        except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture; say why it is missing
            result["png_error"] = f"{type(e).__name__}: {e}"
    atomic_write_text(out, json.dumps(_finite(result), allow_nan=False) + "\n")
    return result


def load_parts(paths: Sequence[Path]) -> tuple[dict[str, dict], dict[str, dict], list[dict]]:
    """Runs, timelines and configs of earlier reports (a later file's run replaces an earlier one's)."""
    runs, timelines, configs = {}, {}, []
    for path in paths:
        try:
            part = json.loads(path.read_text())
            samples = json.loads(Path(part["samples_file"]).read_text())
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"--merge {path}: not a bench/memory.py report with its samples file ({e})") from e
        runs.update(part["runs"])
        timelines.update(samples)
        configs.append(part["config"])
    return runs, timelines, configs


# ---- command line ----------------------------------------------------------------------------

def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    p.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=("hf", "vllm"))
    p.add_argument("--sizes", nargs="+", type=int, default=[8, 16, 32], help="sequences per solver update")
    p.add_argument("--steps", type=int, default=20, help="steps of the --long-size run (rss_after_step_mb)")
    p.add_argument("--long-size", type=int, default=None, help="size of the long run (default: the middle size)")
    p.add_argument("--size-steps", type=int, default=3, help="steps of the other runs; update peaks use these first")
    p.add_argument("--group-size", type=int, default=4, help="solver.group_size (batch_questions = size / it)")
    p.add_argument("--model-args", nargs="*", default=[], help="Hydra overrides of every run (e.g. experiment=smoke)")
    p.add_argument("--out", type=Path, default=None, help="report file (default runs/memory-<stamp>/memory.json)")
    p.add_argument("--png", type=Path, default=None, help="plot file (default <out>.png)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--pss-interval", type=float, default=5.0, help="seconds between PSS samples (0: step ends only)")
    p.add_argument("--rss-cap-mb", type=float, default=0.0, help="kill a run whose tree passes this RSS (0: none)")
    p.add_argument("--run-timeout", type=float, default=4 * 3600.0, help="kill a run after this many seconds")
    p.add_argument("--merge", nargs="+", type=Path, default=None, help="join these reports instead of running")
    args = p.parse_args(argv)
    if min(args.steps, args.size_steps) < 1 or args.interval <= 0:
        p.error("--steps and --size-steps must be >= 1 and --interval > 0")
    args.out = (args.out or ROOT / "runs" / f"memory-{time.strftime('%Y%m%d-%H%M%S')}" / "memory.json").resolve()
    args.png = args.png or args.out.with_suffix(".png")
    return args


def _stop(signum: int, _frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through run_one's cleanup


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "command": " ".join(["python", "-m", "bench.memory", *(sys.argv[1:] if argv is None else argv)]),
        "measure": "rss: sum of VmRSS over the driver's process tree (shared pages counted per process); "
                   "pss: sum of Pss (smaps_rollup); MB = MiB",
        "cpus": os.cpu_count(), "mem_total_mb": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20}
    if args.merge:
        runs, timelines, configs = load_parts(args.merge)
        config["merged"] = {str(p): c for p, c in zip(args.merge, configs)}
        result = write_report(runs, timelines, config, args.out, args.png, sum(r["wall_s"] for r in runs.values()))
        print(json.dumps(_finite(result), allow_nan=False))
        return 0
    config.update({k: v for k, v in vars(args).items() if k not in ("out", "png", "merge")})
    try:
        plan = plan_runs(args.engines, args.sizes, args.group_size, args.steps, args.size_steps, args.long_size)
    except ValueError as e:
        raise SystemExit(f"bench/memory.py: {e}") from e
    reaper = ensure_reaper()  # a killed benchmark takes its runs with it: they carry this reaper's token
    signal.signal(signal.SIGTERM, _stop)
    runs: dict[str, dict] = {}
    timelines: dict[str, dict] = {}
    for spec in plan:
        key = f"{spec['engine']}-{spec['size']}"
        runs[key], timelines[key] = run_one(spec, args, args.out.parent, reaper.token if reaper else None)
        result = write_report(runs, timelines, config, args.out, args.png, time.time() - t0)
    print(json.dumps(_finite(result), allow_nan=False))
    return 1 if any(r["error"] or r["leftover_processes"] for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
