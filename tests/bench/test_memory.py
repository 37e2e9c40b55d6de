"""bench/memory.py's pure parts: tree sums over a hand-made process table, stage attribution of
samples, the summaries and the report's JSON shape, the run plan (no model is loaded, no run started)."""
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench import memory
from bench import memory_trace as trace
from coevo.core.lifetime import Proc

# driver 10 -> reaper 11, engine core 12 -> worker 13; 20 is an unrelated process, 14 a zombie gone from the table
TABLE = {pid: Proc(pid, ppid, "S", 100 + pid) for pid, ppid in
         [(1, 0), (10, 1), (11, 10), (12, 10), (13, 12), (20, 1), (21, 20)]}
STATUS = {10: "Name:\tpython\nVmRSS:\t  2048 kB\nRssAnon:\t  1024 kB\nRssFile:\t 1024 kB\n",
          11: "VmRSS:\t 512 kB\nRssAnon:\t 256 kB\n",
          12: "VmRSS:\t 1536 kB\nRssAnon:\t 512 kB\n",
          13: None,  # exited between the table and the read
          20: "VmRSS:\t 999999 kB\nRssAnon:\t 999999 kB\n"}


def _reader():
    def read(pid):
        text = STATUS.get(pid)
        return None if text is None else trace.parse_kb(text, ("VmRSS", "RssAnon"))
    return read


def test_parse_kb_reads_only_the_asked_fields() -> None:
    rollup = "55eb-7ffe ---p 00000000 00:00 0   [rollup]\nRss:     247752 kB\nPss:      206211 kB\nPss_Anon: 1 kB\n"
    assert trace.parse_kb(rollup, ("Pss",)) == {"Pss": 206211}
    assert trace.parse_kb(STATUS[10], ("VmRSS", "RssAnon", "VmSwap")) == {"VmRSS": 2048, "RssAnon": 1024}


def test_tree_sum_counts_the_driver_and_every_descendant_once() -> None:
    pids = trace.tree_pids(TABLE, 10)
    assert pids == {10, 11, 12, 13}
    total = trace.tree_sum(pids, _reader())
    # (2048 + 512 + 1536) kB = 4 MiB RSS; (1024 + 256 + 512) kB = 1.75 MiB anon; 13 was gone: 3 processes
    assert total == {"n": 3, "VmRSS": 4.0, "RssAnon": 1.75}
    # Once the driver is gone its children are reparented to pid 1: nothing is its tree any more.
    orphans = {pid: Proc(pid, 1 if p.ppid == 10 else p.ppid, "S", p.start) for pid, p in TABLE.items() if pid != 10}
    assert trace.tree_pids(orphans, 10) == set()


def test_read_transitions_keeps_a_torn_last_line_for_later() -> None:
    chunk = b'{"t": 1.5, "stage": "solve"}\n{"t": 2.0, "stage": ""}\n{"t": 3'
    # 28 + 1 and 23 + 1 bytes with their newlines
    assert trace.read_transitions(chunk) == ([(1.5, "solve"), (2.0, "")], 53)
    assert trace.read_transitions(b"") == ([], 0)


@pytest.mark.parametrize("path, keys", [
    ("load", ["load"]), ("", ["other"]), ("solve", ["rollout"]), ("update", ["update"]),
    ("update/solver", ["update"]), ("update/ranker/logprobs", ["update", "logprobs"]),
    ("update/solver/backward", ["update", "backward"]), ("update/solver/sync", ["update", "sync"]),
    ("target", ["target"]),  # coevo.run's proposer stages keep their names
])
def test_stage_keys(path, keys) -> None:
    assert trace.stage_keys(path) == keys


TRANSITIONS = [(10.0, "solve"), (20.0, ""), (20.0, "update"), (21.0, "update/solver"), (21.0, "update/solver/logprobs"),
               (22.0, "update/solver"), (22.0, "update/solver/backward"), (25.0, "update/solver"),
               (25.0, "update/solver/sync"), (26.0, "update/solver"), (26.0, "update"), (26.0, ""),
               (27.0, "solve"), (30.0, ""), (30.0, "update"), (31.0, "update/solver"),
               (31.0, "update/solver/backward"), (33.0, "update/solver"), (33.0, "update"), (33.0, "")]
STEP_ENDS = [26.5, 33.5]


def _sample(t, rss, pss=None):
    return {"t": t, "rss": rss, "anon": rss / 2, "pss": pss, "shm": 0.0, "n": 4}


SAMPLES = [_sample(5.0, 100.0), _sample(15.0, 300.0), _sample(21.5, 400.0), _sample(23.0, 900.0, 800.0),
           _sample(25.5, 450.0), _sample(26.6, 350.0, 300.0), _sample(28.0, 360.0), _sample(32.0, 700.0),
           _sample(33.6, 355.0, 310.0)]


