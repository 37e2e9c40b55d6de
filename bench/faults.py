"""Benchmark (not a test): kill -9 at random points of short smoke runs, resume each, check the outputs (issue 14).

    .venv/bin/python bench/faults.py [--runs 20] [--steps 4] [--kills 1] [--save-share 0.25] [--seed 0]
        [--step-s 2.0] [--attempt-timeout 600] [--workdir DIR] [--keep] [--out FILE] [-- HYDRA_OVERRIDES...]
    nice -n 19 .venv/bin/python bench/faults.py --runs 3   # quick check

Run i is `python -m coevo.run experiment=smoke ray.local=true run.steps=S run.save_every=1
run.dir=<workdir>/run_i seed=i` (then the overrides after `--`), one run at a time, each in its
own session, its output in `<workdir>/run_i.<attempt>.log`. Each of its first `--kills` attempts
(the fresh start, then resumes) gets SIGKILL on the driver alone, as an OOM kill would, drawn
from a seeded RNG (`--seed`) in one of two ways:
- `time`: after a delay drawn uniformly between the attempt's "actors ready" line and its
  expected end: steps left × seconds per step, the median over the attempts so far of (time
  from "actors ready" to its last "[step k/S]" line) / (its steps), `--step-s` before any step
  ended. An attempt that ends first is a missed kill (`killed: false`, `missed_kills`);
- `save` (a `--save-share` of the kills): 0-50 ms after the bench sees (polling every 5 ms) a
  checkpoint being written (`checkpoints/.tmp-step_<n>-*`) for a step n drawn among those left,
  or for a later step when the poll missed that save.
Then `resume=true` until the run completes (an attempt that fails without a kill ends the run).

Checks, on each run dir once its run has ended:
- lost_steps: steps n < S missing their task dump, their metrics.jsonl line or (tensorboard
  installed) their TensorBoard scalars, and the final checkpoint;
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
after every run; exit status 0 when the four counts are zero and every run completed:

    {"runs", "resumed" (runs killed at least once, then completed), "lost_steps", "corrupt_files",
     "duplicate_metric_steps", "orphan_processes", "leftover_temp_files", "missed_kills", "wall_s",
     "kills": [{"run", "attempt", "kind", "delay_s" (after actors ready), "killed", "during_save",
     "steps_logged", "processes" (the driver and its descendants seen), "orphans"}],
     "per_run": [{"run", "completed", "resumed", "attempts", "error", "orphans", "lost", "corrupt",
     "duplicates", "leftovers"}], "tensorboard", "config"}

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

# Run as a script, Python puts bench/ first on sys.path, where sibling scripts (bench/evidence.py)
# would shadow our packages of the same name: the repo goes first, bench/ (faults_check) after it.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT), str(ROOT / "bench")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from faults_check import EventFileLoader, check_run_dir, parse_jsonl  # noqa: E402

from coevo.core.io import atomic_write_text  # noqa: E402
from coevo.core.lifetime import (  # noqa: E402
    TOKENS_ENV,
    Proc,
    carries_token,
    descendants,
    ensure_reaper,
    kill,
    process_table,
)

ORPHAN_GRACE_S = 30.0
READY = re.compile(r"actors ready in [0-9.]+s; .*; steps ([0-9]+)\.\.([0-9]+); run dir ")
PROGRESS = re.compile(r"\[step [0-9]+/[0-9]+\] ")  # printed once a step's outputs are written
SAVING = re.compile(r"\.tmp-step_([0-9]+)-")

# ---- processes a dead driver left ---------------------------------------------------------------


def names_run_dir(cmdline: bytes, run_dir: Path) -> bool:
    """Whether an argument of a NUL-separated command line is `run_dir`, ends in `=run_dir` or lies under it."""
    target = os.fsencode(run_dir)
    return any(arg == target or arg.endswith(b"=" + target) or target + b"/" in arg for arg in cmdline.split(b"\0"))


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:  # gone, or another user's process
        return b""


def run_tokens(pids: Sequence[int], own: set[str]) -> set[str]:
    """The reaper tokens the processes `pids` carry, but the benchmark's own (`own`)."""
    tokens: set[str] = set()
    for pid in pids:
        for entry in _read(f"/proc/{pid}/environ").split(b"\0"):
            if entry.startswith(TOKENS_ENV.encode() + b"="):
                tokens.update(t for t in entry.decode().partition("=")[2].split(":") if t)
    return tokens - own


