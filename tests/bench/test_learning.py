"""bench/learning.py's pure parts: per-step series from a hand-made run dir, the eval summary,
the eval's checkpoint overrides, the subprocess runner and the plot (no model is loaded)."""
import json
import sys
from pathlib import Path

from bench import learning


def _path(hops: int) -> dict:
    return {"target": "T", "evidence_ids": [f"p{i}" for i in range(hops)],
            "hops": [{"head": f"e{i}", "tail": f"e{i + 1}"} for i in range(hops)]}


def _task(hops: int, correctness: list[float]) -> dict:
    return {"accepted": True, "reason": "accepted", "evidence_path": _path(hops),
            "rollouts": [{"rollout_idx": i, "correctness": c} for i, c in enumerate(correctness)]}


def _rejected(reason: str, hops=None) -> dict:
    return {"accepted": False, "reason": reason, "evidence_path": _path(hops) if hops else None, "rollouts": []}


METRICS = [
    {"step": 0, "candidates": 4, "accepted": 2, "acceptance": {"target": 0.75, "path": 0.5, "task": 0.5},
     "reasons": {"not_entity": 1, "parse:no_question_tag": 1},
     "solver": {"mean_searches": 1.25, "format_valid": 0.75, "accuracy": 0.25},
     "reward": {"proposer": 0.1, "solver": 0.3, "ranker": None},
     "ranker": {"calls": 3, "format_valid": 0.0, "i_ans": 0.0, "hit@1": None, "hit@3": None, "group_sizes": {}},
     "update": {"proposer": {"loss": 0.1, "n_seqs": 4, "n_tokens": 40, "zero_var_groups": 1},
                "solver": {"skipped": True, "n_seqs": 0}, "ranker": {"skipped": True, "n_seqs": 3, "n_tokens": 0}},
     "time_s": {"target": 1.0, "solve": 2.5}},
    {"step": 1, "candidates": 2, "accepted": 1, "acceptance": {"target": 1.0, "path": 0.5, "task": 0.5},
     "reasons": {}, "solver": {"mean_searches": 2.0, "format_valid": 1.0, "accuracy": 1.0},
     "reward": {"proposer": -0.2, "solver": 0.8, "ranker": 1.5},
     "ranker": {"calls": 2, "format_valid": 0.5, "i_ans": 1.0, "hit@1": 0.5, "hit@3": 1.0, "group_sizes": {}},
     "update": {}, "time_s": {"target": 0.5}},
]
DUMPS = {0: [_task(2, [1.0, 0.0]), _task(1, [0.0, 0.0]), _rejected("parse:no_question_tag", hops=1),
             _rejected("not_entity")],
         1: [_task(3, [1.0, 1.0]), _rejected("no_certified_path")]}


