"""bench/guide_reach.py: which guided searches reach a gold-alias passage, on hand-made tasks and a toy corpus."""
from __future__ import annotations

import json

from bench import guide_reach


def _task(question: str, answers: list[str], heads: list[str], accepted: bool = True) -> dict:
    hops = [{"head": h, "tail": "x", "sentence": "", "passage_id": f"p-{h}"} for h in heads]
    return {"question": question, "answers": answers, "accepted": accepted, "evidence_path": {"hops": hops},
            "rollouts": [{"guided": False, "read_answer": True}, {"guided": True, "read_answer": False}]}


# Ranks worked out by hand over tests/conftest.py's PASSAGES (word-overlap scores, ties in corpus order):
TASKS = [
    # question: p0 "Paris is the capital of France." first (5 shared words); path "Alps": p5 only, no Paris
    _task("Which city is the capital of France?", ["Paris"], ["Alps"]),
    # question: p4 (the Rhine) first; path "Germany": p2 (Berlin) then p4, Rhine at rank 2
    _task("Which river flows through Germany?", ["Rhine"], ["Germany"]),
    # question: p5 (3 words), then the one-word ties p0 (Paris) ...: rank 2; path: its one head holds the answer
    _task("Who lives in the Alps?", ["Paris"], ["Paris"]),
]


def test_path_queries_keep_the_last_heads_that_fit_and_drop_those_holding_an_answer():
    rec = _task("q?", ["Paris"], ["Europe", "Paris", "France", "Lyon"])
    assert guide_reach.path_queries(rec, 2) == ["France", "Lyon"]
    assert guide_reach.path_queries(rec, 5) == ["Europe", "France", "Lyon"]
    assert guide_reach.path_queries(rec, 0) == []
    assert guide_reach.path_queries({"answers": ["x"]}, 2) == []  # no path: no search


def test_reach_counts_tasks_by_the_best_rank_of_a_gold_alias_passage(overlap_retriever):
    retriever = overlap_retriever()
    path = [guide_reach.path_queries(t, 2) for t in TASKS]
    assert guide_reach.reach(TASKS, path, retriever, retriever.corpus, [1, 2]) == {"1": 0, "2": 1}
    question = [[t["question"]] for t in TASKS]
    assert guide_reach.reach(TASKS, question, retriever, retriever.corpus, [1, 2]) == {"1": 2, "2": 3}
    assert guide_reach.reach(TASKS, [[], [], []], retriever, retriever.corpus, [1]) == {"1": 0}


def test_accepted_tasks_reads_the_dumps_in_step_order(tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "step_10.jsonl").write_text(json.dumps(TASKS[2]) + "\n")
    (tasks / "step_2.jsonl").write_text("".join(json.dumps(t) + "\n" for t in
                                                [TASKS[0], _task("no?", ["x"], [], accepted=False)]))
    assert [t["question"] for t in guide_reach.accepted_tasks(tmp_path)] == [TASKS[0]["question"],
                                                                            TASKS[2]["question"]]
    assert guide_reach.main([str(tmp_path / "missing")]) == 2
    assert "no step_<n>.jsonl task dump" in capsys.readouterr().err
