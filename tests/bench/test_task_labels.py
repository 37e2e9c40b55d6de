"""bench/task_labels.py: the labelling dump of a run, and each check's precision and recall on hand labels."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import task_labels
from coevo.core.inputs import load_labelled_questions
from coevo.core.types import EvidencePath, Hop


def _path(target: str, head: str, sentence: str, title: str = "") -> dict:
    """One hop from `head` to `target`, its sentence on the page `title` (default: the target's own)."""
    hop = Hop(head=head, tail=target, sentence=sentence, passage_id=f"p-{head}", title=title or target, score=1.0,
              cue="relation")
    return EvidencePath(target, (hop,)).to_record()


GATES = _path("Microsoft", "Bill Gates", "Bill Gates co-founded Microsoft in 1975.")
# (question, target, path, label) with what each check finds, worked out by hand:
ROWS = [
    ("Who was Bill Gates?", "Microsoft", GATES, "false"),  # asks_about_head
    ("What is the capital of Australia?", "Tasmania",
     _path("Tasmania", "Australia", "Tasmania is an island state of Australia."), "false"),  # unsupported: capital
    ("What is the answer to the question: what did Bill Gates found?", "Microsoft", GATES,
     "false"),  # meta_question; unsupported: answer, question
    ("What is the largest moon in the Solar System?", "Mercury",
     _path("Mercury", "Titan", "Titan, the largest moon in the Solar System after Ganymede, is larger than Mercury.",
           "Titan (moon)"), "false"),  # off_target_page only: every word is on the path
    ("What is the capital of France?", "Paris", _path("Paris", "France", "Paris is the capital of France."), "true"),
    ("Who wrote the play Hamlet?", "William Shakespeare",
     _path("William Shakespeare", "Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
     "true"),  # unsupported: play (a true task rejected)
    ("Where was Marie Curie raised?", "Poland",
     _path("Poland", "Marie Curie", "Marie Curie was born in Warsaw, Poland."), "loose"),  # unsupported: raised
    ("Who was Bill Gates?", "Microsoft", GATES, None),  # not labelled yet: in no figure
]


def _write_labels(tmp_path: Path) -> Path:
    f = tmp_path / "labels.jsonl"
    f.write_text("".join(json.dumps({"id": f"s0-{i}", "step": 0, "question": q, "target": t, "path": p, "label": lab})
                         + "\n" for i, (q, t, p, lab) in enumerate(ROWS)))
    return f


def test_score_against_hand_computed_precision_and_recall(tmp_path, capsys):
    f = _write_labels(tmp_path)
    assert task_labels.main(["score", str(f), "--", "evidence.head_subject=true", "evidence.meta_wording=true"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["labelled"], out["true"], out["false"], out["loose"], out["unlabelled"]) == (7, 2, 4, 1, 1)
    assert out["f"] == {"strict": 0.2857, "loose": 0.4286}  # 2 of 7; (2 + 1) of 7
    checks = out["checks"]
    assert checks["meta_question"] == {"key": "evidence.meta_wording", "rejected": 1, "rejected_false": 1,
                                       "rejected_loose": 0, "precision": 1.0, "recall": 0.25}
    assert checks["asks_about_head"] == {"key": "evidence.head_subject", "rejected": 1, "rejected_false": 1,
                                         "rejected_loose": 0, "precision": 1.0, "recall": 0.25}
    # rows 2, 3, 6, 7: two false of four rejected; two of the four false
    assert checks["unsupported_relation"] == {"key": "evidence.relation_support", "rejected": 4, "rejected_false": 2,
                                              "rejected_loose": 1, "precision": 0.5, "recall": 0.5}
    assert checks["off_target_page"] == {"key": "evidence.target_page", "rejected": 1, "rejected_false": 1,
                                         "rejected_loose": 0, "precision": 1.0, "recall": 0.25}
    assert checks["any"] == {"key": "all checks", "rejected": 6, "rejected_false": 4, "rejected_loose": 1,
                             "precision": 0.6667, "recall": 1.0}
    # head and meta on: rows 2, 4, 5, 6, 7 kept; 2 true and 1 loose of 5
    assert out["in_force"] == {"keys": ["evidence.meta_wording", "evidence.head_subject"], "kept": 5,
                               "f": {"strict": 0.4, "loose": 0.6}}


def test_score_without_overrides_and_with_nothing_labelled():
    assert task_labels.score([])["f"] == {"strict": None, "loose": None}
    rows = [{"question": "Who was Bill Gates?", "target": "Microsoft", "path": GATES, "label": "true"}]
    result = task_labels.score(rows)
    assert result["in_force"] == {"keys": [], "kept": 1, "f": {"strict": 1.0, "loose": 1.0}}
    assert result["checks"]["asks_about_head"]["precision"] == 0.0 and result["checks"]["any"]["recall"] is None


def test_distinct_counts_a_repeated_task_once_with_its_lowest_label():
    rows = [{"question": q, "target": t, "label": lab} for q, t, lab in [
        ("What is the highest mountain in Africa?", "Mount Kilimanjaro", "true"),
        ("what is the highest mountain in Africa", "mount kilimanjaro", "true"),  # the same after normalization
        ("What is the highest mountain in Africa?", "Mount Kilimanjaro", "true"),
        ("What is the capital of France?", "Paris", "true"),
        ("What is the capital of France?", "Paris", "loose"),  # a doubt: the task counts as loose
        ("Who was Bill Gates?", "Microsoft", "false"),
    ]]
    out = task_labels.score(rows)
    assert out["f"] == {"strict": 0.6667, "loose": 0.8333}  # 4 of 6; 5 of 6 per row
    # three tasks: Kilimanjaro true, Paris loose, Microsoft false
    assert out["distinct"] == {"tasks": 3, "true": 1, "false": 1, "loose": 1,
                               "f": {"strict": 0.3333, "loose": 0.6667},
                               "top": [["what is highest mountain in africa", "mount kilimanjaro", 3],
                                       ["what is capital of france", "paris", 2]]}
    assert task_labels.score([])["distinct"] == {"tasks": 0, "true": 0, "false": 0, "loose": 0,
                                                 "f": {"strict": None, "loose": None}, "top": []}


def _record(task_id, question, accepted, path=GATES) -> dict:
    return {"task_id": task_id, "question": question, "target": "Microsoft", "answers": ["Microsoft"],
            "evidence_path": path, "accepted": accepted, "reason": "accepted" if accepted else "leaks_target"}


def test_dump_writes_every_accepted_task_in_step_order(tmp_path, capsys):
    tasks = tmp_path / "run" / "tasks"
    tasks.mkdir(parents=True)
    steps = {10: [_record("s10-0", "Who founded Microsoft?", True)],
             2: [_record(None, "Microsoft?", False), _record("s2-1", "Who was Bill Gates?", True),
                 {"kind": "extraction", "task_id": "s2-x0", "question": "Who ___?", "answers": ["A"]}]}
    for step, recs in steps.items():
        (tasks / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tasks / "step_x.jsonl").write_text("not json\n")  # no step: ignored
    out = tmp_path / "labels.jsonl"
    assert task_labels.main(["dump", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"tasks": 2, "out": str(out)}
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["id"], r["step"], r["question"]) for r in rows] == [("s2-1", 2, "Who was Bill Gates?"),
                                                                   ("s10-0", 10, "Who founded Microsoft?")]
    assert rows[0]["sentences"] == ["Microsoft: Bill Gates co-founded Microsoft in 1975."]
    assert rows[0]["path"] == GATES and rows[0]["label"] is None and rows[0]["target"] == "Microsoft"
    questions = tmp_path / "questions.jsonl"
    assert task_labels.main(["questions", str(tmp_path / "run"), "--out", str(questions)]) == 0
    assert json.loads(capsys.readouterr().out) == {"questions": 2, "out": str(questions)}
    assert [json.loads(x) for x in questions.read_text().splitlines()] == [
        {"id": task_id, "question": q, "answers": ["Microsoft"], "gold_ids": ["p-Bill Gates"], "dataset": "accepted"}
        for task_id, q in (("s2-1", "Who was Bill Gates?"), ("s10-0", "Who founded Microsoft?"))]
    assert [r.id for r in load_labelled_questions(questions)[0]] == ["s2-1", "s10-0"]  # the file coevo.eval reads


@pytest.mark.parametrize("argv, message", [
    (["dump", "RUN", "--out", "OUT"], "no step_<n>.jsonl task dump"),
    (["score", "LABELS"], "label must be one of"),
])
def test_bad_inputs_exit_2_with_the_reason(tmp_path, capsys, argv, message):
    (tmp_path / "RUN").mkdir()
    (tmp_path / "LABELS").write_text(json.dumps({"question": "Who?", "label": "yes"}) + "\n")
    assert task_labels.main([str(tmp_path / a) if a.isupper() else a for a in argv]) == 2
    assert message in capsys.readouterr().err


def _labels(path, rows) -> None:
    path.write_text("".join(json.dumps({"id": i, "question": "Q?", "label": lab, "note": n}) + "\n"
                            for i, lab, n in rows))


def test_merge_keeps_the_lower_label_and_counts_agreement(tmp_path, capsys):
    _labels(tmp_path / "a.jsonl", [("t1", "true", "x"), ("t2", "true", "y"), ("t3", "false", "z"), ("t4", "loose", "")])
    _labels(tmp_path / "b.jsonl", [("t4", "true", "w"), ("t3", "false", "v"), ("t2", "loose", "u"), ("t1", "true", "")])
    out = tmp_path / "merged.jsonl"
    assert task_labels.main(["merge", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "tasks": 4, "agree": 2, "pairs": {"false/false": 1, "loose/true": 1, "true/loose": 1, "true/true": 1},
        "out": str(out)}
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["id"], r["label"]) for r in rows] == [("t1", "true"), ("t2", "loose"), ("t3", "false"), ("t4", "loose")]
    assert rows[1]["note"] == "A: y; B: u"


@pytest.mark.parametrize("b_rows, message", [
    ([("t1", "true", ""), ("t9", "true", "")], "do not label the same tasks (e.g. t2, t9)"),
    ([("t1", "true", ""), ("t2", None, "")], "task 't2' is not labelled"),
    ([("t1", "true", ""), ("t1", "true", ""), ("t2", "true", "")], "task 't1' appears twice"),
])
def test_merge_refuses_files_that_do_not_pair(tmp_path, capsys, b_rows, message):
    _labels(tmp_path / "a.jsonl", [("t1", "true", ""), ("t2", "false", "")])
    _labels(tmp_path / "b.jsonl", b_rows)
    out = tmp_path / "merged.jsonl"
    assert task_labels.main(["merge", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--out", str(out)]) == 2
    assert message in capsys.readouterr().err and not out.exists()
