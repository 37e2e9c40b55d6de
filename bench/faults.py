"""Benchmark (not a test): kill -9 at random points of short runs, resume each, check the outputs.

    .venv/bin/python -m bench.faults [--mode local|ray|solve-vllm] [--target driver|actor] [--runs 20]
        [--steps 4] [--kills 1] [--save-share 0.25] [--seed 0] [--step-s 2.0] [--attempt-timeout 600]
        [--workdir DIR] [--keep] [--out FILE] [-- HYDRA_OVERRIDES...]
    nice -n 19 .venv/bin/python -m bench.faults --runs 3   # quick check

Run i is, by `--mode` (then the overrides after `--`), one run at a time, each in its own session,
its output in `<workdir>/run_i.<attempt>.log`:
- `local`: `python -m coevo.run experiment=smoke ray.local=true run.steps=S run.save_every=1
  run.dir=<workdir>/run_i seed=i` (every role in the driver);
- `ray`: the same without `ray.local=true`: a local Ray cluster, one actor per role;
- `solve-vllm`: `python -m coevo.solve experiment=smoke ray.local=true rollout=vllm` with tiny KV
  caches (`*.gpu_memory_utilization=0.01`, `run.memory_check=false`), `solve.steps=S
  solve.batch_questions=2`: vLLM engine processes (the driver's children) alive at every kill.
Each of its first `--kills` attempts (the fresh start, then resumes) gets one SIGKILL, as an OOM kill
would, on `--target`: `driver` (the driver alone) or `actor` (`ray` mode: the process of one role's
Ray actor, drawn among those the run's `ready` event names; the driver must then stop by itself
within ACTOR_STOP_S with an error that names the role). The moment is drawn from a seeded RNG
(`--seed`) in one of two ways:
- `time`: after a delay drawn uniformly between the attempt's `ready` event and its expected end:
  steps left x seconds per step: once a step of this attempt ended, (time from `ready` to its last
  `step` event) / (its steps), before that the median of the same over the earlier attempts, and
  `--step-s` before any step ended. An attempt that ends first is a missed kill (`killed: false`,
  `missed_kills`);
- `save` (a `--save-share` of the kills): 0-50 ms after the bench sees (polling every 5 ms) a
  checkpoint being written (`checkpoints/.tmp-step_<n>-*`) for a step n drawn among those left,
  or for a later step when the poll missed that save.
An actor kill lands in one of the attempt's steps but its last (`_actor_due`): once the last step has
begun, a run may rightly finish without an actor it no longer calls, which tests nothing.
Then `resume=true` until the run completes (an attempt that fails without a kill ends the run).
The bench follows each attempt by the run's own machine-readable events (`<run dir>/events.jsonl`,
coevo/core/events.py: `ready`, then one `step` per step whose outputs are written), never by the
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
     the kill), "actor" / "stop_s" / "named" (actor kills: the role, seconds from the kill to the
     driver's exit, whether its error names the role), "orphans"}],
     "per_run": [{"run", "completed", "resumed", "attempts", "error", "orphans", "lost", "corrupt",
     "duplicates", "leftovers"}], "tensorboard", "config"}

Exit status 1 (and `failures` says why) when any of the four counts is non-zero, a run did not
complete, more than MISSED_SHARE of the planned kills missed, or an actor kill did not stop the
driver within ACTOR_STOP_S with an error naming the role; else 0.
The workdir (default: a new temp dir) is deleted at the end unless `--keep` or a check failed.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from bench import split_overrides
from bench.faults_check import EventFileLoader, check_run_dir, parse_jsonl
from bench.faults_procs import engine_processes, orphans_after, run_tokens
from coevo.core.events import EVENTS_NAME, READY, STEP, read_events
from coevo.core.io import atomic_write_text
from coevo.core.lifetime import TOKENS_ENV, Proc, descendants, ensure_reaper, kill, process_table

ROOT = Path(__file__).resolve().parents[1]

MODES = ("local", "ray", "solve-vllm")
TARGETS = ("driver", "actor")
ACTOR_STOP_S = 60.0  # an actor kill must stop the driver, with an error naming the role, within this
MISSED_SHARE = 0.10  # more missed kills than this share of the planned ones fail the benchmark
COUNTS = ("lost_steps", "corrupt_files", "duplicate_metric_steps", "orphan_processes")
SAVING = re.compile(r"\.tmp-step_([0-9]+)-")
TINY_ENGINES = ("run.memory_check=false",
                *(f"{role}.gpu_memory_utilization=0.01" for role in ("proposer", "solver", "ranker")))

# ---- one attempt: start the driver, kill as planned ----------------------------------------------------


@dataclass
class KillPlan:
    kind: str  # "time" or "save"
    u: float  # uniform in [0, 1): where between ready and the expected end / which step's save
    jitter_s: float  # "save": delay between seeing the save and the kill
    pick: float = 0.0  # uniform in [0, 1): which actor (`--target actor`), in the sorted role names


def draw_plans(seed: int, runs: int, kills: int, save_share: float) -> list[list[KillPlan]]:
    """Each run's kill plans, one per killed attempt, from one seeded RNG (same seed, same plans)."""
    rng = random.Random(seed)
    return [[KillPlan("save" if rng.random() < save_share else "time", rng.random(), rng.uniform(0.0, 0.05),
                      rng.random()) for _ in range(kills)] for _ in range(runs)]


