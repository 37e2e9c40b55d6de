"""Fault injection, unit level: each case a user hit (reused and shared run dirs, damaged
checkpoints, leftovers of killed runs, out-of-range configs, Ctrl-C/SIGTERM), reproduced on
the functions that now refuse or repair it. End-to-end runs: tests/coevo/test_faults_e2e.py.
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from coevo.core.config import CoevoConfig, PolicyConfig, compose, to_object
from coevo.core.io import atomic_dir, unique_sibling
from coevo.core.rundir import (
    RunDirError,
    check_not_in_use,
    check_same_experiment,
    claim_run_dir,
    experiment_differences,
    lock_run_dir,
    remove_temp_files,
    run_dir_verdict,
)
from coevo.core.stopping import Stopped, stop_on_signals, uninterrupted
from coevo.orchestrate.outputs import MetricsLog, read_jsonl
from coevo.orchestrate.persist import stopped_advice
from coevo.orchestrate.startup_checks import dry_run_checks
from coevo.train.checkpoint import (
    MARKER,
    drop_checkpoints_after,
    prune_checkpoints,
    remove_partial_checkpoints,
    resumable_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from coevo.train.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
SHA256_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2 test vector


def _populate(run_dir: Path, *names: str) -> None:
    for name in names:
        path = run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")


# ---- 1. a run owns its directory ---------------------------------------------------------------

@pytest.mark.parametrize("resumable,advice", [
    (True, "pass resume=true to continue it, run.overwrite=true to delete its contents and start over"),
    (False, "it holds no checkpoint to resume: pass run.overwrite=true to delete its contents and start over"),
])
def test_a_reused_run_dir_is_refused_and_left_as_it_was(tmp_path, resumable, advice):
    _populate(tmp_path, "metrics.jsonl", "tasks/step_0.jsonl", "checkpoints/step_0/COMPLETE")
    with pytest.raises(RunDirError) as err:
        claim_run_dir(tmp_path, resume=False, overwrite=False, resumable=resumable)
    assert str(err.value) == (f"run.dir {tmp_path} already holds a run (checkpoints, metrics.jsonl, tasks); "
                              f"{advice}, or choose another run.dir")
    assert (tmp_path / "metrics.jsonl").read_text() == "x" and (tmp_path / "tasks" / "step_0.jsonl").exists()
    lock_run_dir(tmp_path).release()  # the refused claim let its lock go


def test_hydra_record_of_this_invocation_does_not_make_the_dir_used(tmp_path):
    _populate(tmp_path, ".hydra/config.yaml", "run.log")
    with claim_run_dir(tmp_path, resume=False, overwrite=False, keep=(".hydra", "run.log")):
        pass


def test_the_log_of_a_run_that_stopped_before_writing_does_not_make_the_dir_used(tmp_path):
    # A run refused by its preflight or memory check leaves only its log: the next one may use the dir.
    _populate(tmp_path, "run.log", ".vllm-logging.json")
    with claim_run_dir(tmp_path, resume=False, overwrite=False):
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".vllm-logging.json", "run.log"]


def test_overwrite_empties_the_dir_first_keeping_this_invocation_and_the_lock(tmp_path):
    _populate(tmp_path, "config.yaml", "metrics.jsonl", "tasks/step_0.jsonl", "checkpoints/step_0/solver/w",
              "checkpoints/.tmp-step_1-ab/w", "tensorboard/events", ".hydra/config.yaml", "run.log",
              ".metrics.jsonl.k2j.tmp")
    with claim_run_dir(tmp_path, resume=False, overwrite=True, keep=(".hydra", "run.log")):
        assert sorted(p.name for p in tmp_path.iterdir()) == [".hydra", ".lock", "run.log"]


def test_overwrite_never_deletes_files_no_run_writes(tmp_path):
    _populate(tmp_path, "metrics.jsonl", "thesis.tex")
    with pytest.raises(RunDirError, match=r"run\.overwrite=true refused: .* holds thesis\.tex, which no run writes"):
        claim_run_dir(tmp_path, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "metrics.jsonl", "thesis.tex"]


def test_resume_and_overwrite_together_are_refused(tmp_path):
    with pytest.raises(RunDirError, match="contradict each other"):
        claim_run_dir(tmp_path, resume=True, overwrite=True)


def test_the_run_dir_verdict_reads_only_and_names_what_overwrite_would_delete(tmp_path):
    missing = tmp_path / "a" / "b"
    assert run_dir_verdict(missing, resume=False, overwrite=False) == [] and not (tmp_path / "a").exists()
    _populate(tmp_path / "run", "metrics.jsonl", "tasks/step_0.jsonl", ".hydra/config.yaml")
    doomed = run_dir_verdict(tmp_path / "run", resume=False, overwrite=True, keep=(".hydra",))
    assert doomed == ["metrics.jsonl", "tasks"]
    assert run_dir_verdict(tmp_path / "run", resume=True, overwrite=False) == []
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".hydra", "metrics.jsonl", "tasks"]
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics\.jsonl, tasks\)"):
        run_dir_verdict(tmp_path / "run", resume=False, overwrite=False, keep=(".hydra",))
    with pytest.raises(RunDirError, match=r"metrics\.jsonl exists and is not a directory"):
        run_dir_verdict(tmp_path / "run" / "metrics.jsonl", resume=False, overwrite=False)
    with pytest.raises(RunDirError, match=r"cannot be created: .*metrics\.jsonl is not a writable directory"):
        run_dir_verdict(tmp_path / "run" / "metrics.jsonl" / "x", resume=False, overwrite=False)


HOLDER = ("import sys; from coevo.core.rundir import lock_run_dir; lock_run_dir(sys.argv[1]); "
          "print('locked', flush=True); sys.stdin.read()")


def test_a_second_run_stops_at_once_naming_the_holder_and_a_killed_holder_frees_the_dir(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        t0 = time.monotonic()
        with pytest.raises(RunDirError) as err:
            claim_run_dir(tmp_path, resume=True, overwrite=False)
        assert time.monotonic() - t0 < 1.0
        assert f"is in use by another run (pid {holder.pid} on host {socket.gethostname()}, since " in str(err.value)
    finally:
        holder.kill()  # SIGKILL: no cleanup runs, the kernel still drops the lock
        holder.wait()
    with claim_run_dir(tmp_path, resume=True, overwrite=False):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()


def test_a_dry_run_sees_a_held_run_dir_without_taking_its_lock(tmp_path):
    check_not_in_use(tmp_path)  # no lock file: nothing to say
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        record = (tmp_path / ".lock").read_text()
        with pytest.raises(RunDirError, match=f"is in use by another run \\(pid {holder.pid} on host "):
            check_not_in_use(tmp_path)
        check_not_in_use(tmp_path, locks_table=str(tmp_path / "absent"))  # no table: the claim decides
        with pytest.raises(RunDirError, match="in use by another run"):  # a dry run asks before anything else
            dry_run_checks(to_object(compose(["experiment=smoke", f"run.dir={tmp_path}", "resume=true"])))
        assert (tmp_path / ".lock").read_text() == record  # read only
    finally:
        holder.kill()
        holder.wait()
    check_not_in_use(tmp_path)  # the kernel dropped the killed holder's lock
    with claim_run_dir(tmp_path, resume=True, overwrite=False):
        check_not_in_use(tmp_path / "elsewhere")


def test_experiment_differences_name_each_changed_key_and_skip_the_others():
    stored = {"seed": 0, "run": {"steps": 8, "dir": "a"}, "ray": {"address": None},
              "solver": {"lr": 0.001, "engine": "hf", "num_cpus": 1, "reward": {"tool_cost": 0.2}},
              "proposer": {"gone_key": 3}}
    new = {"seed": 3, "run": {"steps": 2, "dir": "b"}, "ray": {"address": "auto"},
           "solver": {"lr": 1e-3, "engine": "vllm", "num_cpus": 4, "reward": {"tool_cost": 0.5}},
           "proposer": {"keep_zero_advantage": False, "reward": "adversarial"}}
    defaults = {"proposer": {"keep_zero_advantage": False, "reward": "abs"}}
    assert experiment_differences(stored, new, defaults) == [
        "proposer.gone_key: stored 3, no longer a config key",
        'proposer.reward: stored "abs", now "adversarial"',  # absent when stored: the schema default counts
        "seed: stored 0, now 3",
        "solver.reward.tool_cost: stored 0.2, now 0.5",
    ]



def test_how_indexes_get_built_is_not_an_experiment_key():
    """A resume may change the index-build settings (they change where and how, not what is built)."""
    stored = {"evidence": {"build_in_run_max_passages": 50000, "shard_passages": 10000, "build_workers": None,
                           "max_hops": 3}}
    new = {"evidence": {"build_in_run_max_passages": 0, "shard_passages": 5, "build_workers": 8, "max_hops": 4}}
    assert experiment_differences(stored, new, {}) == ["evidence.max_hops: stored 3, now 4"]


def test_resume_checks_the_stored_config_of_a_real_run(tmp_path):
    stored = OmegaConf.to_yaml(compose(["experiment=smoke", f"run.dir={tmp_path}"]), resolve=True)
    (tmp_path / "config.yaml").write_text(stored)
    same = compose(["experiment=smoke", f"run.dir={tmp_path}", "run.steps=9", "resume=true", "rollout=vllm",
                    "solver.num_cpus=3", "ray.address=auto"])
    check_same_experiment(tmp_path, OmegaConf.to_yaml(same, resolve=True), CoevoConfig)
    other = compose(["experiment=smoke", f"run.dir={tmp_path}", "seed=3", "solver.lr=0.5", "ranker.mode=none"])
    with pytest.raises(RunDirError) as err:
        check_same_experiment(tmp_path, OmegaConf.to_yaml(other, resolve=True), CoevoConfig)
    lines = str(err.value).splitlines()
    assert lines[1:4] == ['  ranker.mode: stored "trainable", now "none"', "  seed: stored 0, now 3",
                          "  solver.lr: stored 0.001, now 0.5"]
    assert lines[4].startswith("resume with the stored values")


# ---- 3. checkpoints verified before use ---------------------------------------------------------

def _save(run_dir, step, weights=b"abc", optimizer=True):
    def save(role, path):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(weights)
        if optimizer:
            (path / "optimizer.pt").write_bytes(b"adam")

    return save_checkpoint(run_dir, step, step * 2, save, ["solver"])


def test_the_marker_records_size_and_checksum_of_every_file(tmp_path):
    ckpt = _save(tmp_path, 0)
    files = json.loads((ckpt / MARKER).read_text())["files"]
    assert sorted(files) == ["solver/model.safetensors", "solver/optimizer.pt", "state.json"]
    assert files["solver/model.safetensors"] == {"size": 3, "sha256": SHA256_ABC}
    state = (ckpt / "state.json").read_bytes()
    assert files["state.json"] == {"size": len(state), "sha256": hashlib.sha256(state).hexdigest()}
    assert verify_checkpoint(ckpt) is None


DAMAGE = {
    "weights deleted": (lambda c: (c / "solver" / "model.safetensors").unlink(), "solver/model.safetensors is missing"),
    "weights truncated": (lambda c: (c / "solver" / "model.safetensors").write_bytes(b"ab"),
                          "solver/model.safetensors has 2 bytes, the marker records 3"),
    "weights changed": (lambda c: (c / "solver" / "model.safetensors").write_bytes(b"abd"),
                        "solver/model.safetensors does not match its checksum"),
    "optimizer deleted": (lambda c: (c / "solver" / "optimizer.pt").unlink(), "solver/optimizer.pt is missing"),
    "marker deleted": (lambda c: (c / MARKER).unlink(), "no COMPLETE marker (its save never finished)"),
    "marker of an older version": (lambda c: (c / MARKER).write_text("ok\n"),
                                   "its COMPLETE marker lists no files with sizes and checksums (unreadable, or "
                                   "written before checkpoints recorded them)"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_skips_a_damaged_checkpoint_saying_why_and_takes_the_previous_one(tmp_path, damage):
    for step in range(3):
        _save(tmp_path, step)
    newest = tmp_path / "checkpoints" / "step_2"
    harm, reason = DAMAGE[damage]
    harm(newest)
    assert resumable_checkpoint(tmp_path) == (tmp_path / "checkpoints" / "step_1", [(newest, reason)])


def test_when_no_checkpoint_verifies_there_is_none_to_resume(tmp_path):
    for step in range(2):
        _save(tmp_path, step)
        (tmp_path / "checkpoints" / f"step_{step}" / "solver" / "model.safetensors").write_bytes(b"xyz")
    ckpt, skipped = resumable_checkpoint(tmp_path)
    assert ckpt is None and [p.name for p, _ in skipped] == ["step_1", "step_0"]


def test_every_damaged_file_is_named_in_the_marker_order(tmp_path):
    ckpt = _save(tmp_path, 0)
    state_size = (ckpt / "state.json").stat().st_size
    (ckpt / "state.json").write_text("{}")  # another size
    (ckpt / "solver" / "model.safetensors").write_bytes(b"abd")  # same size, another checksum
    (ckpt / "solver" / "optimizer.pt").unlink()
    assert verify_checkpoint(ckpt) == ("solver/model.safetensors does not match its checksum; solver/optimizer.pt "
                                       f"is missing; state.json has 2 bytes, the marker records {state_size}")


def test_a_checkpoint_saved_without_optimizer_state_never_verifies(tmp_path):
    ckpt = _save(tmp_path, 0, optimizer=False)
    assert verify_checkpoint(ckpt) == "it holds no optimizer state of role solver (solver/optimizer.pt)"


def test_loading_a_trainable_policy_without_optimizer_state_is_an_error(tiny, tiny_dir, tmp_path):
    cfg = PolicyConfig(preset="t", model=str(tiny_dir), engine="hf", kl_coef=0.0)
    Policy(cfg, *tiny, role="solver").save(tmp_path / "solver")
    (tmp_path / "solver" / "optimizer.pt").unlink()
    with pytest.raises(FileNotFoundError, match=r"solver/optimizer\.pt is missing: the trainable solver cannot "
                                                r"resume without its optimizer state"):
        Policy.from_config(cfg, "solver").load(tmp_path / "solver")
    frozen = PolicyConfig(preset="t", model=str(tiny_dir), engine="hf", frozen=True)
    Policy.from_config(frozen, "solver").load(tmp_path / "solver")  # a frozen policy has no optimizer to restore


def test_leftovers_of_a_killed_save_are_removed_at_start(tmp_path):
    _save(tmp_path, 1)
    _populate(tmp_path, "checkpoints/.tmp-step_2-k3j/solver/model.safetensors", "checkpoints/.old-step_1-999/w",
              ".metrics.jsonl.a1.tmp", "tasks/.step_2.jsonl.b2.tmp", "tasks/step_1.jsonl")
    assert remove_partial_checkpoints(tmp_path) == [".old-step_1-999", ".tmp-step_2-k3j"]
    assert remove_temp_files(tmp_path) == [str(tmp_path / ".metrics.jsonl.a1.tmp"),
                                           str(tmp_path / "tasks" / ".step_2.jsonl.b2.tmp")]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]
    assert [p.name for p in (tmp_path / "tasks").iterdir()] == ["step_1.jsonl"]
    assert verify_checkpoint(tmp_path / "checkpoints" / "step_1") is None


def test_a_tensorboard_rebuild_killed_half_way_is_removed_at_start_and_by_overwrite(tmp_path):
    # Resume rebuilds tensorboard/ under atomic_dir (MetricsLog): a SIGKILL then left its temp dir, which every
    # later start kept and run.overwrite=true refused as a file no run writes.
    _populate(tmp_path, "metrics.jsonl", "tensorboard/events.out.tfevents.1.h",
              f"{unique_sibling(tmp_path / 'tensorboard').name}/events.out.tfevents.2.h")
    leftover = next(p for p in tmp_path.iterdir() if p.name.startswith(".tmp-tensorboard-"))
    with claim_run_dir(tmp_path, resume=True, overwrite=False):
        assert remove_temp_files(tmp_path) == [str(leftover)]
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "metrics.jsonl", "tensorboard"]
    _populate(tmp_path, f"{unique_sibling(tmp_path / 'tensorboard').name}/events.out.tfevents.3.h")
    with claim_run_dir(tmp_path, resume=False, overwrite=True):
        assert sorted(p.name for p in tmp_path.iterdir()) == [".lock"]


def test_a_prune_killed_half_way_leaves_no_checkpoint_without_its_marker(tmp_path, monkeypatch):
    for step in range(3):
        _save(tmp_path, step)

    def killed(path, *args, **kwargs):  # a SIGKILL once the marker is gone (rmtree goes in directory order)
        (Path(path) / MARKER).unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        prune_checkpoints(tmp_path, keep=2)
    monkeypatch.undo()
    # A step_<n> without its marker was never pruned again (prune counts marked ones only) and never resumed.
    steps = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if not p.name.startswith("."))
    assert steps == ["step_1", "step_2"]
    assert [n[:len(".old-step_0-")] for n in remove_partial_checkpoints(tmp_path)] == [".old-step_0-"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1", "step_2"]


def test_checkpoints_after_the_resumed_one_are_dropped(tmp_path):
    for step in range(4):
        _save(tmp_path, step)
    assert drop_checkpoints_after(tmp_path, 1) == ["step_2", "step_3"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_0", "step_1"]


def test_metrics_and_tensorboard_hold_each_step_once_after_resume(tmp_path, tensorboard_points):
    first = MetricsLog(tmp_path)
    for step in range(4):  # the killed run got to step 3; its last checkpoint is step 1
        first.log(step, {"reward": {"solver": step / 10}})
    first.close()
    resumed = MetricsLog(tmp_path, start=2)
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]
    for step in (2, 3):
        resumed.log(step, {"reward": {"solver": 1 + step / 10}})
    resumed.close()
    assert [r["reward"]["solver"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0.0, 0.1, 1.2, 1.3]
    assert sorted(tensorboard_points(tmp_path / "tensorboard")) == [
        ("reward/solver", 0, 0.0), ("reward/solver", 1, 0.1), ("reward/solver", 2, 1.2), ("reward/solver", 3, 1.3)]


# ---- 4. config ranges: the cases of the issue --------------------------------------------------

@pytest.mark.parametrize("override,expected", [
    ("run.save_every=0", "save_every >= 1"), ("proposer.questions_per_step=0", "questions_per_step >= 1"),
    ("solver.max_turns=0", "max_turns >= 1"), ("solver.max_searches=0", "max_searches >= 1"),
    ("solver.max_searches=-2", "max_searches >= 1"), ("solver.micro_batch_size=0", "micro_batch_size >= 1"),
    ("proposer.lr=-0.001", "lr >= 0"), ("solver.temperature=-1.0", "temperature >= 0"),
    ("ranker.top_p=0.0", "0 < top_p <= 1"), ("solver.max_new_tokens=0", "max_new_tokens >= 1"),
    ("solver.ppo_epochs=0", "ppo_epochs >= 1"), ("evidence.retrieve_k=0", "retrieve_k >= 1"),
    ("solver.kl_coef=-0.1", "kl_coef >= 0"), ("proposer.max_target_chars=-1", "max_target_chars >= 1"),
    ("ranker.passage_chars=-300", "passage_chars >= 1"), ("solver.max_episode_tokens=-5", "max_episode_tokens >= 1"),
    ("evidence.max_question_chars=0", "max_question_chars >= 1"),
    ("solver.max_prompt_tokens=0", "max_prompt_tokens >= 1"),
])
def test_the_reported_bad_values_are_refused_at_start(override, expected):
    key, value = override.split("=")
    with pytest.raises(ValueError) as err:
        to_object(compose(["experiment=smoke", override]))
    assert str(err.value) == f"config key {key}={value} is out of range: expected {expected}"


def test_group_size_one_of_a_trained_solver_is_refused():
    with pytest.raises(ValueError, match=r"solver\.group_size=1 is out of range for a trained solver"):
        to_object(compose(["experiment=smoke", "solver.group_size=1"]))


@pytest.mark.slow  # a python -m coevo.run start: ~15 s on 2 busy cores
def test_the_command_line_says_what_is_wrong_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "coevo.run", "experiment=smoke", f"run.dir={tmp_path / 'r'}",
                           "run.save_every=0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("coevo.run: error: config key run.save_every=0 is out of range: "
                                   "expected save_every >= 1")
    assert not (tmp_path / "r").exists()  # refused before Hydra created the run directory


# ---- 7. clean shutdown --------------------------------------------------------------------------

def test_sigterm_raises_stopped_and_the_handlers_are_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as err, stop_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert err.value.exit_code == 143 and str(err.value) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_inside_an_uninterrupted_block_waits_for_the_block_to_end():
    done = []
    with pytest.raises(Stopped) as err, stop_on_signals():
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("written whole")
        done.append("not reached")
    assert done == ["written whole"] and err.value.exit_code == 130


def test_a_write_cut_by_a_signal_leaves_nothing_half_written(tmp_path):
    target = tmp_path / "checkpoints" / "step_0"
    with pytest.raises(Stopped), stop_on_signals():
        with atomic_dir(target) as tmp:
            (tmp / "half").write_text("x")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert list((tmp_path / "checkpoints").iterdir()) == []


SECOND_SIGNAL = """
import os, signal, time
from coevo.core.stopping import stop_on_signals, uninterrupted
with stop_on_signals(), uninterrupted():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("outlived the second signal")
"""


def test_a_second_signal_ends_the_process_at_once():
    proc = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == ""
    assert "SIGTERM received; stopping once the write in progress is complete" in proc.stderr


def test_the_advice_after_a_stop_mentions_resume_only_when_there_is_a_checkpoint(tmp_path):
    assert stopped_advice(tmp_path) == (f"No checkpoint was written in {tmp_path}: rerun with run.overwrite=true "
                                         "(or another run.dir) to start over.")
    ckpt = _save(tmp_path, 0)
    assert stopped_advice(tmp_path) == (f"The last complete checkpoint, {ckpt}, is intact; rerun with resume=true "
                                         "to continue.")

