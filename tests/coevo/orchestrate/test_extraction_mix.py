"""solver.extraction_mix: corpus clozes in the co-evolution step's solver batch, their figures apart."""
from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from coevo.core.config import CoevoConfig, SolveRootConfig, compose, to_object
from coevo.core.role_config import check_extraction_mix
from coevo.evaluate.report import load_run
from coevo.orchestrate.extraction_mix import (
    ExtractionDataError,
    check_extraction_data,
    cloze_positions,
    step_clozes,
)
from coevo.orchestrate.startup_checks import REFUSALS

# Three clozes over the toy corpus (tests/conftest.py PASSAGES); with seed 0 the file's permutation is
# random.Random(0).shuffle([0, 1, 2]) -> [0, 2, 1], so two a step take c0 c2 | c1 c0 | c2 c1.
CLOZES = [("c0", "Berlin is the capital of ___.", "Germany", "Berlin", "p2"),
          ("c1", "The Rhine flows through ___.", "Germany", "Rhine", "p4"),
          ("c2", "The Alps are mountains in ___.", "Europe", "Alps", "p5")]


def cloze_file(path: Path, split: object = "train", **extra: object) -> Path:
    rows = [{"id": i, "question": f'Which name fills the blank in "{s}"?', "answers": [a], "guide": [g],
             "gold_ids": [p], "dataset": "extraction", "page": g, **({"split": split} if split else {}), **extra}
            for i, s, a, g, p in CLOZES]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def mixed(path: Path, n: int = 2) -> tuple[str, ...]:
    return (f"solver.extraction_mix={n}", f"solver.extraction_data={path}", "solver.guided_rollouts=true")


@pytest.fixture(scope="module")
def base() -> CoevoConfig:
    return to_object(compose(["experiment=smoke"]))


def with_mix(cfg: CoevoConfig, path: Path, n: int = 2) -> CoevoConfig:
    out = copy.deepcopy(cfg)
    out.solver.extraction_mix, out.solver.extraction_data, out.solver.guided_rollouts = n, str(path), True
    return out


def test_the_cursor_walks_a_seeded_permutation_two_a_step():
    assert [cloze_positions(s, 2, 3, seed=0) for s in range(3)] == [[0, 2], [1, 0], [2, 1]]


