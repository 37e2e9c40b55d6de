"""The hop curriculum in a run: levels played, metrics, and its state through a checkpoint and a resume.

Runs `coevo.run`'s step loop on the scripted actors (tests/coevo/orchestrate/conftest.py): the
proposer's "Paris" is accepted with a 1-hop path and solved by one of two rollouts (accuracy
0.5), "Atlantis" has no corpus support.
"""
import json
from pathlib import Path

from coevo.orchestrate import hop_curriculum
from coevo.orchestrate.outputs import MetricsLog, read_jsonl
from coevo.orchestrate.persist import restore
from coevo.train.checkpoint import latest_checkpoint, read_state
from proposer.curriculum import CurriculumState

CURRICULUM = ("proposer.curriculum.enabled=true", "proposer.curriculum.window=1", "proposer.curriculum.up=0.5",
              "proposer.curriculum.down=0.1", "run.save_every=1")


def run_steps(run, run_dir: Path, start: int, cursor: int, steps: int, state):
    """`coevo.run`'s loop from step `start` to `steps` - 1; every metrics line so far."""
    from coevo.run import _loop

    run.cfg.run.steps = steps
    run_dir.mkdir(parents=True, exist_ok=True)  # coevo.run's open_run makes it before the loop's first event
    metrics = MetricsLog(run_dir, "none", start=start)
    try:
        _loop(run.cfg, run_dir, run.actors, ["who wrote hamlet"], metrics, start, cursor, state)
    finally:
        metrics.close()
    return read_jsonl(run_dir / "metrics.jsonl")


def test_the_level_moves_is_logged_and_resumes_where_it_was(scripted_run, tmp_path):
    run_dir = tmp_path / "run"
    run = scripted_run(overrides=CURRICULUM)
    state = hop_curriculum.start(run.cfg)
    assert state == CurriculumState(level=1)
    lines = run_steps(run, run_dir, 0, 0, 2, state)
    # step 0 at 1 hop: Paris solved at 0.5 >= up over a full window of 1 step -> level 2;
    # step 1 at 2 hops: the scripted evidence has 1-hop paths only, so nothing is accepted and the level stays
    assert [m["curriculum"] for m in lines] == [
        {"level": 1, "next_level": 2, "accuracy": {"1": 0.5}},
        {"level": 2, "next_level": 2, "accuracy": {"1": 0.5}},
    ]
    n = run.cfg.proposer.questions_per_step  # each reference question: Paris and Atlantis
    assert lines[0]["hops"] == {"tasks": {"1": n}, "accuracy": {"1": 0.5}}
    assert lines[1]["reasons"] == {"no_path_of_k_hops": n, "no_corpus_support": n} and lines[1]["accepted"] == 0
    ckpt = latest_checkpoint(run_dir)
    assert ckpt.name == "step_1"
    assert read_state(ckpt)["curriculum"] == {"level": 2, "windows": {"1": [0.5]}}

    # A resume: a fresh run of the same experiment restores the policies, the cursor and the curriculum.
    resumed = scripted_run(overrides=CURRICULUM)
    start, cursor = restore(ckpt, run_dir, resumed.actors)
    state = hop_curriculum.start(resumed.cfg, hop_curriculum.saved_state(ckpt))
    assert (start, cursor, state) == (2, 2 * n, CurriculumState(level=2, windows=((1, (0.5,)),)))
    lines = run_steps(resumed, run_dir, start, cursor, 3, state)
    assert [m["step"] for m in lines] == [0, 1, 2] and lines[2]["curriculum"]["level"] == 2


def test_off_the_curriculum_leaves_steps_checkpoints_and_metrics_as_they_were(scripted_run):
    run = scripted_run()
    assert hop_curriculum.start(run.cfg, {"level": 3, "windows": {}}) is None
    assert hop_curriculum.step_hops(run.cfg, None) == "longest"
    metrics = {"hops": {"tasks": {"1": 1}, "accuracy": {"1": 0.5}}}
    assert hop_curriculum.advance(run.cfg, None, metrics, {1: 0.5}) == (None, metrics)
    assert hop_curriculum.checkpoint_state(None) == {} and hop_curriculum.saved_state(None) is None
    assert json.dumps(hop_curriculum.checkpoint_state(CurriculumState(2, ((1, (0.5,)),)))) == \
        '{"curriculum": {"level": 2, "windows": {"1": [0.5]}}}'


def test_advance_moves_on_the_typed_accuracy_not_the_logged_metrics(scripted_run):
    run = scripted_run(overrides=CURRICULUM)  # window 1, up 0.5, down 0.1
    metrics = {"hops": {"tasks": {"1": 1}, "accuracy": {"1": 0.0}}}  # what the line logs is not read back
    state, out = hop_curriculum.advance(run.cfg, CurriculumState(level=1), metrics, {1: 0.5, 2: None})
    assert state == CurriculumState(level=2, windows=((1, (0.5,)),))
    assert out == {**metrics, "curriculum": {"level": 1, "next_level": 2, "accuracy": {"1": 0.5}}}
