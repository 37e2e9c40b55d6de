"""bench/memory.py's sampler: the memory of a process tree from /proc, attributed to the run's stages.

A run started with `COEVO_STAGE_FILE` appends its stage transitions to that file
(coevo/core/stages.py); `watch` samples the driver's whole tree while it runs (at a fixed
interval and at once on each transition or step end) and `summarize` turns the samples into
peaks per stage and per step. `end_tree` makes sure nothing of the run outlives it. The
measures are described in bench/memory.py.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import threading
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from coevo.core.lifetime import Proc, carries_token, descendants, kill, process_table

MB = 1024  # kB per MiB (/proc reports kB)
POLL_S = 0.05  # how often the stage file, the run's output and its exit are checked
SUB_STAGES = ("logprobs", "backward", "sync")  # Policy.update's stages inside the loop's `update`
ESTIMATE = re.compile(r"memory: estimated peak ([\d.]+) GiB")  # the run's own pre-start estimate, in its start line
STEP_LINE = re.compile(r"^\[step (\d+)/\d+\] ")  # a step's terminal line: its metrics are in metrics.jsonl by then


# ---- pure parts: /proc parsing, tree sums, stage attribution, summaries ------------------------

def parse_kb(text: str, keys: Iterable[str]) -> dict[str, int]:
    """`Key:  123 kB` lines of /proc/<pid>/status or smaps_rollup: {key: kB} for `keys` present."""
    wanted, out = set(keys), {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            out[name] = int(value.split()[0])
    return out


def proc_kb(pid: int, file: str, keys: Sequence[str]) -> Optional[dict[str, int]]:
    """{key: kB} of /proc/<pid>/<file> for `keys` present; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/{file}") as f:
            return parse_kb(f.read(), keys)
    except OSError:  # gone since the table was read
        return None


def tree_pids(table: Mapping[int, Proc], root: int) -> set[int]:
    """`root` and its descendants in `table` (root left out once it is gone)."""
    return descendants(table, [root]) | ({root} & set(table))


def process_label(pid: int, root: int) -> str:
    """`driver` for the run's own process, else `<comm>:<pid>` (vLLM names its EngineCore and Worker processes)."""
    if pid == root:
        return "driver"
    try:
        return f"{Path(f'/proc/{pid}/comm').read_text().strip()}:{pid}"
    except OSError:
        return f"?:{pid}"


def tree_sum(pids: Iterable[int], read: Callable[[int], Optional[dict[str, int]]]) -> dict[str, float]:
    """MiB per field summed over `pids` (a process gone before `read` counts 0), plus `n` processes read."""
    total: dict[str, float] = {"n": 0}
    for pid in pids:
        fields = read(pid)
        if fields is None:
            continue
        total["n"] += 1
        for key, kb in fields.items():
            total[key] = total.get(key, 0.0) + kb / MB
    return total


def read_transitions(chunk: bytes) -> tuple[list[tuple[float, str]], int]:
    """(time, stage path) of each complete line of a COEVO_STAGE_FILE chunk, and the bytes they use
    (a torn last line is left for the next read)."""
    lines = chunk.split(b"\n")[:-1]
    return [(float(r["t"]), str(r["stage"])) for r in map(json.loads, lines)], sum(len(x) + 1 for x in lines)


def stage_at(transitions: Sequence[tuple[float, str]], t: float) -> str:
    """The stage path open at time `t`: "load" before the first transition."""
    i = bisect_right([tt for tt, _ in transitions], t)
    return transitions[i - 1][1] if i else "load"


def stage_keys(path: str) -> list[str]:
    """The report stages a sample in stage `path` counts for (an update sub-stage counts for `update` too)."""
    if path == "load":
        return ["load"]
    if not path:
        return ["other"]
    top, *rest = path.split("/")
    keys = ["rollout" if top == "solve" else top]
    return keys + [rest[-1]] if top == "update" and rest and rest[-1] in SUB_STAGES else keys


def _peak(values: Iterable[Optional[float]]) -> Optional[float]:
    found = [v for v in values if v is not None]
    return round(max(found), 1) if found else None