def test_two_clozes_join_the_solver_batch_with_a_guided_rollout_each(scripted_run, tmp_path):
    run = scripted_run(overrides=mixed(cloze_file(tmp_path / "clozes.jsonl")))
    records, metrics = run.step()
    clozes = [r for r in records if r.get("kind") == "extraction"]
    assert [(r["task_id"], r["source_id"]) for r in clozes] == [("s0-x0", "c0"), ("s0-x1", "c2")]
    for r in clozes:  # G = 2: one sampled rollout, one guided replay of the cloze's search
        assert [ro["guided"] for ro in r["rollouts"]] == [False, True]
        assert r["rollouts"][1]["answer"] == r["answers"][0]
    # The sampled rollouts search "capital of France"; the ranker puts Berlin first, so both answer "Berlin":
    # wrong, and an echo of c0's question ("Berlin is the capital of ___."), not of c2's.
    block = metrics["extraction"]
    assert (block["tasks"], block["cursor"], block["accuracy"]) == (2, 0, 0.0)
    assert {k: block["solver"][k] for k in ("em", "guided", "guided_read", "echo_rate", "end_reasons")} == \
        {"em": 0.0, "guided": 2, "guided_read": 2, "echo_rate": 0.5, "end_reasons": {"answer": 2}}
    # the co-evolution figures count the proposer's one accepted task alone: 1 sampled rollout (Berlin: wrong),
    # 1 guided; 2 ranker calls (a search each) against the clozes' 4
    assert (metrics["accepted"], metrics["solver"]["guided"], metrics["solver"]["end_reasons"]) == \
        (1, 1, {"answer": 1})
    assert (metrics["solver"]["em"], metrics["solver"]["accuracy"], metrics["ranker"]["calls"]) == (0.0, 0.0, 2)
    assert (block["ranker"]["calls"], metrics["accuracy_hist"]) == (4, {"0.00": 1})
    # one solver update over three groups (the task, c0, c2), each [sampled wrong 0, guided right 1]:
    # advantages (r - 0.5) / std([0, 1]) = -/+0.707
    (batch,) = run.updates[id(run.actors.solver)]
    assert [round(seq.advantage, 3) for seq in batch] == [-0.707, 0.707] * 3
    assert (metrics["update"]["solver"]["n_seqs"], metrics["update"]["solver"]["groups"]) == (6, 3)
    # the run's readers (coevo.inspect, bench.learning: load_run) see the two candidates, not the clozes
    (tmp_path / "run" / "tasks").mkdir(parents=True)
    (tmp_path / "run" / "tasks" / "step_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [r["task_id"] for r in load_run(tmp_path / "run")[0]] == ["s0-q0-c0", None]


def test_a_resumed_step_takes_the_clozes_the_original_would_have(base, tmp_path):
    """The cursor is step x N: a new process (a resume) needs nothing from the checkpoint to continue it."""
    cfg = with_mix(base, cloze_file(tmp_path / "clozes.jsonl"))
    taken = [[t.id for t in step_clozes(cfg, step).sources] for step in range(3)]
    assert taken == [["c0", "c2"], ["c1", "c0"], ["c2", "c1"]]
    resumed = step_clozes(to_object(compose(["experiment=smoke", *mixed(tmp_path / "clozes.jsonl")])), 2)
    assert ([t.id for t in resumed.sources], [t.id for t in resumed.tasks], resumed.cursor) == \
        (["c2", "c1"], ["s2-x0", "s2-x1"], 4)


def test_off_by_default_and_in_the_paper_presets(base):
    assert (base.solver.extraction_mix, base.solver.extraction_data) == (0, None)
    assert step_clozes(base, 3).tasks == []
    for experiment in ("paper_cosearch", "paper_zest"):
        assert to_object(compose([f"experiment={experiment}"])).solver.extraction_mix == 0


@pytest.mark.parametrize("split, message", [
    ("heldout", "line 1 has split 'heldout'; expected every record from the training page split"),
    (None, "line 1 has split None"),
])
def test_a_file_not_from_the_training_split_is_refused(base, tmp_path, split, message):
    cfg = with_mix(base, cloze_file(tmp_path / "c.jsonl", split))
    with pytest.raises(ExtractionDataError, match=f"solver.extraction_data=.*c.jsonl: {message}"):
        check_extraction_data(cfg)
    with pytest.raises(ExtractionDataError, match=message):
        step_clozes(cfg, 0)


def test_a_missing_or_unguided_file_is_refused_at_start_up(base, tmp_path):
    with pytest.raises(ExtractionDataError, match=r"solver.extraction_data=.*none.jsonl: no such file") as caught:
        check_extraction_data(with_mix(base, tmp_path / "none.jsonl"))
    assert isinstance(caught.value, REFUSALS)  # one line, exit 2, before any model starts
    with pytest.raises(ExtractionDataError, match="line 1 has no 'guide'"):
        check_extraction_data(with_mix(base, cloze_file(tmp_path / "c.jsonl", guide=[])))


@pytest.mark.parametrize("changes, in_solve, message", [
    ({"extraction_data": None}, False, "needs solver.extraction_data"),
    ({"guided_rollouts": False}, False, "needs solver.guided_rollouts=true"),
    ({}, True, "coevo.solve has no proposer tasks to mix clozes into"),
])
def test_keys_that_do_not_hold_together_are_refused(base, changes, in_solve, message):
    solver = dataclasses.replace(base.solver, extraction_mix=2, extraction_data="x.jsonl", guided_rollouts=True)
    check_extraction_mix(solver, in_solve=False)
    with pytest.raises(ValueError, match=f"config key solver.extraction_mix=2.*{message}"):
        check_extraction_mix(dataclasses.replace(solver, **changes), in_solve=in_solve)


def test_coevo_solve_refuses_the_mix_at_validation():
    dcfg = compose(["experiment=smoke", *mixed(Path("x.jsonl"), 1)], config_name="solve")
    with pytest.raises(ValueError, match="solver.extraction_mix=1: coevo.solve has no proposer tasks"):
        to_object(dcfg, SolveRootConfig)
