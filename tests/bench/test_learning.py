"""bench/learning.py's pure parts: per-step series from a hand-made run dir, the eval summary,
the eval's checkpoint overrides, the subprocess runner, the plot, and bench/learning_stats.py's
pooled / paired / in-run figures against hand-computed values (no model is loaded)."""
import json
import math
import sys
from functools import partial
from pathlib import Path
from statistics import NormalDist

import pytest

from bench import learning, learning_plot, learning_stats, limits
from coevo.train import precision


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
                                             "per_dataset": {"nq": {"em": 1.0, "f1": None, "n": None}},
                                             "pooled": None}  # no predictions: nothing to pool


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
    learning_plot.plot({"trained": {"series": series}}, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_control_steps_match_the_steps_the_trained_arm_finished():
    assert learning.control_steps({"series": {"steps": [0, 1, 2]}}, 20) == 3  # stopped by --arm-timeout
    assert learning.control_steps({"series": {"steps": list(range(20))}}, 20) == 20
    assert learning.control_steps({"series": {"steps": []}}, 20) == 1  # died in step 0: the control still runs one
    assert learning.control_steps(None, 5) == 1


def test_main_runs_the_control_for_the_trained_arms_finished_steps(tmp_path, monkeypatch):
    calls: list[tuple[str, int]] = []

    def fake_run_arm(arm, args, out, steps=None):
        calls.append((arm, args.steps if steps is None else steps))
        return {"returncode": 0, "error": None, "series": {"steps": [0, 1, 2]}}

    monkeypatch.setattr(learning, "run_arm", fake_run_arm)
    monkeypatch.setattr(learning, "ranker_mode", lambda overrides: "none")
    monkeypatch.setattr(learning, "in_run_block", lambda arms, steps, seed: None)
    monkeypatch.setattr(learning, "plot", lambda *a, **k: None)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n")
    monkeypatch.setattr(precision, "cpu_flags", partial(precision.cpu_flags, str(cpuinfo)))
    monkeypatch.setattr(learning.os, "cpu_count", lambda: 2)
    assert learning.main(["--steps", "20", "--eval-limit", "0", "--out", str(tmp_path / "b")]) == 0
    assert calls == [("trained", 20), ("control", 3)]
    written = json.loads((tmp_path / "b" / "learning.json").read_text())
    # the machine the step times belong to, read from a cpuinfo it was given
    assert written["machine"] == {"cores": 2, "cpu_flags": {flag: flag in ("avx2", "amx_bf16")
                                                            for flag in limits.REPORTED_FLAGS}}
    calls.clear()
    assert learning.main(["--steps", "20", "--eval-limit", "0", "--parallel", "--out", str(tmp_path / "p")]) == 0
    assert sorted(calls) == [("control", 20), ("trained", 20)]  # at the same time: nothing to match yet


# ---- pooled and paired figures --------------------------------------------------------------

def _wilson_by_hand(k: int, n: int) -> list[float]:
    """The Wilson score interval written out: (p + z²/2n ± z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    z = NormalDist().inv_cdf(0.975)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [centre - half, centre + half]


def _eval_result(right_ids: set[int], ids=range(1, 11), dataset: str = "nq") -> dict:
    return {"predictions": [{"id": f"q{i}", "dataset": dataset, "em": 1.0 if i in right_ids else 0.0}
                            for i in ids]}


def test_paired_report_on_hand_made_results():
    trained = learning_stats.question_results(_eval_result({1, 2, 3, 4, 5, 6}), "trained.json")
    control = learning_stats.question_results(_eval_result({1, 2, 7}), "control.json")
    report = learning_stats.paired_report(trained, control)
    assert (report["questions"], report["both_right"], report["trained_only"], report["control_only"],
            report["neither"]) == (10, 2, 4, 1, 3)
    # exact McNemar on 4 vs 1 discordant: two-sided binomial at 1/2, 2 * (C(5,4) + C(5,5)) / 2^5
    assert report["mcnemar_p"] == pytest.approx(2 * (5 + 1) / 32) == pytest.approx(0.375)
    assert report["trained"]["right"] == 6 and report["trained"]["scored"] == 10 and report["trained"]["share"] == 0.6
    assert report["control"]["right"] == 3 and report["control"]["share"] == 0.3
    assert report["trained"]["wilson_95"] == pytest.approx(_wilson_by_hand(6, 10), abs=1e-9)
    assert report["control"]["wilson_95"] == pytest.approx(_wilson_by_hand(3, 10), abs=1e-9)
    same = learning_stats.paired_report(trained, trained)
    assert same["mcnemar_p"] is None and same["trained_only"] == same["control_only"] == 0  # nothing discordant


def test_pairing_different_question_sets_is_refused():
    trained = learning_stats.question_results(_eval_result({1}), "a.json")
    control = learning_stats.question_results(_eval_result({1}, ids=range(2, 12)), "b.json")
    with pytest.raises(ValueError, match=r"cannot pair a\.json \(10 questions\) with b\.json .*different question"):
        learning_stats.paired_report(trained, control, ("a.json", "b.json"))
    # the same ids in another dataset are other questions
    other = learning_stats.question_results(_eval_result({1}, dataset="popqa"), "c.json")
    with pytest.raises(ValueError, match="different question sets"):
        learning_stats.paired_report(trained, other)
    twice = {"predictions": _eval_result({1})["predictions"] * 2}
    with pytest.raises(ValueError, match=r"d\.json: question 'q1' of dataset 'nq' appears twice"):
        learning_stats.question_results(twice, "d.json")


def test_fisher_exact_on_hand_made_counts():
    # 3 / 4 against 0 / 4: hypergeometric P(x) = C(3,x) C(5,4-x) / C(8,4) = 5, 30, 30, 5 (/70) for x = 0..3;
    # two-sided: the tables as unlikely as the observed x = 3 are x = 0 and x = 3
    assert learning_stats.fisher_p(3, 4, 0, 4) == pytest.approx(10 / 70)
    assert learning_stats.fisher_p(3, 4, 0, 0) is None


def test_quarters_are_fixed_by_the_step_count():
    assert learning_stats.quarter_blocks(10) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert learning_stats.quarter_blocks(8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert learning_stats.quarter_blocks(3) == [[0], [1], [2], []]


def test_cluster_bootstrap_is_seeded_and_holds_the_point_estimate():
    counts = [(1, 4), (0, 4), (2, 4), (0, 4), (3, 4), (0, 2)]
    lo, hi = learning_stats.cluster_bootstrap(counts, seed=0)
    assert 0.0 <= lo < 6 / 22 < hi <= 1.0
    assert learning_stats.cluster_bootstrap(counts, seed=0) == [lo, hi]
    # two tasks, 2 / 2 and 0 / 2: a resample draws both (share 1/2), the first twice (1) or the second twice (0),
    # each of the last two with probability 1/4, far more than the 2.5 % in each tail
    assert learning_stats.cluster_bootstrap([(2, 2), (0, 2)], seed=0) == [0.0, 1.0]
    # every task at the same share: every resample has it, so the interval is that point
    assert learning_stats.cluster_bootstrap([(1, 2), (2, 4)], seed=3) == [0.5, 0.5]
    assert learning_stats.cluster_bootstrap([], seed=0) is None


def test_task_counts_pool_the_sampled_rollouts_of_accepted_tasks():
    guided = {"guided": True, "correctness": 1.0}
    records = [{"step": 0, "accepted": True, "accuracy": 0.5, "rollouts": [{}, {}, {}, {}, guided]},
               {"step": 0, "accepted": False, "accuracy": None, "rollouts": []},
               {"step": 1, "accepted": True, "accuracy": 0.25, "rollouts": [{}, {}, {}, {}]},
               {"step": 1, "accepted": True, "accuracy": None, "rollouts": [{}, {}]},  # unscored: left out
               {"step": 2, "accepted": True, "accuracy": 1.0, "rollouts": [{}, {}]}]
    assert learning_stats.task_counts(records) == [(0, 2, 4), (1, 1, 4), (2, 2, 2)]
    assert learning_stats.task_counts(records, steps=[0, 1]) == [(0, 2, 4), (1, 1, 4)]


def test_task_counts_read_counts_the_sampled_rollouts_that_read_the_answer():
    read, unread = {"read_answer": True}, {"read_answer": False}
    records = [{"step": 0, "accepted": True, "accuracy": 0.0,
                "rollouts": [read, unread, read, {}, {"guided": True, "read_answer": True}]},  # guided: left out
               {"step": 1, "accepted": True, "accuracy": 1.0, "rollouts": [unread, unread]},
               {"step": 1, "accepted": False, "accuracy": None, "rollouts": [read]}]
    assert learning_stats.task_counts(records, read=True) == [(0, 2, 4), (1, 0, 2)]


def test_in_run_report_on_hand_made_counts():
    trained = [(0, 1, 4), (3, 2, 4), (9, 1, 2)]
    control = [(0, 0, 4), (5, 0, 4)]
    report = learning_stats.in_run_report(trained, control, steps=10, seed=0)
    assert {k: report["trained"][k] for k in ("right", "sampled", "tasks", "share")} == {
        "right": 4, "sampled": 10, "tasks": 3, "share": 0.4}
    assert report["control"]["right"] == 0 and report["control"]["sampled"] == 8
    assert report["trained"]["wilson_95"] == pytest.approx(_wilson_by_hand(4, 10), abs=1e-9)
    lo, hi = report["trained"]["bootstrap_95"]
    assert lo <= 0.4 <= hi
    # [[4, 6], [0, 8]]: P(x) = C(4,x) C(14,10-x) / C(18,10); two-sided over the x at most as likely as x = 4
    probs = [math.comb(4, x) * math.comb(14, 10 - x) / math.comb(18, 10) for x in range(5)]
    assert report["fisher_p"] == pytest.approx(sum(p for p in probs if p <= probs[4] * (1 + 1e-9)))
    quarters = report["quarters"]
    assert [q["steps"] for q in quarters] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [(q["trained"]["right"], q["trained"]["scored"]) for q in quarters] == [(1, 4), (2, 4), (0, 0), (1, 2)]
    assert [(q["control"]["right"], q["control"]["scored"]) for q in quarters] == [(0, 4), (0, 4), (0, 0), (0, 0)]
    assert quarters[2]["fisher_p"] is None and quarters[3]["fisher_p"] is None  # an arm sampled nothing there
    # quarter 2, [[2, 2], [0, 4]]: P(x) = C(2,x) C(6,4-x) / C(8,4) = 15, 40, 15 (/70); x = 0 and x = 2 count
    assert quarters[1]["fisher_p"] == pytest.approx(30 / 70)


def test_acceptance_report_pools_candidates_per_arm_and_quarter():
    trained = [(0, 0, 48), (1, 1, 48), (2, 3, 48), (3, 4, 48)]
    control = [(0, 0, 48), (1, 0, 48), (2, 1, 48), (3, 0, 48)]
    report = learning_stats.acceptance_report(trained, control, steps=4)
    assert (report["trained"]["right"], report["trained"]["scored"], report["trained"]["steps"]) == (8, 192, 4)
    assert (report["control"]["right"], report["control"]["scored"]) == (1, 192)
    # [[8, 184], [1, 191]]: P(x) = C(192,x) C(192,9-x) / C(384,9); two-sided over the x at most as likely as 8
    probs = [math.comb(192, x) * math.comb(192, 9 - x) / math.comb(384, 9) for x in range(10)]
    assert report["fisher_p"] == pytest.approx(sum(p for p in probs if p <= probs[8] * (1 + 1e-9)))
    assert [(q["trained"]["right"], q["control"]["right"]) for q in report["quarters"]] == [(0, 0), (1, 0), (3, 1),
                                                                                               (4, 0)]


def test_paired_blocks_read_the_eval_files(tmp_path):
    arms = {}
    for arm, right in (("trained", {1, 2, 3, 4, 5, 6}), ("control", {1, 2, 7})):
        (tmp_path / f"{arm}.json").write_text(json.dumps(_eval_result(right)))
        arms[arm] = {"eval": {"file": str(tmp_path / f"{arm}.json"), "error": None},
                     "eval_no_ranker": {"file": str(tmp_path / f"{arm}.json"), "error": None}}
    arms["control"]["eval"] = {"error": "coevo.eval exited with code 1: boom"}
    blocks = learning_stats.paired_blocks(arms, "frozen")
    assert blocks["no_ranker"]["ranker_mode"] == "none" and blocks["no_ranker"]["error"] is None
    assert blocks["no_ranker"]["mcnemar_p"] == pytest.approx(0.375)
    assert blocks["own_ranker"] == {"ranker_mode": "frozen",
                                    "error": "the control arm's `eval` has no result to pair "
                                             "(coevo.eval exited with code 1: boom)"}
    summary = learning.eval_summary({"metrics": {}, **_eval_result({1, 2, 3})})
    assert summary["pooled"]["right"] == 3 and summary["pooled"]["scored"] == 10


def test_in_run_block_pools_the_finished_steps_of_both_run_dirs(tmp_path):
    for arm, accuracy in (("trained", 0.5), ("control", 0.0)):
        run_dir = tmp_path / arm
        (run_dir / "tasks").mkdir(parents=True)
        for step in (0, 1, 2):  # step 2 has a dump but no metrics line: not finished, not counted
            task = {"accepted": True, "accuracy": accuracy, "reason": "accepted",
                    "rollouts": [{"read_answer": accuracy > 0}, {"read_answer": True}]}
            (run_dir / "tasks" / f"step_{step}.jsonl").write_text(json.dumps(task) + "\n")
        (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    block = learning_stats.in_run_block({arm: {"run_dir": str(tmp_path / arm)} for arm in ("trained", "control")},
                                        steps=2, seed=0)
    assert (block["trained"]["right"], block["trained"]["sampled"], block["control"]["right"]) == (2, 4, 0)
    assert block["error"] is None and [q["steps"] for q in block["quarters"]] == [[0], [1], [], []]
    assert block["acceptance"]["trained"]["scored"] == 0  # these metrics lines name no candidates
    reading = block["reading"]  # trained: both rollouts of steps 0-1 read; control: one of two
    assert [(reading[a]["right"], reading[a]["sampled"]) for a in ("trained", "control")] == [(4, 4), (2, 4)]
    # these tasks have no question or target, so steps 0 and 1 hold one task twice: its first time is step 0's
    first = block["first_seen"]
    assert [(first[a]["right"], first[a]["sampled"], first[a]["tasks"]) for a in ("trained", "control")] == \
        [(1, 2, 1), (0, 2, 1)]
    missing = learning_stats.in_run_block({"trained": {"run_dir": str(tmp_path / "nowhere")}}, steps=2, seed=0)
    assert set(missing) == {"error"} and "nowhere" in missing["error"]


def test_first_occurrences_keep_each_task_once_at_its_earliest_step():
    records = [
        {"step": 3, "accepted": True, "question": "What is the capital of France?", "target": "Paris", "n": 1},
        {"step": 1, "accepted": True, "question": "what is the capital of France", "target": "paris", "n": 2},
        {"step": 1, "accepted": False, "question": "Who wrote Hamlet?", "target": "Shakespeare", "n": 3},
        {"step": 2, "accepted": True, "question": "Who wrote Hamlet?", "target": "William Shakespeare", "n": 4},
        {"step": 2, "accepted": True, "question": "What is the capital of France?", "target": "Paris", "n": 5},
    ]
    # Paris first at step 1 (record 2); record 3 was rejected; record 4 is another target, so another task
    assert [r["n"] for r in learning_stats.first_occurrences(records)] == [2, 4]
    assert learning_stats.task_key("The capital, of France?", "PARIS") == ("capital of france", "paris")


def test_paired_blocks_skip_own_ranker_and_pair_the_heldout_clozes(tmp_path):
    arms = {}
    for arm, right in (("trained", {1, 2, 3, 4, 5, 6}), ("control", {1, 2, 7})):
        (tmp_path / f"{arm}.json").write_text(json.dumps(_eval_result(right)))
        result = {"file": str(tmp_path / f"{arm}.json"), "error": None}
        arms[arm] = {"eval": None, "eval_no_ranker": result, "eval_heldout": result}
    blocks = learning_stats.paired_blocks(arms, "trainable", own_ranker=False, heldout=True)
    assert set(blocks) == {"no_ranker", "heldout"}
    assert blocks["heldout"]["ranker_mode"] == "none" and blocks["heldout"]["mcnemar_p"] == pytest.approx(0.375)
    assert (blocks["heldout"]["trained_only"], blocks["heldout"]["control_only"]) == (4, 1)


def test_heldout_eval_scores_every_cloze_without_a_ranker_on_the_runs_corpus(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(learning, "run_logged", lambda cmd, *a, **k: (commands.append(cmd) or (1, ["boom"], 0.1)))
    args = learning.parse_args(["--heldout", str(tmp_path / "clozes.jsonl"), "--out", str(tmp_path), "--",
                                "corpus=wiki_mini"])
    result = learning.evaluate_arm("control", args, tmp_path, "none", "eval-heldout", heldout=True)
    assert result["error"].startswith("coevo.eval exited with code 1")
    cmd = commands[0]
    assert f"data={tmp_path / 'clozes.jsonl'}" in cmd and "limit=null" in cmd and "ranker.mode=none" in cmd
    assert cmd.index("corpus=wiki_mini", cmd.index("mode=agent")) > cmd.index("mode=agent")  # after eval.yaml's keys
    assert learning.run_corpus([]) == ["corpus=vital_articles"]


def test_in_run_block_pools_the_mixed_clozes_apart_from_the_tasks(tmp_path):
    for arm, cloze_accuracy in (("trained", 2 / 3), ("control", 0.0)):
        run_dir = tmp_path / arm
        (run_dir / "tasks").mkdir(parents=True)
        for step in (0, 1, 2):  # step 2 unfinished: no metrics line
            task = {"accepted": True, "accuracy": 0.0, "reason": "accepted", "rollouts": [{}, {}]}
            cloze = {"kind": "extraction", "task_id": f"s{step}-x0", "accuracy": cloze_accuracy,
                     "rollouts": [{}, {}, {}, {"guided": True}]}  # 3 sampled, the guided replay left out
            (run_dir / "tasks" / f"step_{step}.jsonl").write_text(json.dumps(task) + "\n" + json.dumps(cloze) + "\n")
        (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    block = learning_stats.in_run_block({arm: {"run_dir": str(tmp_path / arm)} for arm in ("trained", "control")},
                                        steps=2, seed=0)
    assert (block["trained"]["right"], block["trained"]["sampled"]) == (0, 4)  # the tasks alone
    clozes = block["extraction"]
    assert (clozes["trained"]["right"], clozes["trained"]["sampled"], clozes["trained"]["tasks"]) == (4, 6, 2)
    assert (clozes["control"]["right"], clozes["control"]["sampled"]) == (0, 6)
    # [[4, 2], [0, 6]]: P(x) = C(6,x) C(6,4-x) / C(12,4); two-sided over the x at most as likely as x = 4
    probs = [math.comb(6, x) * math.comb(6, 4 - x) / math.comb(12, 4) for x in range(5)]
    assert clozes["fisher_p"] == pytest.approx(sum(p for p in probs if p <= probs[4] * (1 + 1e-9)))
