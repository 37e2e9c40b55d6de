"""Benchmark (not a test): kill -9 at random points of short runs, resume each, check the outputs.

    .venv/bin/python -m bench.faults [--mode local|ray|solve-vllm] [--target driver|actor|rank] [--runs 20]
        [--steps 4] [--kills 1] [--save-share 0.25] [--seed 0] [--step-s 2.0] [--rank-role proposer]
        [--attempt-timeout 600] [--workdir DIR] [--keep] [--out FILE] [-- HYDRA_OVERRIDES...]
    nice -n 19 .venv/bin/python -m bench.faults --runs 3   # quick check

Run i is, by `--mode` (then the overrides after `--`), one run at a time, each in its own session,
its output in `<workdir>/run_i.<attempt>.log`:
- `local` (the default for `--target driver`): `python -m coevo.run experiment=smoke ray.local=true
  run.steps=S run.save_every=1 run.dir=<workdir>/run_i seed=i` (every role in the driver);
- `ray` (the default for `--target actor|rank`): the same without `ray.local=true`: a local Ray
  cluster, one actor per role; with `--target rank` also `<rank-role>.cpu_ranks=2
  cluster.collective_timeout_s=RANK_TIMEOUT_S`: the `--rank-role` (default the proposer, which
  generates in every step of the smoke stack) sharded over 2 CPU ranks meeting over gloo;
- `solve-vllm`: `python -m coevo.solve experiment=smoke ray.local=true rollout=vllm` with tiny KV
  caches (`*.gpu_memory_utilization=0.01`, `run.memory_check=false`), `solve.steps=S
  solve.batch_questions=2`: vLLM engine processes (the driver's children) alive at every kill.
Each of its first `--kills` attempts (the fresh start, then resumes) gets one SIGKILL, as an OOM kill
would, on `--target`: `driver` (the driver alone), `actor` (the process of one Ray actor, drawn among
those the run's `ready` event names; the driver must then stop by itself within ACTOR_STOP_S with an
error that names the role) or `rank` (the process of one rank of the sharded role, drawn; the driver
must stop within RANK_STOP_S, the collective timeout + 60 s, with an error naming the role and the
rank: `proposer rank 1`). When, by a seeded RNG (`--seed`): bench/faults_plan.py, struck on the run's
own events inside a drawn step (`time`: a drawn fraction of the shortest step seen after its `begin`
event, or at its `save` event if that comes first; `save`, a `--save-share` of the kills: 0-50 ms after
its checkpoint write begins); an actor or rank kill in a step that two steps follow. A kill the
attempt ended before is counted missed (`killed: false`, `missed_kills`) and fails the benchmark.
Then `resume=true` until the run completes (an attempt that fails without a kill ends the run).
The bench follows each attempt by the run's own machine-readable events (`<run dir>/events.jsonl`,
coevo/core/events.py: `ready`, then per step `begin`, `save`, `step`), never by the
wording of its console or run.log; an attempt that ends without a `ready` event is an error.

Checks, on each run dir once its run has ended:
- lost_steps: steps n < S missing their task dump (coevo.run), their metrics.jsonl line or
  (tensorboard installed) their TensorBoard scalars, and the final checkpoint;
- corrupt_files: JSONL files with a line that does not parse (or a metrics line without an
  integer `step`, or a last line without its line end), checkpoints whose COMPLETE marker does
  not verify (coevo.train.checkpoint.verify_checkpoint), event files with a torn record or a
  checksum mismatch;
- duplicate_metric_steps: steps logged twice in metrics.jsonl, or twice under one TensorBoard tag;
- orphan_processes: processes still alive 30 s after an attempt's driver died (killed or not):
  its descendants (recorded every 0.5 s and just before the kill, pid and start time), the
  processes carrying its reaper token (coevo/core/lifetime.py), and those naming its run dir in
  their command line. The bench kills them afterwards, so they do not pile up.
`leftover_temp_files` (temp files of interrupted writes still in a completed run's dir) is
reported beside them.

Stdout is ONE JSON line, also written atomically to `--out` (default `<workdir>/faults.json`)
after every run:

    {"mode", "target", "runs", "planned_kills", "resumed" (runs killed at least once, then completed),
     "lost_steps", "corrupt_files", "duplicate_metric_steps", "orphan_processes", "leftover_temp_files",
     "missed_kills", "failures" (why the exit status is 1; empty: 0), "wall_s",
     "kills": [{"run", "attempt", "kind", "target", "delay_s" (after ready), "killed", "during_save",
     "steps_logged", "processes" (the driver and its descendants seen), "engine_processes" (vLLM's, at
     the kill), "step" (the step it was planned in), "actor" / "stop_s" / "named" (actor and rank kills:
     the actor or `<role> rank <r>`, seconds from the kill to the driver's exit, whether its error names
     the role, and for a rank the rank), "orphans"}],
     "per_run": [{"run", "completed", "resumed", "attempts", "error", "orphans", "lost", "corrupt",
     "duplicates", "leftovers"}], "tensorboard", "config"}

Exit status 1 (and `failures` says why) when any of the four counts is non-zero, a run did not
complete, a planned kill missed, or an actor (rank) kill did not stop the driver within ACTOR_STOP_S
(RANK_STOP_S) with an error naming the role (and the rank); else 0.
The workdir (default: a new temp dir) is deleted at the end unless `--keep` or a check failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from bench import split_overrides
from bench.faults_check import EventFileLoader, check_run_dir, parse_jsonl
from bench.faults_plan import Attempt, KillPlan, draw_plans, due, planned_step, saving, strike
from bench.faults_procs import engine_processes, orphans_after
from coevo.core.io import atomic_write_text
from coevo.core.lifetime import TOKENS_ENV, ensure_reaper

ROOT = Path(__file__).resolve().parents[1]

MODES = ("local", "ray", "solve-vllm")
TARGETS = ("driver", "actor", "rank")
ACTOR_STOP_S = 60.0  # an actor kill must stop the driver, with an error naming the role, within this
RANK_TIMEOUT_S = 60.0  # cluster.collective_timeout_s of `--target rank` runs (the smoke preset's)
RANK_STOP_S = RANK_TIMEOUT_S + 60.0  # a rank kill must stop the driver, naming role and rank, within this
RANK_ROLE = "proposer"  # the role `--target rank` shards: it generates in every smoke step
COUNTS = ("lost_steps", "corrupt_files", "duplicate_metric_steps", "orphan_processes")
TINY_ENGINES = ("run.memory_check=false",
                *(f"{role}.gpu_memory_utilization=0.01" for role in ("proposer", "solver", "ranker")))

# ---- one attempt: start the driver, kill as planned ----------------------------------------------------


def stop_limit_s(target: str) -> float:
    """Seconds an actor or rank kill may take to stop the driver (with an error naming it)."""
    return RANK_STOP_S if target == "rank" else ACTOR_STOP_S


def _strike(a: Attempt, plan: KillPlan, target: str, role: str, rec: dict[str, Any]) -> Optional[float]:
    """Kill as planned and fill `rec`; the monotonic time of an actor or rank kill (None: the driver was killed)."""
    a.track()
    rec.update(during_save=bool(saving(a.run_dir)), delay_s=round(time.monotonic() - a.ready, 3),
               engine_processes=engine_processes(list(a.tracked)))
    if target == "driver":
        a.proc.kill()
        rec["killed"] = True
        return None
    name, why = strike(a, plan, target, role)
    rec.update(killed=name is not None, actor=name, error=why)
    return time.monotonic() if name else None


def run_attempt(cmd: list[str], log: Path, run_dir: Path, steps: int, plan: Optional[KillPlan], step_s: float,
                timeout_s: float, own_tokens: set[str], target: str = "driver",
                role: str = RANK_ROLE) -> tuple[dict[str, Any], Attempt]:
    """Run one driver to its end or its planned kill; its record and what was seen of it (`step_s`: the shortest
    step seen so far; `role`: the sharded role whose rank `--target rank` kills)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    a = Attempt(proc, run_dir, log, time.monotonic(), own_tokens=own_tokens)
    rec: dict[str, Any] = {"kind": plan.kind if plan else None, "target": target, "killed": False, "error": None}
    struck: Optional[float] = None  # when an actor or rank was killed: the driver must then stop by itself
    limit = 2 * stop_limit_s(target)
    try:
        while proc.poll() is None and not rec["error"]:
            if time.monotonic() - a.scanned > 0.5:
                a.track()
            a.read_events()
            if plan and not rec["killed"] and due(a, plan, steps, step_s, target):
                rec["step"] = planned_step(a, plan, steps, target)[0]
                struck = _strike(a, plan, target, role, rec)
                if target == "driver":
                    break
            if struck is not None and time.monotonic() - struck > limit:
                rec["error"] = f"the driver still ran {limit:.0f}s after its {rec['actor']} actor was killed"
            elif time.monotonic() - a.started > timeout_s:
                rec["error"] = f"no exit after {timeout_s:.0f}s"
            time.sleep(0.005 if plan and a.ready and not rec["killed"] else 0.05)  # a kill pending: poll fast
    finally:
        if proc.poll() is None:
            proc.kill()
        rec["rc"] = proc.wait()
        a.read_events()  # the lines written since the last poll
    _finish(rec, a, log, struck)
    return rec, a


