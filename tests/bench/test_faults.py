"""bench/faults.py's pure parts: the checks on hand-made run dirs (lost steps, corrupt files, duplicate
steps), the kill plans, the command-line match, and the orphan check on a fake driver that leaves a
process behind (no model is loaded, no coevo run started)."""
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import faults
from bench import faults_check as check
from bench import faults_plan as plans
from bench import faults_procs as procs
from coevo.train.checkpoint import save_checkpoint


def _checkpoint(run_dir: Path, step: int) -> Path:
    def save(role: str, path: Path) -> None:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"weights" * 10)
        (path / "optimizer.pt").write_bytes(b"adam" * 10)

    return save_checkpoint(run_dir, step, 2 * (step + 1), save, ["solver"])


def _scalars(log_dir: Path, points: list[tuple[str, int]]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    before = set(log_dir.glob("events.out.tfevents.*"))
    writer = SummaryWriter(log_dir=str(log_dir))
    for tag, step in points:
        writer.add_scalar(tag, 0.5, step)
    writer.close()
    [path] = set(log_dir.glob("events.out.tfevents.*")) - before  # the file this writer wrote
    return path


def _first_record_end(data: bytes) -> int:
    """Where an event file's second record starts: header (length, its checksum), data, data checksum."""
    return 8 + 4 + struct.unpack("<Q", data[:8])[0] + 4


def test_a_whole_run_dir_passes_every_check(tmp_path) -> None:
    run = tmp_path / "run"
    (run / "tasks").mkdir(parents=True)
    for step in range(3):
        (run / "tasks" / f"step_{step}.jsonl").write_text('{"accepted": false}\n' * step)  # step 0: no candidate
        _checkpoint(run, step)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.5}) + "\n" for s in range(3)))
    _scalars(run / "tensorboard", [("reward", 0), ("reward", 1), ("reward", 2), ("loss", 2)])
    assert check.check_run_dir(run, 3, tensorboard=True) == {"lost": [], "corrupt": [], "duplicates": [],
                                                             "leftovers": []}


