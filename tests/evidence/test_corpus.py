"""Corpus loading: formats, presets, and errors that name file and line."""
import gzip
import json

import pytest

from evidence.corpus import CorpusError, load_corpus


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_and_flashrag_formats(tmp_path):
    p = _write(tmp_path / "c.jsonl", [
        json.dumps({"id": "a", "title": "Alpha", "text": "Alpha is first."}),
        json.dumps({"id": 7, "contents": '"Beta"\nBeta is second.'}),
    ])
    c = load_corpus(p)
    assert len(c) == 2 and [x.id for x in c] == ["a", "7"]
    assert c["7"].title == "Beta" and c["7"].text == "Beta is second."
    assert "a" in c and "zzz" not in c
    with pytest.raises(KeyError, match="zzz"):
        c["zzz"]


def test_gzip_and_hash_changes_with_content(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps({"id": "a", "title": "T", "text": "x"}) + "\n")
    h1 = load_corpus(p).content_hash
    with gzip.open(p, "wt") as f:
        f.write(json.dumps({"id": "a", "title": "T", "text": "y"}) + "\n")
    assert load_corpus(p).content_hash != h1


def test_malformed_line_names_file_and_line(tmp_path):
    p = _write(tmp_path / "bad.jsonl", [json.dumps({"id": "a", "text": "ok"}), "{not json"])
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: malformed JSON"):
        load_corpus(p)


def test_missing_keys_and_duplicates(tmp_path):
    with pytest.raises(CorpusError, match=r":1: missing key 'id'"):
        load_corpus(_write(tmp_path / "a.jsonl", [json.dumps({"text": "x"})]))
    with pytest.raises(CorpusError, match=r":1: expected key 'text'"):
        load_corpus(_write(tmp_path / "b.jsonl", [json.dumps({"id": "x"})]))
    with pytest.raises(CorpusError, match="duplicate passage id 'x'"):
        load_corpus(_write(tmp_path / "c.jsonl", [json.dumps({"id": "x", "text": "1"})] * 2))
    with pytest.raises(CorpusError, match="neither a preset"):
        load_corpus(tmp_path / "nope.jsonl")


def test_presets(shared_data, monkeypatch):
    monkeypatch.setenv("COEVO_SHARED_DATA", str(shared_data))
    va = load_corpus("vital_articles")
    assert len(va) > 10_000 and all(p.text for p in list(va)[:50])
    wm = load_corpus("wiki_mini")
    assert len(wm) == 14_308 and wm["p0"].title == "George Rankin"


@pytest.mark.parametrize("record,message", [
    ({"id": None, "text": "x"}, r"'id' must be a string or an integer, got null"),
    ({"id": "", "text": "x"}, r"'id' must not be empty"),
    ({"id": [1], "text": "x"}, r"'id' must be a string or an integer, got list"),
    ({"id": "b", "title": None, "text": "x"}, r"'title' and 'text' must be strings, got NoneType and str"),
    ({"id": "b", "text": 5}, r"'title' and 'text' must be strings, got str and int"),
    ({"id": "b", "contents": ["x"]}, r"'contents' must be a string, got list"),
    ("just a string", r"expected a JSON object, got str"),
])
def test_bad_records_name_file_and_line(tmp_path, record, message):
    p = _write(tmp_path / "c.jsonl", [json.dumps({"id": "a", "text": "ok"}), json.dumps(record)])
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: " + message):
        load_corpus(p)


def test_duplicate_ids_name_both_lines(tmp_path):
    p = _write(tmp_path / "c.jsonl", [json.dumps({"id": "x", "text": "1"}), json.dumps({"id": "y", "text": "2"}),
                                      json.dumps({"id": "x", "text": "3"})])
    with pytest.raises(CorpusError, match=r"c\.jsonl:3: duplicate passage id 'x' \(first at line 1\)"):
        load_corpus(p)
    # 7 and "7" are the same id once loaded.
    _write(p, [json.dumps({"id": 7, "text": "1"}), json.dumps({"id": "7", "text": "2"})])
    with pytest.raises(CorpusError, match=r":2: duplicate passage id '7'"):
        load_corpus(p)


def test_undecodable_bytes_and_empty_files(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "caf\xe9"}\n')
    with pytest.raises(CorpusError, match=r"c\.jsonl:2: not UTF-8 text"):
        load_corpus(p)
    p.write_text("\n\n")
    with pytest.raises(CorpusError, match=r"c\.jsonl: holds no passages"):
        load_corpus(p)
    _write(p, [json.dumps({"id": "a", "text": "  "}), json.dumps({"id": "b", "contents": '"Title only"'})])
    with pytest.raises(CorpusError, match=r"c\.jsonl: holds no passages \(2 with an empty text\)"):
        load_corpus(p)


def test_empty_texts_are_skipped_and_long_ones_cut_both_counted(tmp_path, caplog):
    from evidence.corpus import MAX_PASSAGE_CHARS

    long_text = "word " * (MAX_PASSAGE_CHARS // 5 + 10)
    p = _write(tmp_path / "c.jsonl", [
        json.dumps({"id": "a", "text": "kept"}),
        json.dumps({"id": "b", "text": ""}),
        json.dumps({"id": "c", "title": "Long", "text": long_text}),
        json.dumps({"id": "d", "text": " \n "}),
    ])
    with caplog.at_level("WARNING", logger="coevo.inputs"):
        c = load_corpus(p)
    assert [x.id for x in c] == ["a", "c"] and len(c["c"].text) == MAX_PASSAGE_CHARS
    assert c["c"].text == long_text[:MAX_PASSAGE_CHARS]
    assert c.report.summary() == {"records": 2, "truncated": 1, "skipped_empty": 2}
    assert (c.report.first_truncated, c.report.first_skipped) == (f"{p}:3", f"{p}:2")
    assert caplog.messages == [f"corpus {p}: cut 1 to {MAX_PASSAGE_CHARS} characters (first at {p}:3); "
                               f"skipped 2 with an empty text (first at {p}:2)"]


def test_a_clean_file_logs_nothing(tmp_path, caplog):
    p = _write(tmp_path / "c.jsonl", [json.dumps({"id": "a", "text": "x"})])
    with caplog.at_level("WARNING", logger="coevo.inputs"):
        assert load_corpus(p).report.summary() == {"records": 1, "truncated": 0, "skipped_empty": 0}
    assert caplog.messages == []
