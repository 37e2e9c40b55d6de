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