@dataclass
class Attempt:
    proc: subprocess.Popen
    run_dir: Path
    log: Path  # the driver's output
    started: float
    ready: Optional[float] = None  # monotonic time the bench saw the `ready` event
    start_step: int = 0
    actors: dict[str, int] = field(default_factory=dict)  # role -> pid of its Ray actor (Ray runs)
    step_ends: list[float] = field(default_factory=list)  # monotonic times the `step` events were seen
    offset: int = 0  # bytes of events.jsonl read so far
    own_tokens: set[str] = field(default_factory=set)  # the benchmark's: every process here carries them
    tracked: dict[int, Proc] = field(default_factory=dict)  # the driver and every descendant seen
    tokens: set[str] = field(default_factory=set)  # reaper tokens of the driver's processes
    scanned: float = 0.0

    def track(self) -> None:
        """Record the driver's process tree now (its tokens read while the processes live)."""
        table = process_table()
        new = [pid for pid in descendants(table, [self.proc.pid]) | {self.proc.pid}
               if pid in table and (pid not in self.tracked or self.tracked[pid].start != table[pid].start)]
        self.tracked.update({pid: table[pid] for pid in new})
        self.tokens |= run_tokens(new, self.own_tokens)
        self.scanned = time.monotonic()

    def read_events(self) -> None:
        """Note when this driver's `ready` and `step` events appear (other attempts' lines are skipped)."""
        events, self.offset = read_events(self.run_dir / EVENTS_NAME, self.offset)
        for e in (e for e in events if e.get("pid") == self.proc.pid):
            if e["event"] == READY and self.ready is None:
                self.ready, self.start_step = time.monotonic(), int(e.get("start", 0))
                self.actors = dict(e.get("actors") or {})
            elif e["event"] == STEP and self.ready is not None:
                self.step_ends.append(time.monotonic())

    def seconds_per_step(self) -> Optional[float]:
        """Mean time from `ready` to each step's end in this attempt (None before the first step)."""
        return (self.step_ends[-1] - self.ready) / len(self.step_ends) if self.step_ends else None


def _saving(run_dir: Path) -> list[int]:
    """Steps whose checkpoint is being written now."""
    try:
        return [int(m.group(1)) for e in os.scandir(run_dir / "checkpoints") if (m := SAVING.match(e.name))]
    except OSError:
        return []


def _due(a: Attempt, plan: KillPlan, steps: int, step_s: float, target: str = "driver") -> bool:
    if a.ready is None:
        return False
    left = steps - a.start_step
    if target == "actor":
        return _actor_due(a, plan, left, step_s)
    if plan.kind == "time":  # this attempt's own pace once a step ended: runs differ, steps are short
        return time.monotonic() >= a.ready + plan.u * left * (a.seconds_per_step() or step_s)
    target_step = a.start_step + int(plan.u * left)
    if any(n >= target_step for n in _saving(a.run_dir)):
        time.sleep(plan.jitter_s)
        return True
    return False