def survivors(tracked: dict[int, Proc], tokens: set[str], run_dir: Path) -> dict[int, Proc]:
    """Live processes of a dead driver: tracked ones (same start time), token carriers, those naming its run dir."""
    table = process_table()
    mine = descendants(table, [os.getpid()]) | {os.getpid()}
    alive = {pid: table[pid] for pid, p in tracked.items() if pid in table and table[pid].start == p.start}
    alive.update({pid: p for pid, p in table.items() if any(carries_token(pid, t) for t in tokens)
                  or names_run_dir(_read(f"/proc/{pid}/cmdline"), run_dir)})
    return {pid: p for pid, p in alive.items() if pid not in mine}


def orphans_after(ended: float, tracked: dict[int, Proc], tokens: set[str], run_dir: Path) -> list[str]:
    """`"<pid> <name>"` of each process of the driver still alive ORPHAN_GRACE_S after it ended (then killed)."""
    while (left := survivors(tracked, tokens, run_dir)) and time.monotonic() < ended + ORPHAN_GRACE_S:
        time.sleep(0.5)
    names = [f"{pid} {_read(f'/proc/{pid}/comm').decode(errors='replace').strip()}" for pid in sorted(left)]
    for proc in left.values():
        kill(proc)
    return names


# ---- one attempt: start the driver, kill it as planned ----------------------------------------------


@dataclass
class KillPlan:
    kind: str  # "time" or "save"
    u: float  # uniform in [0, 1): where between actors ready and the expected end / which step's save
    jitter_s: float  # "save": delay between seeing the save and the kill


def draw_plans(seed: int, runs: int, kills: int, save_share: float) -> list[list[KillPlan]]:
    """Each run's kill plans, one per killed attempt, from one seeded RNG (same seed, same plans)."""
    rng = random.Random(seed)
    return [[KillPlan("save" if rng.random() < save_share else "time", rng.random(), rng.uniform(0.0, 0.05))
             for _ in range(kills)] for _ in range(runs)]


@dataclass
class Attempt:
    proc: subprocess.Popen
    run_dir: Path
    log: Path  # the driver's output
    started: float
    ready: Optional[float] = None  # monotonic time of the "actors ready" line
    start_step: int = 0
    step_ends: list[float] = field(default_factory=list)  # monotonic times of the steps' progress lines
    offset: int = 0  # bytes of the log read so far
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

    def read_log(self) -> None:
        """Note when the "actors ready" line and each step's progress line appear."""
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            lines = f.read().split(b"\n")
        self.offset += sum(len(line) + 1 for line in lines[:-1])  # an unfinished line is read again next time
        for line in (raw.decode(errors="replace") for raw in lines[:-1]):
            if self.ready is None and (m := READY.search(line)):
                self.ready, self.start_step = time.monotonic(), int(m.group(1))
            elif self.ready is not None and PROGRESS.match(line):
                self.step_ends.append(time.monotonic())

    def seconds_per_step(self) -> Optional[float]:
        """Mean time from "actors ready" to each step's end in this attempt (None before the first step)."""
        return (self.step_ends[-1] - self.ready) / len(self.step_ends) if self.step_ends else None


def _saving(run_dir: Path) -> list[int]:
    """Steps whose checkpoint is being written now."""
    try:
        return [int(m.group(1)) for e in os.scandir(run_dir / "checkpoints") if (m := SAVING.match(e.name))]
    except OSError:
        return []


def _due(a: Attempt, plan: KillPlan, steps: int, step_s: float) -> bool:
    if a.ready is None:
        return False
    left = steps - a.start_step
    if plan.kind == "time":
        return time.monotonic() >= a.ready + plan.u * left * step_s
    target = a.start_step + int(plan.u * left)
    if any(n >= target for n in _saving(a.run_dir)):
        time.sleep(plan.jitter_s)
        return True
    return False