def _finish(rec: dict[str, Any], a: Attempt, log: Path, struck: Optional[float]) -> None:
    """The attempt's wall time, an actor kill's stop time and report, and its error (with the log's tail)."""
    rec["wall_s"] = round(time.monotonic() - a.started, 1)
    if struck is not None:
        rec["stop_s"] = round(time.monotonic() - struck, 1)  # an upper bound: polled every 50 ms
        stops = [line for line in log.read_text(errors="replace").splitlines() if "run stopped:" in line]
        # A rank must be named as such (`proposer rank 1`); an actor by its role (a replica `retrieval.1` too).
        name = rec["actor"] if rec["target"] == "rank" else rec["actor"].split(".")[0]
        rec["named"] = any(name in line for line in stops)  # in the run's own stop message
        if rec["rc"] == 0 and not rec["error"]:
            rec["error"] = f"exit code 0 after its {rec['actor']} actor was killed"
    if a.ready is None and not rec["error"]:
        rec["error"] = f"exit code {rec['rc']} before the run's ready event"
    elif rec["rc"] != 0 and not rec["killed"] and not rec["error"]:
        rec["error"] = f"exit code {rec['rc']}"
    if rec["error"]:
        rec["log_tail"] = log.read_text(errors="replace")[-2000:]


# ---- runs and report ------------------------------------------------------------------------------