def _actor_due(a: Attempt, plan: KillPlan, left: int, step_s: float) -> bool:
    """An actor kill lands in one of the attempt's steps but its last, chosen by `plan.u`.

    Once the last step has begun a run may rightly finish without a dead actor it no longer calls
    (retrieval after the solve, any actor during the final save), so that is no test of the driver.
    `time`: step k = int(u·(left−1)), after the fraction of u·(left−1) beyond k of the latest step's
    length; `save`: while step k's checkpoint is written (it has a step after it). A kill still
    pending when the next-to-last step's outputs are written is missed.
    """
    span = max(left - 1, 0)
    if len(a.step_ends) >= max(span, 1):
        return False
    k = min(int(plan.u * span), max(span - 1, 0))
    if plan.kind == "save" and span:
        if any(n >= a.start_step + k for n in _saving(a.run_dir)):
            time.sleep(plan.jitter_s)
            return True
        return False
    if len(a.step_ends) < k:
        return False
    since = a.step_ends[k - 1] if k else a.ready
    recent = (a.step_ends[-1] - a.step_ends[-2]) if len(a.step_ends) > 1 else (a.seconds_per_step() or step_s)
    return time.monotonic() >= since + (plan.u * span - k) * recent


def _kill_actor(a: Attempt, plan: KillPlan) -> tuple[Optional[str], Optional[str]]:
    """SIGKILL the process of one role's actor (drawn by `plan.pick`); (role, None) or (None, why not)."""
    if not a.actors:
        return None, "the run's ready event names no actors (--target actor needs --mode ray)"
    roles = sorted(a.actors)
    role = roles[min(int(plan.pick * len(roles)), len(roles) - 1)]
    proc = process_table().get(int(a.actors[role]))
    if proc is None or not kill(proc):
        return None, f"the {role} actor (pid {a.actors[role]}) was not running"
    return role, None


def _strike(a: Attempt, plan: KillPlan, target: str, rec: dict[str, Any]) -> Optional[float]:
    """Kill as planned and fill `rec`; the monotonic time of an actor kill (None: the driver was killed)."""
    a.track()
    rec.update(during_save=bool(_saving(a.run_dir)), delay_s=round(time.monotonic() - a.ready, 3),
               engine_processes=engine_processes(list(a.tracked)))
    if target == "driver":
        a.proc.kill()
        rec["killed"] = True
        return None
    role, why = _kill_actor(a, plan)
    rec.update(killed=role is not None, actor=role, error=why)
    return time.monotonic() if role else None