def _write_run(run_dir: Path, torn: bool = True) -> None:
    (run_dir / "tasks").mkdir(parents=True)
    for step, records in DUMPS.items():
        (run_dir / "tasks" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    lines = "".join(json.dumps(m) + "\n" for m in METRICS)
    (run_dir / "metrics.jsonl").write_text(lines + ('{"step": 2, "candi' if torn else ""))


def test_series_from_hand_made_run(tmp_path):
    _write_run(tmp_path)
    records, metrics = learning.load_run(tmp_path)
    s = learning.extract_series(metrics, records)
    assert s["steps"] == [0, 1]
    assert s["task_acceptance"] == [0.5, 0.5]
    assert s["target_acceptance"] == [0.75, 1.0]
    assert s["path_acceptance"] == [0.5, 0.5]
    assert s["reasons"] == [{"not_entity": 1, "parse:no_question_tag": 1}, {}]
    assert s["proposer_reward"] == [0.1, -0.2]
    assert s["solver_reward"] == [0.3, 0.8]
    assert s["ranker_reward"] == [None, 1.5]
    assert s["solver_format_valid"] == [0.75, 1.0]
    assert s["accuracy"] == [0.25, 1.0]
    assert s["mean_searches"] == [1.25, 2.0]
    assert s["ranker_format_valid"] == [0.0, 0.5]
    assert s["hit@1"] == [None, 0.5] and s["hit@3"] == [None, 1.0] and s["hit@K"] == [None, 1.0]
    assert s["hit@2"] == s["hit@5"] == [None, None]  # cutoffs the steps did not record
    # step 0: groups [1, 0] (mixed) and [0, 0] (all wrong); step 1: [1, 1] (all correct)
    assert s["solver_groups"] == [2, 1]
    assert s["mixed_groups"] == [0.5, 0.0]
    assert s["all_correct_groups"] == [0.0, 1.0]
    assert s["all_wrong_groups"] == [0.5, 0.0]
    assert s["accepted_hops"] == [[2, 1], [3]]  # the rejected candidate's 1-hop path does not count
    assert s["updates"] == [{"proposer": 4, "solver": 0, "ranker": 0}, {}]
    assert s["zero_var_groups"] == [{"proposer": 1, "solver": None, "ranker": None}, {}]
    assert s["step_s"] == [3.5, 0.5]
    assert all(len(v) == 2 for v in s.values())


def test_hit_at_k_follows_the_configured_top_k():
    two = {"step": 0, "ranker": {"hit@1": 0.25, "hit@2": 0.5}}  # ranker.top_k=2: cutoffs {1, 2}
    five = {"step": 1, "ranker": {"hit@1": 0.1, "hit@3": 0.2, "hit@5": 0.3}}
    s = learning.extract_series([two, five], [])
    assert s["hit@2"] == [0.5, None] and s["hit@K"] == [0.5, 0.3] and s["hit@3"] == [None, 0.2]


def test_series_of_an_empty_or_missing_step():
    s = learning.extract_series([METRICS[1]], [])  # metrics line without its dump
    assert s["solver_groups"] == [0] and s["mixed_groups"] == [None] and s["accepted_hops"] == [[]]
    assert all(v == [] for v in learning.extract_series([], []).values())


def test_eval_summary_reads_the_macro_average():
    result = {"metrics": {"nq": {"em": 1.0}, "average": {"n": 7, "datasets": 7, "em": 0.25, "f1": 0.5,
                                                          "cover_em": 0.375, "format_failure": 0.75,
                                                          "mean_searches": 1.5}}}
    assert learning.eval_summary(result) == {"em": 0.25, "f1": 0.5, "cover_em": 0.375, "format_failure": 0.75,
                                             "searches": 1.5, "n": 7,
                                             "per_dataset": {"nq": {"em": 1.0, "f1": None, "n": None}}}


def test_eval_overrides_name_the_latest_checkpoint(tmp_path):
    assert learning.eval_overrides("control", tmp_path, "trainable") == (["ranker.mode=trainable"], None, None)
    overrides, ckpt, error = learning.eval_overrides("trained", tmp_path, "trainable")
    assert ckpt is None and "no complete checkpoint" in error
    for step in (0, 1):
        d = tmp_path / "checkpoints" / f"step_{step}"
        for role in ("solver", "ranker"):
            (d / role).mkdir(parents=True)
        (d / "state.json").write_text("{}")
        (d / "COMPLETE").write_text("ok\n")
    last = tmp_path / "checkpoints" / "step_1"
    assert learning.eval_overrides("trained", tmp_path, "trainable") == (
        ["ranker.mode=trainable", f"solver.checkpoint={last / 'solver'}", f"ranker.checkpoint={last / 'ranker'}"],
        str(last), None)
    assert learning.eval_overrides("trained", tmp_path, "none")[0] == ["ranker.mode=none",
                                                                        f"solver.checkpoint={last / 'solver'}"]


def test_run_logged_reports_exit_code_and_output(tmp_path):
    code = "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)"
    rc, tail, _ = learning.run_logged([sys.executable, "-c", code], tmp_path / "x.log", "t", None)
    assert rc == 3 and tail == ["one", "two"]
    assert (tmp_path / "x.log").read_text() == "one\ntwo\n"
    rc, tail, seconds = learning.run_logged([sys.executable, "-c", "import time; time.sleep(30)"],
                                            tmp_path / "y.log", "t", 0.5)
    assert rc != 0 and seconds < 20 and "time limit" in tail[-1]


def test_plot_writes_a_png_with_a_missing_arm(tmp_path):
    _write_run(tmp_path / "run", torn=False)
    series = learning.extract_series(*reversed(learning.load_run(tmp_path / "run")))
    learning.plot({"trained": {"series": series}}, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