def test_a_damaged_run_dir_names_each_lost_step_corrupt_file_and_duplicate(tmp_path) -> None:
    run = tmp_path / "run"
    (run / "tasks").mkdir(parents=True)
    (run / "tasks" / "step_0.jsonl").write_text('{"a": 1}\n')
    (run / "tasks" / "step_1.jsonl").write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    (run / "tasks" / "step_3.jsonl").write_text('{"a": 1}\n')  # no dump of step 2
    (run / "tasks" / ".step_4.jsonl.abc.tmp").write_text("")  # an interrupted write's temp file
    # Step 1 twice, step 3 torn (killed mid-append): lines 1-3 parse, line 4 has no line end.
    (run / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 1}\n{"step": 3')
    _checkpoint(run, 2)
    optimizer = _checkpoint(run, 3) / "solver" / "optimizer.pt"
    optimizer.write_bytes(b"ADAM" + optimizer.read_bytes()[4:])  # same size, other bytes
    (run / "checkpoints" / ".tmp-step_4-0123").mkdir()
    _scalars(run / "tensorboard", [("reward", 0), ("reward", 1), ("reward", 1), ("reward", 3)])
    torn = _scalars(run / "tensorboard", [("loss", 0)])
    torn.write_bytes(torn.read_bytes()[:-3])
    second = _first_record_end(torn.read_bytes())

    found = check.check_run_dir(run, 4, tensorboard=True)
    assert found["lost"] == [{"step": 2, "missing": ["dump", "metrics", "tensorboard"]},
                             {"step": 3, "missing": ["metrics", "checkpoint"]}]
    assert found["corrupt"] == [
        "checkpoints/step_3: solver/optimizer.pt does not match its checksum",
        "metrics.jsonl: 1 bad lines, first: line 4: no line end (torn write)",
        "tasks/step_1.jsonl: 1 bad lines, first: line 2: JSONDecodeError: Expecting value: line 1 column 1 (char 0)",
        f"tensorboard/{torn.name}: record 1 at byte {second}: torn (needs {torn.stat().st_size + 3} bytes, the "
        f"file has {torn.stat().st_size})"]
    assert found["duplicates"] == [1]
    assert found["leftovers"] == ["checkpoints/.tmp-step_4-0123", "tasks/.step_4.jsonl.abc.tmp"]
    # Without tensorboard only metrics.jsonl counts: the event files are neither read nor checked.
    without = check.check_run_dir(run, 4, tensorboard=False)
    assert without["lost"] == [{"step": 2, "missing": ["dump", "metrics"]},
                               {"step": 3, "missing": ["metrics", "checkpoint"]}]
    assert len(without["corrupt"]) == 3 and without["duplicates"] == [1]


def test_tfrecord_problem_reads_lengths_and_both_checksums(tmp_path) -> None:
    path = _scalars(tmp_path, [("reward", 0)])
    data = path.read_bytes()
    assert check.tfrecord_problem(path) is None
    first = _first_record_end(data)  # the file_version record, then one scalar
    assert first < len(data)
    path.write_bytes(data[:first] + data[first:first + 12] + b"\xff" + data[first + 13:])
    assert check.tfrecord_problem(path) == f"record 1 at byte {first}: data checksum mismatch"
    path.write_bytes(data[:first] + b"\x07" + data[first + 1:])
    assert check.tfrecord_problem(path) == f"record 1 at byte {first}: header checksum mismatch"
    path.write_bytes(data[:first + 5])
    assert check.tfrecord_problem(path) == f"record 1 at byte {first}: torn header"


records = st.lists(st.fixed_dictionaries({"step": st.integers(0, 10**6), "text": st.text(max_size=20)}),
                   min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(records=records, cut=st.integers(1, 10**6))
def test_parse_jsonl_returns_what_was_written_and_flags_a_cut_last_line(tmp_path_factory, records, cut):
    path = tmp_path_factory.mktemp("jsonl") / "metrics.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    path.write_bytes(text)
    assert check.parse_jsonl(path, need_step=True) == (records, None)
    last = json.dumps(records[-1], ensure_ascii=False).encode()
    keep = len(text) - 1 - cut % len(last)  # cut 1 .. len(last) bytes off the last line and its line end
    path.write_bytes(text[:keep])
    got, why = check.parse_jsonl(path, need_step=True)
    assert got == records[:-1]
    assert why == f"metrics.jsonl: 1 bad lines, first: line {len(records)}: no line end (torn write)"


def test_kill_plans_follow_the_seed_and_the_save_share() -> None:
    plans = faults.draw_plans(7, runs=20, kills=2, save_share=0.25)
    assert plans == faults.draw_plans(7, runs=20, kills=2, save_share=0.25) != faults.draw_plans(8, 20, 2, 0.25)
    assert [len(p) for p in plans] == [2] * 20
    assert all(0 <= k.u < 1 and 0 <= k.jitter_s <= 0.05 and 0 <= k.pick < 1 for p in plans for k in p)
    assert {k.kind for p in faults.draw_plans(1, 10, 1, 0.0) for k in p} == {"time"}
    assert {k.kind for p in faults.draw_plans(1, 10, 1, 1.0) for k in p} == {"save"}


def _attempt_at(tmp_path: Path, ready: float, begins: dict[int, float],
                saves: Optional[dict[int, float]] = None) -> plans.Attempt:
    a = plans.Attempt(proc=None, run_dir=tmp_path, log=tmp_path / "log", started=ready)  # type: ignore[arg-type]
    a.ready, a.begins, a.saves = ready, begins, saves or {}
    return a


def test_kills_strike_inside_the_planned_step_on_its_events_whatever_the_pace(tmp_path) -> None:
    now = time.monotonic()
    # An actor kill, 4 steps: span 2 (two steps follow it), u = 0.75 -> step k = int(1.5) = 1, half a step in.
    plan = plans.KillPlan("time", 0.75, 0.0)
    assert plans.planned_step(_attempt_at(tmp_path, now, {}), plan, 4, "actor") == (1, 0.5)
    assert plans.planned_step(_attempt_at(tmp_path, now, {}), plan, 4, "driver") == (3, 0.0)  # span 4
    assert not plans.due(_attempt_at(tmp_path, now - 9, {0: now - 9}), plan, 4, 2.0, "actor")  # step 1 not begun
    assert not plans.due(_attempt_at(tmp_path, now - 9, {0: now - 9, 1: now - 0.5}), plan, 4, 2.0, "actor")
    assert plans.due(_attempt_at(tmp_path, now - 9, {0: now - 9, 1: now - 1.1}), plan, 4, 2.0, "actor")
    # A step faster than the shortest seen: its save event strikes the kill before the step's outputs exist.
    assert plans.due(_attempt_at(tmp_path, now - 9, {1: now - 0.1}, {1: now}), plan, 4, 2.0, "actor")
    # A save kill strikes at step k's save event only (an earlier step's save is not k's).
    save = plans.KillPlan("save", 0.75, 0.0)
    assert not plans.due(_attempt_at(tmp_path, now - 9, {0: now - 9, 1: now - 5}, {0: now - 8}), save, 4, 2.0,
                         "rank")
    assert plans.due(_attempt_at(tmp_path, now - 9, {1: now - 5}, {0: now - 8, 1: now}), save, 4, 2.0, "rank")
    # A resumed attempt from step 3 of 4: one step left, the kill lands in it (at its start).
    resumed = _attempt_at(tmp_path, now, {3: now})
    resumed.start_step = 3
    assert plans.planned_step(resumed, plans.KillPlan("time", 0.99, 0.0), 4, "actor") == (3, 0.99)
    assert not plans.due(_attempt_at(tmp_path, now, {}), plan, 4, 2.0, "actor")  # nothing begun: never due


def test_a_rank_kill_draws_a_rank_of_the_sharded_role_and_names_it(tmp_path) -> None:
    a = _attempt_at(tmp_path, 0.0, {})
    a.actors = {"proposer": 11, "proposer.1": 12, "solver": 13, "retrieval.1": 14, "evidence": 15}
    assert plans.victim(a, plans.KillPlan("time", 0.0, 0.0, pick=0.2), "rank", "proposer") == ("proposer rank 0",
                                                                                                 11, None)
    assert plans.victim(a, plans.KillPlan("time", 0.0, 0.0, pick=0.7), "rank", "proposer") == ("proposer rank 1",
                                                                                                 12, None)
    assert plans.victim(a, plans.KillPlan("time", 0.0, 0.0, pick=0.7), "rank", "solver")[2] == (
        "the run's ready event names no ranks of a sharded solver (--target rank)")
    assert plans.victim(a, plans.KillPlan("time", 0.0, 0.0, pick=0.99), "actor", "proposer") == ("solver", 13, None)


def test_names_run_dir_matches_the_dir_and_paths_under_it_only() -> None:
    run = Path("/w/run_1")
    assert procs.names_run_dir(b"python\0-m\0coevo.run\0run.dir=/w/run_1\0seed=1\0", run)
    assert procs.names_run_dir(b"tail\0/w/run_1/metrics.jsonl\0", run)
    assert procs.names_run_dir(b"ls\0/w/run_1\0", run)
    assert not procs.names_run_dir(b"python\0-m\0coevo.run\0run.dir=/w/run_10\0", run)
    assert not procs.names_run_dir(b"ls\0/w/run_1x/a\0", run)


def test_each_mode_runs_its_entry_point_and_only_ray_mode_may_kill_an_actor() -> None:
    run = Path("/w/run_3")
    local, ray, solve = (faults.run_command(m, run, 4, 3, ["x=1"], resume=True) for m in faults.MODES)
    assert local[1:3] == ray[1:3] == ["-m", "coevo.run"] and solve[1:3] == ["-m", "coevo.solve"]
    assert "ray.local=true" in local and "ray.local=true" not in ray and "rollout=vllm" in solve
    assert all({"resume=true", "run.dir=/w/run_3", "seed=3"} <= set(c) and c[-1] == "x=1" for c in (local, ray, solve))
    assert "run.steps=4" in ray and "solve.steps=4" in solve
    with pytest.raises(SystemExit):
        faults.parse_args(["--mode", "local", "--target", "actor"])
    assert faults.parse_args(["--mode", "ray", "--target", "actor", "--", "a=b"]).overrides == ["a=b"]
    # --target rank: Ray by default, the rank role sharded over 2 CPU ranks with the bench's collective timeout
    args = faults.parse_args(["--target", "rank", "--rank-role", "solver"])
    assert (args.mode, faults.parse_args([]).mode) == ("ray", "local")
    rank = faults.run_command(args.mode, run, 4, 3, [], False, "rank", args.rank_role)
    assert {"solver.cpu_ranks=2", "cluster.collective_timeout_s=60"} <= set(rank) and "ray.local=true" not in rank
    with pytest.raises(SystemExit):
        faults.parse_args(["--mode", "local", "--target", "rank"])


def _report(kills, per_run, **counts):
    runs = [{"run": i, "completed": c, "resumed": c, "orphans": [], "lost": [], "corrupt": [], "duplicates": [],
             "leftovers": []} for i, c in enumerate(per_run)]
    for key, n in counts.items():
        runs[0][key] = ["x"] * n
    return faults.summarize(runs, kills, 1.0, {"mode": "ray", "target": "actor"})


def test_failures_name_counts_incomplete_runs_missed_kills_and_slow_actor_stops() -> None:
    hit = {"run": 0, "attempt": 0, "target": "driver", "killed": True}
    assert _report([hit] * 10, [True] * 10)["failures"] == []
    one_missed = _report([hit] * 9 + [{**hit, "killed": False}], [True] * 10)  # kills strike on events: none misses
    assert one_missed["failures"] == ["missed kills: 1 of 10 planned"]
    bad = _report([hit], [True, False], lost=2, orphans=1)
    assert bad["failures"] == ["lost_steps = 2", "orphan_processes = 1", "runs that did not complete: [1]"]
    actor = {**hit, "target": "actor", "actor": "solver", "stop_s": 3.0, "named": True}
    assert _report([actor], [True])["failures"] == []
    for slow in ({**actor, "stop_s": 61.0}, {**actor, "named": False}):
        assert _report([slow], [True])["failures"] == [
            "actor kills that did not stop the driver within 60s with an error naming the role: ['run 0 attempt 0']"]
    rank = {**hit, "target": "rank", "actor": "proposer rank 1", "stop_s": 119.0, "named": True}
    assert _report([rank], [True])["failures"] == []  # the collective timeout (60 s) + 60 s
    assert _report([{**rank, "stop_s": 121.0}], [True])["failures"] == [
        "rank kills that did not stop the driver within 120s with an error naming the role and the rank: "
        "['run 0 attempt 0']"]


FAKE_DRIVER = """
import json, os, subprocess, sys, time
# One helper in its own session (as Ray's agents were), not reparented to us when the driver dies.
subprocess.Popen(["sleep", "60"], start_new_session=True)
subprocess.Popen(["sleep", "0.2"], start_new_session=True)  # ends by itself: no orphan
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], "events.jsonl"), "a") as f:
    f.write(json.dumps({"event": "ready", "pid": os.getpid(), "start": 0, "last": 1}) + "\\n")
    f.write(json.dumps({"event": "begin", "pid": os.getpid(), "step": 0}) + "\\n")
time.sleep(60)
"""


def test_an_attempt_killed_at_once_reports_the_process_its_driver_left(tmp_path) -> None:
    run_dir = tmp_path / "run"
    plan = faults.KillPlan("time", 0.0, 0.0)
    own = {t for t in os.environ.get(faults.TOKENS_ENV, "").split(":") if t}  # a reaper of the test process's
    rec, a = faults.run_attempt([sys.executable, "-c", FAKE_DRIVER, str(run_dir)], tmp_path / "log", run_dir,
                                steps=2, plan=plan, step_s=1.0, timeout_s=60, own_tokens=own)
    assert rec["killed"] and rec["rc"] == -9 and rec["error"] is None and rec["during_save"] is False
    assert a.start_step == 0 and len(a.tracked) >= 2  # the driver and its helper(s)
    started = time.monotonic()
    orphans = procs.orphans_after(time.monotonic(), a.tracked, a.tokens, run_dir, grace_s=2.0)
    assert [name.split()[1] for name in orphans] == ["sleep"]
    assert time.monotonic() - started >= 2.0
    pid = int(orphans[0].split()[0])
    deadline = time.monotonic() + 5
    while procs.survivors(a.tracked, set(), run_dir) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.survivors(a.tracked, set(), run_dir) == {}, f"{pid} was not killed"


FAKE_RAY_DRIVER = """
import json, os, subprocess, sys, time
actor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(os.path.join(sys.argv[1], "events.jsonl"), "a") as f:
    f.write(json.dumps({"event": "ready", "pid": os.getpid(), "start": 0, "last": 1,
                        "actors": {"solver": actor.pid}}) + "\\n")
    f.write(json.dumps({"event": "begin", "pid": os.getpid(), "step": 0}) + "\\n")
code = actor.wait()  # as Ray reports a dead actor to the driver's call
print(f"coevo: run stopped: solver generate failed in its Ray actor (exit {code})", file=sys.stderr, flush=True)
sys.exit(1)
"""


def test_an_actor_kill_waits_for_the_driver_to_stop_and_checks_it_named_the_role(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rec, a = faults.run_attempt([sys.executable, "-c", FAKE_RAY_DRIVER, str(run_dir)], tmp_path / "log", run_dir,
                                steps=2, plan=faults.KillPlan("time", 0.0, 0.0), step_s=1.0, timeout_s=60,
                                own_tokens=set(), target="actor")
    assert rec["killed"] and rec["actor"] == "solver" and rec["rc"] == 1 and rec["error"] is None
    assert rec["named"] and rec["stop_s"] < 10 and a.actors == {"solver": a.actors["solver"]}
    # Without a named actor the kill cannot be made: an error, never a silent pass.
    rec, _ = faults.run_attempt([sys.executable, "-c", FAKE_DRIVER, str(run_dir)], tmp_path / "log2", run_dir,
                                steps=2, plan=faults.KillPlan("time", 0.0, 0.0), step_s=1.0, timeout_s=60,
                                own_tokens=set(), target="actor")
    assert not rec["killed"] and "names no actors" in rec["error"] and rec["rc"] == -9


def test_an_attempt_without_a_ready_event_is_an_error(tmp_path) -> None:
    # The driver prints the old console wording: only the run's events count.
    script = "import sys; print('actors ready in 0.1s; 0 reference questions; steps 0..1; run dir x'); sys.exit(3)"
    rec, a = faults.run_attempt([sys.executable, "-c", script], tmp_path / "log", tmp_path / "run", steps=2,
                                plan=None, step_s=1.0, timeout_s=60, own_tokens=set())
    assert rec["error"] == "exit code 3 before the run's ready event" and "actors ready" in rec["log_tail"]
    assert not rec["killed"] and a.ready is None


def test_the_event_reader_times_this_drivers_events_once_each_line_is_whole(tmp_path):
    events = tmp_path / "events.jsonl"
    me = os.getpid()
    events.write_text(json.dumps({"event": "step", "pid": me, "step": 1}) + "\n"  # before ready: not timed
                      + json.dumps({"event": "ready", "pid": 1, "start": 0}) + "\n"  # another attempt's
                      + json.dumps({"event": "ready", "pid": me, "start": 2, "actors": {"solver": 9}}) + "\n"
                      + json.dumps({"event": "begin", "pid": me, "step": 2}) + "\n"
                      + json.dumps({"event": "save", "pid": 1, "step": 2}) + "\n"  # another attempt's
                      + '{"event": "save", "pid": ' + str(me))
    a = plans.Attempt(type("P", (), {"pid": me})(), tmp_path, tmp_path / "log", started=0.0)
    a.read_events()
    assert a.ready is not None and a.start_step == 2 and a.actors == {"solver": 9} and a.step_ends == []
    assert list(a.begins) == [2] and a.saves == {}  # the torn line waits for its end
    with open(events, "a") as f:
        f.write(', "step": 2}\n' + json.dumps({"event": "step", "pid": me, "step": 2}) + "\n"
                + json.dumps({"event": "begin", "pid": me, "step": 3}) + "\n")
    a.read_events()
    a.read_events()  # nothing new: nothing counted twice
    assert len(a.step_ends) == 1 and list(a.saves) == [2] and list(a.begins) == [2, 3] and list(a.ends) == [2]
    a.begins, a.ends = {2: 10.0, 3: 13.0}, {2: 13.0, 3: 16.5}
    assert a.step_lengths() == [3.0, 3.5]
