"""bench/faults.py's kill plans: when a kill is due, struck on the run's own events, and whom it strikes.

A plan names a step and a point inside it, never a time guessed from earlier steps' lengths (a kill
timed that way missed whenever the machine ran the run faster than it had before):
- `time`: step k, after a delay of `frac` x the shortest step this benchmark has seen (`--step-s`
  before any); its `save` event comes first on a slow step, and then the kill strikes there, so the
  kill lands inside step k whatever the machine's speed;
- `save`: 0–50 ms after step k's checkpoint starts being written (its `save` event).
The run emits `begin`, `save` and `step` events for every step (coevo/core/events.py, and the bench
runs with run.save_every=1), so a kill is missed only when the attempt ends before step k begins.
Step k is `start + int(u x span)` with `frac` the rest: span = the attempt's steps for a driver kill,
two fewer for an actor or rank kill, so that two steps follow it. Once the last step has begun a run
may rightly finish without an actor it no longer calls (retrieval after the solve), which tests
nothing; and a kill may land up to a step late where steps last less than the bench's reaction
(smoke steps of 40-100 ms: an event seen 5 ms late, 0-50 ms of jitter), yet the step after that
still asks every actor whether it is alive (`Actors.check_alive`) before it calls any.
"""
from __future__ import annotations

import os
import random
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from bench.faults_procs import run_tokens
from coevo.core.events import BEGIN, EVENTS_NAME, READY, SAVE, STEP, read_events
from coevo.core.lifetime import Proc, descendants, kill, process_table

SAVING = re.compile(r"\.tmp-step_([0-9]+)-")


@dataclass
class KillPlan:
    kind: str  # "time" or "save"
    u: float  # uniform in [0, 1): which step (and for "time", where in it; module docstring)
    jitter_s: float  # "save": delay between seeing the save event and the kill
    pick: float = 0.0  # uniform in [0, 1): which actor or rank (`--target actor|rank`), in sorted order


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
    actors: dict[str, int] = field(default_factory=dict)  # actor name -> pid (Ray runs; a rank `<role>.<r>`)
    begins: dict[int, float] = field(default_factory=dict)  # step -> monotonic time its `begin` event was seen
    saves: dict[int, float] = field(default_factory=dict)  # step -> when its `save` event was seen
    step_ends: list[float] = field(default_factory=list)  # monotonic times the `step` events were seen
    ends: dict[int, float] = field(default_factory=dict)  # step -> when its `step` event was seen
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
        """Note when this driver's events appear (other attempts' lines are skipped; none before `ready`)."""
        events, self.offset = read_events(self.run_dir / EVENTS_NAME, self.offset)
        now = time.monotonic()
        for e in (e for e in events if e.get("pid") == self.proc.pid):
            if e["event"] == READY and self.ready is None:
                self.ready, self.start_step = now, int(e.get("start", 0))
                self.actors = dict(e.get("actors") or {})
            elif self.ready is not None and isinstance(step := e.get("step"), int):
                if e["event"] == BEGIN:
                    self.begins[step] = now
                elif e["event"] == SAVE:
                    self.saves[step] = now
                elif e["event"] == STEP:
                    self.step_ends.append(now)
                    self.ends[step] = now

    def step_lengths(self) -> list[float]:
        """Seconds from each step's `begin` to its `step` event, of the steps seen whole."""
        return [end - self.begins[s] for s, end in self.ends.items() if s in self.begins]


def saving(run_dir: Path) -> list[int]:
    """Steps whose checkpoint is being written now (their temp dirs exist)."""
    try:
        return [int(m.group(1)) for e in os.scandir(run_dir / "checkpoints") if (m := SAVING.match(e.name))]
    except OSError:
        return []


def planned_step(a: Attempt, plan: KillPlan, steps: int, target: str) -> tuple[int, float]:
    """(step k the plan strikes in, the fraction of a step into it for a `time` kill): module docstring."""
    left = steps - a.start_step
    span = max(left - (0 if target == "driver" else 2), 1)
    pos = plan.u * span
    k = min(int(pos), span - 1)
    return a.start_step + k, pos - k


def due(a: Attempt, plan: KillPlan, steps: int, step_s: float, target: str = "driver") -> bool:
    """Whether the planned kill strikes now (`step_s`: the shortest step the benchmark has seen)."""
    if a.ready is None:
        return False
    k, frac = planned_step(a, plan, steps, target)
    if plan.kind == "save" or k in a.saves:
        if k not in a.saves:
            return False
        time.sleep(plan.jitter_s if plan.kind == "save" else 0.0)
        return True
    return k in a.begins and time.monotonic() >= a.begins[k] + frac * step_s


def victim(a: Attempt, plan: KillPlan, target: str, role: str) -> tuple[Optional[str], Optional[int], Optional[str]]:
    """(its name, its pid, None) of the actor (`actor`: any) or rank (`rank`: of `role`) that `plan.pick` draws,
    or (None, None, why not). A rank is named `<role> rank <r>`, as the run's error must name it."""
    if target == "rank":
        ranks = sorted((0 if n == role else int(n.split(".")[1]), pid) for n, pid in a.actors.items()
                       if n == role or re.fullmatch(rf"{re.escape(role)}\.[0-9]+", n))
        if len(ranks) < 2:
            return None, None, f"the run's ready event names no ranks of a sharded {role} (--target rank)"
        rank, pid = ranks[min(int(plan.pick * len(ranks)), len(ranks) - 1)]
        return f"{role} rank {rank}", int(pid), None
    if not a.actors:
        return None, None, "the run's ready event names no actors (--target actor needs --mode ray)"
    names = sorted(a.actors)
    name = names[min(int(plan.pick * len(names)), len(names) - 1)]
    return name, int(a.actors[name]), None


def strike(a: Attempt, plan: KillPlan, target: str, role: str) -> tuple[Optional[str], Optional[str]]:
    """SIGKILL the process `victim` draws: (its name, None) or (None, why not)."""
    name, pid, why = victim(a, plan, target, role)
    if name is None:
        return None, why
    proc = process_table().get(pid)
    if proc is None or not kill(proc):
        return None, f"the {name} actor (pid {pid}) was not running"
    return name, None
