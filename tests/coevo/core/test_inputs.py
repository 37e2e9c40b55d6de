"""The validated question loaders: every bad input refused naming file and line, cuts counted."""
import gzip
import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.core.inputs import (
    MAX_QUESTION_CHARS,
    InputError,
    LabelledQuestion,
    load_labelled_questions,
    load_reference_questions,
)

GOOD = {"id": "q1", "question": "Who?", "answers": ["A"]}


def _write(path, *lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _jsonl(path, *records):
    return _write(path, *(json.dumps(r) for r in records))


def test_labelled_questions_load_with_defaults(tmp_path):
    path = _jsonl(tmp_path / "dev.jsonl", GOOD,
                  {"question": "Where?", "answer": "B", "gold_ids": ["p1", 7], "dataset": "nq"},
                  {"id": 12, "question": "When?", "answers": ["1990", "in 1990"], "extra": {"hops": []}})
    questions, report = load_labelled_questions(path)
    assert questions == [
        LabelledQuestion("q1", "Who?", ["A"], [], "dev", 1),
        LabelledQuestion("nq-2", "Where?", ["B"], ["p1", "7"], "nq", 2),
        LabelledQuestion("12", "When?", ["1990", "in 1990"], [], "dev", 3),
    ]
    assert (report.records, report.truncated) == (3, 0)


@pytest.mark.parametrize("record,message", [
    ({"question": "Q", "answers": 123}, r"'answers' must be a non-empty list of strings .*got int 123"),
    ({"question": "Q", "answers": []}, r"'answers' must be a non-empty list"),
    ({"question": "Q", "answers": ["a", 5]}, r"every answer must be a non-empty string, got int 5"),
    ({"question": "Q", "answers": [""]}, r"every answer must be a non-empty string"),
    ({"question": "Q", "answers": ["a"], "gold_ids": "p1"}, r"'gold_ids' must be a list of passage ids, got str 'p1'"),
    ({"question": "Q", "answers": ["a"], "gold_ids": [None]}, r"each of 'gold_ids' must be a passage id"),
    ({"id": None, "question": "Q", "answers": ["a"]}, r"'id' must be a string or an integer, got null"),
    ({"id": "", "question": "Q", "answers": ["a"]}, r"'id' must not be empty"),
    ({"id": True, "question": "Q", "answers": ["a"]}, r"'id' must be a string or an integer, got bool"),
    ({"id": 1.5, "question": "Q", "answers": ["a"]}, r"'id' must be a string or an integer, got float"),
    ({"question": 42, "answers": ["a"]}, r"'question' must be a non-empty string, got int 42"),
    ({"question": "  ", "answers": ["a"]}, r"'question' must be a non-empty string"),
    ({"answers": ["a"]}, r"missing key 'question'"),
    ({"question": "Q"}, r"missing key 'answers' \(or 'answer'\)"),
    ({"question": "Q", "answers": ["a"], "dataset": None}, r"'dataset' must be a non-empty string, got null"),
    (["not", "an", "object"], r"expected a JSON object, got list"),
])
def test_labelled_questions_refuse_bad_records_naming_file_and_line(tmp_path, record, message):
    path = _jsonl(tmp_path / "q.jsonl", GOOD, record)
    with pytest.raises(InputError, match=r"q\.jsonl:2: " + message):
        load_labelled_questions(path)


def test_labelled_questions_file_level_errors(tmp_path):
    path = _jsonl(tmp_path / "q.jsonl", GOOD, {"id": "x", "question": "Q", "answers": ["a"]}, GOOD)
    with pytest.raises(InputError, match=r"q\.jsonl:3: duplicate question id 'q1' \(first at line 1\)"):
        load_labelled_questions(path)
    # An integer id and the same digits as a string are one id.
    _jsonl(path, {"id": 5, "question": "Q", "answers": ["a"]}, {"id": "5", "question": "Q", "answers": ["a"]})
    with pytest.raises(InputError, match=r":2: duplicate question id '5'"):
        load_labelled_questions(path)
    _write(path, json.dumps(GOOD), '{"question": "Q", "answers": ["a"],}')
    with pytest.raises(InputError, match=r"q\.jsonl:2: malformed JSON"):
        load_labelled_questions(path)
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"question": "caf\xe9", "answers": ["a"]}\n')
    with pytest.raises(InputError, match=r"q\.jsonl:2: not UTF-8 text"):
        load_labelled_questions(path)
    _write(path, "", "  ")
    with pytest.raises(InputError, match=r"q\.jsonl: holds no questions"):
        load_labelled_questions(path)
    with pytest.raises(InputError, match="does not exist"):
        load_labelled_questions(tmp_path / "missing.jsonl")
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(json.dumps(GOOD).encode() + b"\n")[:-6])  # truncated stream
    with pytest.raises(InputError, match=r"t\.jsonl\.gz: cannot read labelled questions"):
        load_labelled_questions(gz)