def run_attempt(cmd: list[str], log: Path, run_dir: Path, steps: int, plan: Optional[KillPlan], step_s: float,
                timeout_s: float, own_tokens: set[str], target: str = "driver") -> tuple[dict[str, Any], Attempt]:
    """Run one driver to its end or its planned kill; its record and what was seen of it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    a = Attempt(proc, run_dir, log, time.monotonic(), own_tokens=own_tokens)
    rec: dict[str, Any] = {"kind": plan.kind if plan else None, "target": target, "killed": False, "error": None}
    struck: Optional[float] = None  # when an actor was killed: the driver must then stop by itself
    try:
        while proc.poll() is None and not rec["error"]:
            if time.monotonic() - a.scanned > 0.5:
                a.track()
            a.read_events()
            if plan and not rec["killed"] and _due(a, plan, steps, step_s, target):
                struck = _strike(a, plan, target, rec)
                if target == "driver":
                    break
            if struck is not None and time.monotonic() - struck > 2 * ACTOR_STOP_S:
                rec["error"] = f"the driver still ran {2 * ACTOR_STOP_S:.0f}s after its {rec['actor']} actor was killed"
            elif time.monotonic() - a.started > timeout_s:
                rec["error"] = f"no exit after {timeout_s:.0f}s"
            time.sleep(0.005 if plan and plan.kind == "save" and a.ready and not rec["killed"] else 0.05)
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
        tail = log.read_text(errors="replace")[-4000:]
        # A sharded role's or a retrieval replica's ranks (`solver.1`) are named by the role.
        rec["named"] = "run stopped" in tail and rec["actor"].split(".")[0] in tail
        if rec["rc"] == 0 and not rec["error"]:
            rec["error"] = f"exit code 0 after its {rec['actor']} actor was killed"
    if a.ready is None and not rec["error"]:
        rec["error"] = f"exit code {rec['rc']} before the run's ready event"
    elif rec["rc"] != 0 and not rec["killed"] and not rec["error"]:
        rec["error"] = f"exit code {rec['rc']}"
    if rec["error"]:
        rec["log_tail"] = log.read_text(errors="replace")[-2000:]


# ---- runs and report ------------------------------------------------------------------------------


def run_command(mode: str, run_dir: Path, steps: int, seed: int, overrides: Sequence[str], resume: bool) -> list[str]:
    """The command of one attempt of run `run_dir` in `mode` (module docstring)."""
    common = ["experiment=smoke", "run.save_every=1", f"run.dir={run_dir}", f"seed={seed}",
              *(["resume=true"] if resume else [])]
    if mode == "solve-vllm":
        return [sys.executable, "-m", "coevo.solve", *common, "ray.local=true", "rollout=vllm", *TINY_ENGINES,
                f"solve.steps={steps}", "solve.batch_questions=2", *overrides]
    local = ["ray.local=true"] if mode == "local" else []
    return [sys.executable, "-m", "coevo.run", *common, *local, f"run.steps={steps}", *overrides]


def _kill_record(i: int, n: int, plan: KillPlan, rec: dict[str, Any], a: Attempt, run_dir: Path) -> dict[str, Any]:
    metrics = run_dir / "metrics.jsonl"
    extra = {k: rec[k] for k in ("actor", "stop_s", "named") if k in rec}
    return {"run": i, "attempt": n, "kind": plan.kind, "target": rec["target"], "delay_s": rec.get("delay_s"),
            "killed": rec["killed"], "during_save": rec.get("during_save", False),
            "steps_logged": len(parse_jsonl(metrics)[0]) if metrics.is_file() else 0,
            "processes": len(a.tracked), "engine_processes": rec.get("engine_processes", 0), **extra,
            "orphans": rec["orphans"]}


def run_one(i: int, args: argparse.Namespace, plans: list[KillPlan], per_step: list[float],
            own_tokens: set[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run i: killed as `plans` say, resumed until it completes (or an attempt fails); its record and kills."""
    run_dir = args.workdir / f"run_{i}"
    kills: list[dict[str, Any]] = []
    run: dict[str, Any] = {"run": i, "completed": False, "attempts": 0, "error": None, "orphans": []}
    while not run["completed"] and run["error"] is None:
        n = run["attempts"]
        plan = plans[n] if n < len(plans) else None
        step_s = statistics.median(per_step) if per_step else args.step_s
        cmd = run_command(args.mode, run_dir, args.steps, i, args.overrides, resume=n > 0)
        rec, a = run_attempt(cmd, args.workdir / f"run_{i}.{n}.log", run_dir, args.steps, plan, step_s,
                             args.attempt_timeout, own_tokens, args.target)
        ended = time.monotonic()
        run["attempts"] += 1
        if (seconds := a.seconds_per_step()) is not None and rec["target"] == "driver":
            per_step.append(seconds)
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
    if report["missed_kills"] > MISSED_SHARE * report["planned_kills"]:
        why.append(f"missed kills: {report['missed_kills']} of {report['planned_kills']} planned "
                   f"(more than {MISSED_SHARE:.0%})")
    if slow := [f"run {k['run']} attempt {k['attempt']}" for k in report["kills"]
                if k["target"] == "actor" and k["killed"] and not (k["stop_s"] <= ACTOR_STOP_S and k["named"])]:
        why.append(f"actor kills that did not stop the driver within {ACTOR_STOP_S:.0f}s with an error naming "
                   f"the role: {slow}")
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
    p.add_argument("--mode", choices=MODES, default="local", help="which runs (module docstring)")
    p.add_argument("--target", choices=TARGETS, default="driver", help="what to SIGKILL: the driver or one actor")
    p.add_argument("--runs", type=int, default=20, help="runs, one after the other")
    p.add_argument("--steps", type=int, default=4, help="steps of each run")
    p.add_argument("--kills", type=int, default=1, help="attempts of each run to kill (the start, then resumes)")
    p.add_argument("--save-share", type=float, default=0.25, help="share of kills made while a checkpoint is saved")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill plans")
    p.add_argument("--step-s", type=float, default=2.0, help="seconds per step assumed until an attempt finished")
    p.add_argument("--attempt-timeout", type=float, default=600.0, help="kill an attempt after this many seconds")
    p.add_argument("--workdir", type=Path, default=None, help="where the run dirs go (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the workdir (kept anyway when a check failed)")
    p.add_argument("--out", type=Path, default=None, help="report file (default <workdir>/faults.json)")
    args = p.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.kills < 0 or not 0 <= args.save_share <= 1 or args.step_s <= 0:
        p.error("need --runs >= 1, --steps >= 1, --kills >= 0, 0 <= --save-share <= 1, --step-s > 0")
    if args.target == "actor" and args.mode != "ray":
        p.error(f"--target actor needs --mode ray (in --mode {args.mode} every role runs in the driver)")
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
    runs, kills, per_step = [], [], []
    for i in range(args.runs):
        run, run_kills = run_one(i, args, plans[i], per_step, own_tokens)
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
