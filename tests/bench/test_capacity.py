"""bench/capacity.py's pure parts: what the solver read, echoed answers, per-dataset scores and the
denominator check, on hand-made coevo.eval predictions (no model is loaded)."""
import json

from bench import capacity


def _record(dataset, output, prediction, answers, em=0.0, f1=0.0, format_ok=True, queries=()):
    return {"dataset": dataset, "question": "What is George Rankin's occupation?", "answers": answers,
            "prediction": prediction, "em": em, "f1": f1, "cover_em": em, "format_ok": format_ok, "output": output,
            "retrievals": [{"sub_query": q} for q in queries]}


SEEN = ("<search>George Rankin</search>\n<information>Doc 1 (Title: George Rankin) George Rankin was an "
        "Australian politician.</information>\n<answer>politician</answer>")
UNSEEN = ("<search>George Rankin</search>\n<information>Doc 1 (Title: Rankin) A Scottish surname.</information>\n"
          "<answer>George Rankin</answer>")


def test_answer_observed_reads_only_the_information_blocks():
    assert capacity.answer_observed(_record("popqa", SEEN, "politician", ["politician", "pol"]))
    # the answer tag names the gold, but no block the solver read holds it
    told = UNSEEN.replace("George Rankin</answer>", "politician</answer>")
    assert not capacity.answer_observed(_record("popqa", told, "politician", ["politician"]))
    # token boundaries: "pol" is no match inside "politician"
    assert not capacity.answer_observed(_record("popqa", SEEN, "x", ["pol"]))
    assert not capacity.answer_observed({"output": None, "answers": None})


def test_cell_scores_by_hand():
    result = {"predictions": [
        _record("popqa", SEEN, "politician", ["politician"], em=1.0, f1=1.0, queries=["George Rankin"]),
        _record("popqa", UNSEEN, "George Rankin", ["politician"], queries=["George Rankin"]),  # echoes the question
        _record("musique", UNSEEN, "", ["Kyiv"], format_ok=False),
    ]}
    cell = capacity.cell_scores(result)
    assert cell["datasets"]["popqa"] == {"n": 2, "em": 0.5, "f1": 0.5, "cover_em": 0.5,
                                         "answer_in_observation": 0.5, "echo": 0.5}
    assert cell["datasets"]["musique"]["echo"] is None  # no well-formed answer to judge
    assert cell["average"]["n"] == 3 and cell["average"]["em"] == 0.25 and cell["average"]["echo"] == 0.5


def test_denominators_and_expected_questions(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"dataset": d}) + "\n" for d in ["a"] * 5 + ["b"] * 2))
    assert capacity.expected_questions(data, 3) == 5 and capacity.expected_questions(data, None) == 7
    ok = {"mode": "none", "searches": 1, "error": None, "expected": 5, "average": {"n": 5}}
    short = {**ok, "mode": "oracle", "average": {"n": 4}}
    assert capacity.failures([ok]) == []
    assert capacity.failures([ok, short]) == ["oracle-1: scored 4 of 5 questions"]
    assert capacity.failures([{**ok, "error": "boom"}]) == ["none-1: boom"]