def test_over_long_questions_are_cut_counted_and_logged(tmp_path, caplog):
    long_q = "why " * 1000  # 4000 characters
    path = _jsonl(tmp_path / "q.jsonl", GOOD, {"question": long_q, "answers": ["a"]},
                  {"question": long_q, "answers": ["b"]})
    with caplog.at_level(logging.WARNING, logger="coevo.inputs"):
        questions, report = load_labelled_questions(path)
    assert [len(q.question) for q in questions] == [4, MAX_QUESTION_CHARS, MAX_QUESTION_CHARS]
    assert questions[1].question == long_q[:MAX_QUESTION_CHARS]
    assert (report.truncated, report.first_truncated) == (2, f"{path}:2")
    assert report.summary() == {"records": 3, "truncated": 2, "skipped_empty": 0}
    assert caplog.messages == [f"labelled questions {path}: cut 2 to {MAX_QUESTION_CHARS} characters "
                               f"(first at {path}:2)"]


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=0),
                 st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=0)), min_size=1, max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)))
def test_property_any_malformed_answers_value_is_refused_at_its_line(tmp_path_factory, answers):
    path = tmp_path_factory.mktemp("p") / "q.jsonl"
    _jsonl(path, GOOD, GOOD | {"id": "x"}, {"question": "Q", "answers": answers})
    with pytest.raises(InputError, match=r"q\.jsonl:3: .*answer"):
        load_labelled_questions(path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=30).filter(str.strip),
                          st.lists(st.text(min_size=1, max_size=10).filter(str.strip), min_size=1, max_size=3)),
                min_size=1, max_size=8))
def test_property_valid_records_round_trip(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("p") / "q.jsonl"
    _jsonl(path, *({"id": f"i{n}", "question": q, "answers": a} for n, (q, a) in enumerate(rows)))
    questions, _ = load_labelled_questions(path)
    assert [(q.id, q.question, q.answers, q.line) for q in questions] == \
        [(f"i{n}", q, a, n + 1) for n, (q, a) in enumerate(rows)]


# ---- reference questions --------------------------------------------------------------------

def test_reference_questions_text_and_jsonl(tmp_path):
    assert len(load_reference_questions()[0]) >= 50  # the bundled set
    txt = _write(tmp_path / "r.txt", "who is a?", "", "  what is b?  ")
    assert load_reference_questions(txt)[0] == ["who is a?", "what is b?"]
    jl = _jsonl(tmp_path / "r.jsonl", {"question": "x?", "answers": ["ignored"]}, {"question": "y?"})
    assert load_reference_questions(jl)[0] == ["x?", "y?"]
    # A .txt whose first line is an object is JSONL; its format is decided once per file.
    mixed = _write(tmp_path / "m.txt", json.dumps({"question": "x?"}), "plain text line")
    with pytest.raises(InputError, match=r"m\.txt:2: malformed JSON"):
        load_reference_questions(mixed)


@pytest.mark.parametrize("line,message", [
    (json.dumps({"q": 1}), "expected an object with a string 'question', got null"),
    (json.dumps({"question": 5}), "expected an object with a string 'question', got int 5"),
    (json.dumps(["x"]), "expected an object with a string 'question', got list"),
    (json.dumps({"question": "   "}), "empty question"),
])
def test_reference_questions_refuse_bad_lines(tmp_path, line, message):
    path = _write(tmp_path / "r.jsonl", json.dumps({"question": "ok?"}), line)
    with pytest.raises(InputError, match=r"r\.jsonl:2: " + message):
        load_reference_questions(path)


def test_reference_questions_bytes_empty_file_and_limit(tmp_path, caplog):
    bad = tmp_path / "r.txt"
    bad.write_bytes(b"fine?\n\xff\xfe broken\n")
    with pytest.raises(InputError, match=r"r\.txt:2: not UTF-8 text"):
        load_reference_questions(bad)
    empty = _write(tmp_path / "e.txt", "", "")
    with pytest.raises(InputError, match="holds no reference questions"):
        load_reference_questions(empty)
    with pytest.raises(InputError, match="does not exist"):
        load_reference_questions(tmp_path / "nope.txt")
    huge = _write(tmp_path / "h.txt", "short?", "x" * 1_250_000)  # the 1.25 MB question of the issue
    with caplog.at_level(logging.WARNING, logger="coevo.inputs"):
        questions, report = load_reference_questions(huge)
    assert [len(q) for q in questions] == [6, MAX_QUESTION_CHARS]
    assert (report.records, report.truncated, report.first_truncated) == (2, 1, f"{huge}:2")
    assert "reference questions" in caplog.text and "cut 1 to 1000 characters" in caplog.text