def run_command(mode: str, run_dir: Path, steps: int, seed: int, overrides: Sequence[str], resume: bool,
                target: str = "driver", role: str = RANK_ROLE) -> list[str]:
    """The command of one attempt of run `run_dir` in `mode` (module docstring)."""
    common = ["experiment=smoke", "run.save_every=1", f"run.dir={run_dir}", f"seed={seed}",
              *(["resume=true"] if resume else [])]
    if target == "rank":
        common += [f"{role}.cpu_ranks=2", f"cluster.collective_timeout_s={RANK_TIMEOUT_S:g}"]
    if mode == "solve-vllm":
        return [sys.executable, "-m", "coevo.solve", *common, "ray.local=true", "rollout=vllm", *TINY_ENGINES,
                f"solve.steps={steps}", "solve.batch_questions=2", *overrides]
    local = ["ray.local=true"] if mode == "local" else []
    return [sys.executable, "-m", "coevo.run", *common, *local, f"run.steps={steps}", *overrides]


def _kill_record(i: int, n: int, plan: KillPlan, rec: dict[str, Any], a: Attempt, run_dir: Path) -> dict[str, Any]:
    metrics = run_dir / "metrics.jsonl"
    extra = {k: rec[k] for k in ("step", "actor", "stop_s", "named") if k in rec}
    return {"run": i, "attempt": n, "kind": plan.kind, "target": rec["target"], "delay_s": rec.get("delay_s"),
            "killed": rec["killed"], "during_save": rec.get("during_save", False),
            "steps_logged": len(parse_jsonl(metrics)[0]) if metrics.is_file() else 0,
            "processes": len(a.tracked), "engine_processes": rec.get("engine_processes", 0), **extra,
            "orphans": rec["orphans"]}