def run_attempt(cmd: list[str], log: Path, run_dir: Path, steps: int, plan: Optional[KillPlan], step_s: float,
                timeout_s: float, own_tokens: set[str]) -> tuple[dict[str, Any], Attempt]:
    """Run one driver to its end or its planned kill; its record and what was seen of it."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    a = Attempt(proc, run_dir, log, time.monotonic(), own_tokens=own_tokens)
    rec: dict[str, Any] = {"kind": plan.kind if plan else None, "killed": False, "error": None}
    try:
        while proc.poll() is None:
            if time.monotonic() - a.scanned > 0.5:
                a.track()
            a.read_log()
            if plan and _due(a, plan, steps, step_s):
                a.track()
                during_save = bool(_saving(run_dir))
                proc.kill()
                rec.update(killed=True, during_save=during_save, delay_s=round(time.monotonic() - a.ready, 3))
                break
            if time.monotonic() - a.started > timeout_s:
                proc.kill()
                rec["error"] = f"no exit after {timeout_s:.0f}s"
                break
            time.sleep(0.005 if plan and plan.kind == "save" and a.ready else 0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        rec["rc"] = proc.wait()
        a.read_log()  # the lines written since the last poll
    rec["wall_s"] = round(time.monotonic() - a.started, 1)
    if a.ready is None and not rec["error"]:
        rec["error"] = f"exit code {rec['rc']} before the actors were ready"
    elif rec["rc"] != 0 and not rec["killed"] and not rec["error"]:
        rec["error"] = f"exit code {rec['rc']}"
    if rec["error"]:
        rec["log_tail"] = log.read_text(errors="replace")[-2000:]
    return rec, a


# ---- runs and report ------------------------------------------------------------------------------


def run_command(run_dir: Path, steps: int, seed: int, overrides: Sequence[str], resume: bool) -> list[str]:
    return [sys.executable, "-m", "coevo.run", "experiment=smoke", "ray.local=true", f"run.steps={steps}",
            "run.save_every=1", f"run.dir={run_dir}", f"seed={seed}", *(["resume=true"] if resume else []), *overrides]


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
        cmd = run_command(run_dir, args.steps, i, args.overrides, resume=n > 0)
        rec, a = run_attempt(cmd, args.workdir / f"run_{i}.{n}.log", run_dir, args.steps, plan, step_s,
                             args.attempt_timeout, own_tokens)
        ended = time.monotonic()
        run["attempts"] += 1
        if (seconds := a.seconds_per_step()) is not None:
            per_step.append(seconds)
        rec["orphans"] = orphans_after(ended, a.tracked, a.tokens, run_dir)
        run["orphans"] += rec["orphans"]
        metrics = run_dir / "metrics.jsonl"
        if plan is not None:
            kills.append({"run": i, "attempt": n, "kind": plan.kind, "delay_s": rec.get("delay_s"),
                          "killed": rec["killed"], "during_save": rec.get("during_save", False),
                          "steps_logged": len(parse_jsonl(metrics)[0]) if metrics.is_file() else 0,
                          "processes": len(a.tracked), "orphans": rec["orphans"]})
        run["completed"] = rec["rc"] == 0 and not rec["killed"]
        run["error"] = rec["error"] and {"attempt": n, "error": rec["error"], "log_tail": rec.get("log_tail")}
    run["resumed"] = run["completed"] and any(k["killed"] for k in kills)
    run.update(check_run_dir(run_dir, args.steps, EventFileLoader is not None))
    return run, kills


def summarize(runs: list[dict[str, Any]], kills: list[dict[str, Any]], wall_s: float,
              config: dict[str, Any]) -> dict[str, Any]:
    """The report: the counts over every run, then the details they come from."""
    def total(key: str) -> int:
        return sum(len(r[key]) for r in runs)

    return {"runs": len(runs), "resumed": sum(r["resumed"] for r in runs), "lost_steps": total("lost"),
            "corrupt_files": total("corrupt"), "duplicate_metric_steps": total("duplicates"),
            "orphan_processes": total("orphans"), "leftover_temp_files": total("leftovers"),
            "missed_kills": sum(not k["killed"] for k in kills), "wall_s": round(wall_s, 1), "kills": kills,
            "per_run": runs,
            "tensorboard": "event files read with tensorboard's loader, records checked against their checksums"
                           if EventFileLoader is not None else "tensorboard is not installed: metrics.jsonl only",
            "config": config}


def failed(report: dict[str, Any]) -> bool:
    """Whether the checks found anything (the four counts) or a run did not complete."""
    counts = ("lost_steps", "corrupt_files", "duplicate_metric_steps", "orphan_processes")
    return any(report[k] for k in counts) or any(not r["completed"] for r in report["per_run"])


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20, help="smoke runs, one after the other")
    p.add_argument("--steps", type=int, default=4, help="run.steps of each run")
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
    args.overrides = overrides
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="coevo-faults-"))).resolve()
    args.out = (args.out or args.workdir / "faults.json").resolve()
    return args


def _stop(signum: int, _frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")  # unwinds through run_attempt's cleanup


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = {"command": " ".join(["python", "bench/faults.py", *(sys.argv[1:] if argv is None else argv)]),
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
    if not args.keep and not failed(report):
        for i in range(args.runs):
            shutil.rmtree(args.workdir / f"run_{i}", ignore_errors=True)
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