def test_stage_at_uses_the_last_transition_at_or_before_the_time() -> None:
    assert trace.stage_at(TRANSITIONS, 5.0) == "load"
    assert trace.stage_at(TRANSITIONS, 20.0) == "update"  # two transitions at one time: the later one
    assert trace.stage_at(TRANSITIONS, 23.0) == "update/solver/backward"
    assert trace.stage_at(TRANSITIONS, 40.0) == ""


def test_summarize_attributes_samples_to_stages_and_steps() -> None:
    s = trace.summarize(SAMPLES, TRANSITIONS, STEP_ENDS, size_steps=1)
    assert s["stage_peak_mb"] == {"load": 100.0, "rollout": 360.0, "update": 900.0, "logprobs": 400.0,
                                  "backward": 900.0, "sync": 450.0, "other": 355.0}
    assert s["update_peak_mb"] == 900.0 and s["update_peak_pss_mb"] == 800.0  # first step only (size_steps=1)
    assert s["update_peak_by_step_mb"] == [900.0, 700.0]
    assert s["rss_after_step_mb"] == [350.0, 355.0] and s["pss_after_step_mb"] == [300.0, 310.0]
    assert s["stage_peak_pss_mb"]["rollout"] is None  # never sampled with PSS there
    assert (s["peak_mb"], s["max_processes"], s["samples"]) == (900.0, 4, 9)
    assert trace.summarize(SAMPLES, TRANSITIONS, STEP_ENDS, size_steps=2)["update_peak_mb"] == 900.0
    late = trace.summarize(SAMPLES[:5], TRANSITIONS, STEP_ENDS, size_steps=1)  # the run ended before a sample
    assert late["rss_after_step_mb"] == [None, None]
    assert s["anon_after_step_by_process_mb"] == {}  # no step-end sample carried per-process figures


def test_summarize_keeps_each_process_anon_after_each_step() -> None:
    # step 2's first sample after its end is an interval sample; the one with the processes comes next
    samples = [*SAMPLES[:5], {**SAMPLES[5], "procs": {"driver": 200.0, "EngineCore:7": 40.0}}, SAMPLES[6], SAMPLES[7],
               SAMPLES[8], {**SAMPLES[8], "t": 33.7, "procs": {"driver": 210.0, "EngineCore:7": 41.5, "Worker:9": 3.0}}]
    by_process = trace.summarize(samples, TRANSITIONS, STEP_ENDS, size_steps=1)["anon_after_step_by_process_mb"]
    assert by_process == {"EngineCore:7": [40.0, 41.5], "Worker:9": [None, 3.0], "driver": [200.0, 210.0]}