def _by_process(after: Sequence[Optional[dict]]) -> dict[str, list[Optional[float]]]:
    """{process label: its anon MiB right after each step (None: not alive then)} from the step-end samples."""
    labels = sorted({k for s in after if s for k in s.get("procs", {})})
    return {k: [None if s is None else s.get("procs", {}).get(k) for s in after] for k in labels}


def summarize(samples: Sequence[dict], transitions: Sequence[tuple[float, str]], step_ends: Sequence[float],
              size_steps: int) -> dict[str, Any]:
    """Peaks of one run's samples ({t, rss, pss|None, shm, n}) by stage, by step, and the tree after each step."""
    by_stage: dict[str, list[dict]] = {}
    for s in samples:
        for key in stage_keys(stage_at(transitions, s["t"])):
            by_stage.setdefault(key, []).append(s)
    after = [next((s for s in samples if s["t"] >= t), None) for t in step_ends]
    update = [s for s in by_stage.get("update", []) if bisect_right(list(step_ends), s["t"]) < size_steps]
    steps = range(len(step_ends))
    return {
        "update_peak_mb": _peak(s["rss"] for s in update), "update_peak_pss_mb": _peak(s["pss"] for s in update),
        "update_peak_by_step_mb": [_peak(s["rss"] for s in by_stage.get("update", [])
                                         if bisect_right(list(step_ends), s["t"]) == k) for k in steps],
        "stage_peak_mb": {k: _peak(s["rss"] for s in v) for k, v in by_stage.items()},
        "stage_peak_pss_mb": {k: _peak(s["pss"] for s in v) for k, v in by_stage.items()},
        "rss_after_step_mb": [None if s is None else round(s["rss"], 1) for s in after],
        "pss_after_step_mb": [None if s is None or s["pss"] is None else round(s["pss"], 1) for s in after],
        # the sample taken on reading the step's end (an interval sample may come first, without them)
        "anon_after_step_by_process_mb": _by_process([next((s for s in samples if s["t"] >= t and "procs" in s), None)
                                                      for t in step_ends]),
        "peak_mb": _peak(s["rss"] for s in samples), "shm_peak_mb": _peak(s["shm"] for s in samples),
        "max_processes": max((s["n"] for s in samples), default=0), "samples": len(samples)}


# ---- one run: the subprocess, its sampler, its end -------------------------------------------

def _shm_mb() -> float:
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20


class Trace:
    """What the sampler collected from one run, and where it reads the run's progress."""

    def __init__(self, stage_file: Path, metrics_file: Path) -> None:
        self.t0 = time.time()
        self.shm0 = _shm_mb()
        self.stage_file = stage_file
        self.metrics_file = metrics_file  # the run's metrics.jsonl: a step's record is appended before its line
        self.offset = 0  # bytes of the stage file read so far
        self.events: queue.Queue = queue.Queue()  # (time, metrics) of each step end, from the output reader
        self.reader: Optional[threading.Thread] = None
        self.samples: list[dict] = []
        self.transitions: list[tuple[float, str]] = []
        self.step_ends: list[float] = []
        self.metrics: list[dict] = []
        self.tracked: dict[int, Proc] = {}
        self.estimate_gib: Optional[float] = None
        self.tail: list[str] = []

    def sample(self, root: int, with_pss: bool, per_process: bool = False) -> dict:
        """One sample of `root`'s tree: MiB of rss, anon, pss (None unless `with_pss`), shm growth; n processes;
        with `per_process`, also `procs` {process label: its anon MiB} (which process grows)."""
        table = process_table()
        pids = tree_pids(table, root)
        self.tracked.update({pid: table[pid] for pid in pids})
        rss = tree_sum(pids, lambda p: proc_kb(p, "status", ("VmRSS", "RssAnon")))
        pss = tree_sum(pids, lambda p: proc_kb(p, "smaps_rollup", ("Pss",))) if with_pss else {}
        s = {"t": time.time(), "rss": rss.get("VmRSS", 0.0), "anon": rss.get("RssAnon", 0.0),
             "pss": pss.get("Pss"), "shm": max(0.0, _shm_mb() - self.shm0), "n": int(rss["n"])}
        if per_process:
            s["procs"] = {process_label(pid, root): round(f["RssAnon"] / MB, 1) for pid in sorted(pids)
                          if (f := proc_kb(pid, "status", ("RssAnon",))) and "RssAnon" in f}
        self.samples.append(s)
        return s

    def new_transitions(self) -> list[tuple[float, str]]:
        """Transitions appended to the stage file since the last call."""
        if not self.stage_file.exists():
            return []
        with open(self.stage_file, "rb") as f:
            f.seek(self.offset)
            fresh, used = read_transitions(f.read())
        self.transitions += fresh
        self.offset += used
        return fresh

    def step_ended(self) -> list[float]:
        """Times of the step ends read since the last call (their metrics kept in `metrics`)."""
        ended = []
        while not self.events.empty():
            t, record = self.events.get()
            ended.append(t)
            self.metrics.append(record)
        self.step_ends += ended
        return ended

    def read_output(self, stream: Any, log: Any) -> None:
        """Thread body: the run's output to `log`; metrics lines (step ends) to `events`."""
        for line in stream:
            log.write(line)
            log.flush()
            self.tail = (self.tail + [line.rstrip()])[-12:]
            if m := ESTIMATE.search(line):
                self.estimate_gib = float(m.group(1))
            if m := STEP_LINE.match(line):
                record = self.step_record(int(m.group(1)) - 1)
                if record is not None:
                    self.events.put((time.time(), record))

    def step_record(self, step: int) -> Optional[dict]:
        """Step `step`'s record in the run's metrics.jsonl (None if it is not there)."""
        if not self.metrics_file.exists():
            return None
        for line in self.metrics_file.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a torn last line of a killed run
                continue
            if isinstance(record, dict) and record.get("step") == step:
                return record
        return None

    def finish(self) -> None:
        """After the run's tree is gone: the rest of its output and stage file (a step end read now has no
        sample after it)."""
        if self.reader is not None:
            self.reader.join(timeout=10)
        self.new_transitions()
        self.step_ended()