def run_one(i: int, args: argparse.Namespace, plans: list[KillPlan], step_lengths: list[float],
            own_tokens: set[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run i: killed as `plans` say, resumed until it completes (or an attempt fails); its record and kills.
    `step_lengths`: every whole step's length seen so far (this run's are added)."""
    run_dir = args.workdir / f"run_{i}"
    kills: list[dict[str, Any]] = []
    run: dict[str, Any] = {"run": i, "completed": False, "attempts": 0, "error": None, "orphans": []}
    while not run["completed"] and run["error"] is None:
        n = run["attempts"]
        plan = plans[n] if n < len(plans) else None
        step_s = min(step_lengths, default=args.step_s)  # a time kill strikes within the shortest step seen
        cmd = run_command(args.mode, run_dir, args.steps, i, args.overrides, n > 0, args.target, args.rank_role)
        rec, a = run_attempt(cmd, args.workdir / f"run_{i}.{n}.log", run_dir, args.steps, plan, step_s,
                             args.attempt_timeout, own_tokens, args.target, args.rank_role)
        ended = time.monotonic()
        run["attempts"] += 1
        step_lengths += a.step_lengths()
        rec["orphans"] = orphans_after(ended, a.tracked, a.tokens, run_dir)
        run["orphans"] += rec["orphans"]
        if plan is not None:
            kills.append(_kill_record(i, n, plan, rec, a, run_dir))
        run["completed"] = rec["rc"] == 0 and not rec["killed"]
        run["error"] = rec["error"] and {"attempt": n, "error": rec["error"], "log_tail": rec.get("log_tail")}
    run["resumed"] = run["completed"] and any(k["killed"] for k in kills)
    # coevo.solve writes no task dumps (it has no proposer)
    run.update(check_run_dir(run_dir, args.steps, EventFileLoader is not None, dumps=args.mode != "solve-vllm"))
    return run, kills


def failures(report: dict[str, Any]) -> list[str]:
    """Why the benchmark fails (empty: it passes); see the module docstring."""
    why = [f"{k} = {report[k]}" for k in COUNTS if report[k]]
    if incomplete := [r["run"] for r in report["per_run"] if not r["completed"]]:
        why.append(f"runs that did not complete: {incomplete}")
    if report["missed_kills"]:
        why.append(f"missed kills: {report['missed_kills']} of {report['planned_kills']} planned")
    for target, what in (("actor", "the role"), ("rank", "the role and the rank")):
        limit = stop_limit_s(target)
        if slow := [f"run {k['run']} attempt {k['attempt']}" for k in report["kills"]
                    if k["target"] == target and k["killed"] and not (k["stop_s"] <= limit and k["named"])]:
            why.append(f"{target} kills that did not stop the driver within {limit:.0f}s with an error naming "
                       f"{what}: {slow}")
    return why


def summarize(runs: list[dict[str, Any]], kills: list[dict[str, Any]], wall_s: float,
              config: dict[str, Any]) -> dict[str, Any]:
    """The report: the counts over every run, then the details they come from."""
    def total(key: str) -> int:
        return sum(len(r[key]) for r in runs)

    report = {"mode": config["mode"], "target": config["target"], "runs": len(runs), "planned_kills": len(kills),
              "resumed": sum(r["resumed"] for r in runs), "lost_steps": total("lost"),
              "corrupt_files": total("corrupt"), "duplicate_metric_steps": total("duplicates"),
              "orphan_processes": total("orphans"), "leftover_temp_files": total("leftovers"),
              "missed_kills": sum(not k["killed"] for k in kills), "failures": [], "wall_s": round(wall_s, 1),
              "kills": kills, "per_run": runs,
              "tensorboard": "event files read with tensorboard's loader, records checked against their checksums"
                             if EventFileLoader is not None else "tensorboard is not installed: metrics.jsonl only",
              "config": config}
    report["failures"] = failures(report)
    return report


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv, overrides = split_overrides(argv)
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=MODES, default=None, help="which runs (default: ray for --target actor|rank, "
                   "else local; module docstring)")
    p.add_argument("--target", choices=TARGETS, default="driver",
                   help="what to SIGKILL: the driver, one actor, or one rank of a sharded role")
    p.add_argument("--rank-role", choices=("proposer", "solver"), default=RANK_ROLE,
                   help="--target rank: the role sharded over 2 CPU ranks")
    p.add_argument("--runs", type=int, default=20, help="runs, one after the other")
    p.add_argument("--steps", type=int, default=4, help="steps of each run")
    p.add_argument("--kills", type=int, default=1, help="attempts of each run to kill (the start, then resumes)")
    p.add_argument("--save-share", type=float, default=0.25, help="share of kills made while a checkpoint is saved")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill plans")
    p.add_argument("--step-s", type=float, default=2.0, help="a time kill's scale until a whole step was seen")
    p.add_argument("--attempt-timeout", type=float, default=600.0, help="kill an attempt after this many seconds")
    p.add_argument("--workdir", type=Path, default=None, help="where the run dirs go (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the workdir (kept anyway when a check failed)")
    p.add_argument("--out", type=Path, default=None, help="report file (default <workdir>/faults.json)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.kills < 0 or not 0 <= args.save_share <= 1 or args.step_s <= 0:
        p.error("need --runs >= 1, --steps >= 1, --kills >= 0, 0 <= --save-share <= 1, --step-s > 0")
    args.mode = args.mode or ("local" if args.target == "driver" else "ray")
    if args.target != "driver" and args.mode != "ray":
        p.error(f"--target {args.target} needs --mode ray (in --mode {args.mode} every role runs in the driver)")
    args.overrides = overrides
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="coevo-faults-"))).resolve()
    args.out = (args.out or args.workdir / "faults.json").resolve()
    return args


def _stop(signum: int, _frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through run_attempt's cleanup


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    t0 = time.monotonic()
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = {"command": " ".join(["python", "-m", "bench.faults", *argv]),
              **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    reaper = ensure_reaper()  # a killed benchmark takes its runs with it: they carry this reaper's token
    own_tokens = {reaper.token} if reaper else set()
    own_tokens |= {t for t in os.environ.get(TOKENS_ENV, "").split(":") if t}
    signal.signal(signal.SIGTERM, _stop)
    plans = draw_plans(args.seed, args.runs, args.kills, args.save_share)
    runs, kills, step_lengths = [], [], []
    for i in range(args.runs):
        run, run_kills = run_one(i, args, plans[i], step_lengths, own_tokens)
        runs.append(run)
        kills += run_kills
        report = summarize(runs, kills, time.monotonic() - t0, config)
        atomic_write_text(args.out, json.dumps(report) + "\n")
    print(json.dumps(report))
    if not args.keep and not report["failures"]:
        for i in range(args.runs):
            shutil.rmtree(args.workdir / f"run_{i}", ignore_errors=True)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