def test_sample_labels_the_driver_and_its_children(tmp_path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        t = trace.Trace(tmp_path / "stages", tmp_path / "metrics.jsonl")
        s = t.sample(os.getpid(), with_pss=False, per_process=True)
        assert s["procs"]["driver"] > 0 and any(k.endswith(f":{child.pid}") for k in s["procs"])
        assert "procs" not in t.sample(os.getpid(), with_pss=False)
    finally:
        child.kill()
        child.wait()


def test_plan_runs_and_overrides() -> None:
    plan = memory.plan_runs(["hf", "vllm"], [8, 16, 32], group_size=4, steps=20, size_steps=3, long_size=None)
    assert [(p["engine"], p["size"], p["batch_questions"], p["steps"], p["after_steps"], p["long"]) for p in plan] == [
        ("hf", 8, 2, 3, 3, False), ("hf", 16, 4, 21, 20, True), ("hf", 32, 8, 3, 3, False),
        ("vllm", 8, 2, 3, 3, False), ("vllm", 16, 4, 21, 20, True), ("vllm", 32, 8, 3, 3, False)]
    assert memory.run_overrides(plan[1], ["experiment=smoke"], Path("/r")) == [
        "experiment=smoke", "rollout=hf", "solve.steps=21", "solve.batch_questions=4", "solver.group_size=4",
        "solver.keep_zero_advantage=true", "ranker.keep_zero_advantage=true", "run.dir=/r"]
    with pytest.raises(ValueError, match=r"--sizes \[6\].*--group-size 4"):
        memory.plan_runs(["hf"], [8, 6], 4, 20, 3, None)
    with pytest.raises(ValueError, match="--long-size 12"):
        memory.plan_runs(["hf"], [8, 16], 4, 20, 3, 12)


def _run(engine, size, long, peak, after):
    return {"engine": engine, "size": size, "long": long, "update_peak_mb": peak, "update_peak_pss_mb": None,
            "stage_peak_mb": {"update": peak}, "rss_after_step_mb": after, "pss_after_step_mb": [None] * len(after)}


def test_aggregate_gives_the_issue_tables_and_checks() -> None:
    runs = {"hf-8": _run("hf", 8, False, 1000.0, [900.0]), "hf-16": _run("hf", 16, True, 1100.0, [900, 1000.0, 1040.0]),
            "hf-32": _run("hf", 32, False, 1150.0, [950.0]), "vllm-8": _run("vllm", 8, True, 2000.0, [1.0, 2.0])}
    out = memory.aggregate(runs)
    assert out["update_peak_mb"] == {"hf": {"8": 1000.0, "16": 1100.0, "32": 1150.0}, "vllm": {"8": 2000.0}}
    assert out["rss_after_step_mb"] == {"hf": [900, 1000.0, 1040.0], "vllm": [1.0, 2.0]}
    assert out["stage_peak_mb"]["hf"]["32"] == {"update": 1150.0}
    # 1150 / 1000 - 1 = 0.15; after the last step / after step 2: 1040 / 1000 - 1 = 0.04
    assert out["checks"] == {"hf": {"update_growth": 0.15, "rss_drift": 0.04},
                             "vllm": {"update_growth": None, "rss_drift": None}}


def test_report_json_shape_and_merge(tmp_path) -> None:
    runs = {"hf-8": {**_run("hf", 8, True, 1000.0, [900.0, 910.0, 905.0]), "error": None}}
    timelines = {"hf-8": {"t0": 0.0, "samples": [_sample(0.0, 10.0), _sample(1.0, float("nan"))],
                          "transitions": [(0.5, "solve")], "step_ends": [0.9]}}
    out = tmp_path / "a" / "memory.json"
    out.parent.mkdir()
    result = memory.write_report(runs, timelines, {"sizes": [8]}, out, None, 1.25)
    line = out.read_text()
    assert line.endswith("}\n") and line.count("\n") == 1 and json.loads(line) == result
    for key in ("update_peak_mb", "stage_peak_mb", "rss_after_step_mb", "checks", "runs", "config", "wall_s"):
        assert key in result
    assert json.loads(Path(result["samples_file"]).read_text())["hf-8"]["samples"][1]["rss"] is None  # NaN -> null
    runs2, timelines2, configs = memory.load_parts([out])
    assert runs2 == runs and configs == [{"sizes": [8]}] and timelines2["hf-8"]["step_ends"] == [0.9]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="not a bench/memory.py report"):
        memory.load_parts([bad])


def test_plot_writes_a_png(tmp_path) -> None:
    runs = {"hf-8": {**_run("hf", 8, True, 1000.0, [900.0, 910.0]), "steps": 2}}
    timelines = {"hf-8": {"t0": 0.0, "samples": [_sample(t, 500.0 + t, 400.0 if t == 2 else None) for t in range(8)],
                          "transitions": [(1.0, "solve"), (3.0, ""), (3.0, "update"), (3.0, "update/solver"),
                                          (3.0, "update/solver/backward"), (5.0, "update/solver"), (5.0, "")],
                          "step_ends": [5.5, 7.0]}}
    result = {**memory.aggregate(runs), "runs": runs}
    memory.plot(result, timelines, tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_watch_stops_a_run_over_the_cap(tmp_path) -> None:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(64 << 20); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    t = trace.Trace(tmp_path / "stages.jsonl", tmp_path / "metrics.jsonl")
    args = Namespace(interval=0.1, pss_interval=0.0, rss_cap_mb=32.0, run_timeout=30.0)
    with open(tmp_path / "log", "w") as log:
        try:
            error = trace.watch(proc, t, log, args)
        finally:
            left = trace.end_tree(proc, t, None, grace_s=1.0)
            t.finish()
    assert error == "killed: the process tree passed --rss-cap-mb 32" and left == []
    assert proc.returncode == -9 and t.samples[-1]["rss"] > 32


def test_step_ends_are_the_step_lines_with_their_metrics_records(tmp_path) -> None:
    import io

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0, "update": {"solver": {"n_seqs": 8}}}\n{"step": 1, "upd')  # step 1: torn
    t = trace.Trace(tmp_path / "stages.jsonl", metrics)
    output = io.StringIO("coevo.solve: smoke: solver tiny-random; run dir r (log: run.log); memory: estimated peak "
                         "2.5 GiB of RAM\n[step 1/3] questions 4 | 0.5s | ETA 1s\n{\"step\": 9}\n"
                         "[step 2/3] questions 4 | 0.5s | ETA 0s\n")
    t.read_output(output, io.StringIO())
    assert t.estimate_gib == 2.5
    assert len(t.step_ended()) == 1 and t.metrics == [{"step": 0, "update": {"solver": {"n_seqs": 8}}}]