def watch(proc: subprocess.Popen, trace: Trace, log: Any, args: argparse.Namespace) -> Optional[str]:
    """Sample `proc`'s tree until it exits; an error string when it had to be stopped (cap or timeout).

    Uses args.interval and args.pss_interval (seconds), args.rss_cap_mb (0: none), args.run_timeout.
    """
    trace.reader = threading.Thread(target=trace.read_output, args=(proc.stdout, log), daemon=True)
    trace.reader.start()
    last = last_pss = 0.0
    while proc.poll() is None:
        now = time.time()
        fresh = trace.new_transitions()
        ended = trace.step_ended()
        pss_due = args.pss_interval > 0 and now - last_pss >= args.pss_interval
        if fresh or ended or now - last >= args.interval:
            # after a step end: its "after step" sample, with each process's share
            s = trace.sample(proc.pid, with_pss=bool(ended) or pss_due, per_process=bool(ended))
            last, last_pss = now, now if s["pss"] is not None else last_pss
        if args.rss_cap_mb and trace.samples and trace.samples[-1]["rss"] > args.rss_cap_mb:
            return f"killed: the process tree passed --rss-cap-mb {args.rss_cap_mb:g}"
        if now - trace.t0 > args.run_timeout:
            return f"killed after --run-timeout {args.run_timeout:g}s"
        time.sleep(POLL_S)
    return None


def end_tree(proc: subprocess.Popen, trace: Trace, token: Optional[str], grace_s: float = 20.0) -> list[str]:
    """Kill the driver if alive, give its reaper `grace_s` to end the rest, then kill what is left.

    Returns the names of processes this had to kill after the grace (the run's own reaper
    missed them): every process it tracked, and every carrier of this benchmark's reaper `token`.
    """
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    me = os.getpid()

    def left() -> dict[int, Proc]:
        table = process_table()
        alive = {p: table[p] for p, was in trace.tracked.items() if p in table and table[p].start == was.start}
        if token:
            ours = descendants(table, [me])  # our own reaper carries the token too
            alive.update({p: table[p] for p in table if p not in ours and p != me and carries_token(p, token)})
        return alive

    deadline = time.monotonic() + grace_s
    while (rest := left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    names = []
    for pid, p in sorted(rest.items()):
        name = Path(f"/proc/{pid}/comm").read_text().strip() if os.path.exists(f"/proc/{pid}/comm") else "?"
        if kill(p):
            names.append(f"{pid} {name}")
    return names
