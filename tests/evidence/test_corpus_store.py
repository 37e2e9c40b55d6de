"""The packed, memory-mapped corpus store: same passages, ids and hash as `load_corpus`, one copy per machine."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from coevo.core.config import compose, to_object
from evidence import build_index
from evidence.corpus import Corpus, CorpusError, load_corpus
from evidence.corpus_store import MappedCorpus, open_corpus, open_store, store_path, stored_meta
from evidence.retrieval import build_retriever

ROWS = [{"id": 7, "title": "Zürich", "text": "Zürich is a city on the Limmat. ☃"},
        {"id": "b", "title": "Blank", "text": "   "},  # skipped and counted, as load_corpus does
        {"id": "c", "contents": '"Cologne"\nCologne lies on the Rhine.'},  # FlashRAG / Search-R1 format
        {"id": "d", "title": "", "text": "A passage without a title, about the Rhine."}]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ROWS), encoding="utf-8")
    return path


def _same(mapped: Corpus, loaded: Corpus) -> None:
    assert (mapped.name, mapped.source, len(mapped)) == (loaded.name, loaded.source, len(loaded))
    assert list(mapped) == list(loaded) and mapped.passages[1:3] == loaded.passages[1:3]
    assert mapped.passages[-1] == loaded.passages[-1] and mapped.content_hash == loaded.content_hash
    for i, p in enumerate(loaded):
        assert mapped.index_of(p.id) == i and mapped[p.id] == p and p.id in mapped


def test_the_store_holds_what_load_corpus_loads(small, cache):
    mapped = open_store(str(small))
    assert isinstance(mapped, MappedCorpus) and not mapped.from_cache
    _same(mapped, load_corpus(small))
    assert [p.id for p in mapped] == ["7", "c", "d"] and mapped["c"].title == "Cologne"
    assert "b" not in mapped and 7 not in mapped and "7" in mapped
    with pytest.raises(KeyError, match="passage id 'b' is not in corpus 'small'"):
        mapped["b"]
    with pytest.raises(IndexError):
        mapped.passages[3]
    assert stored_meta(str(small))["report"] == {"records": 3, "truncated": 0, "skipped_empty": 1}
    assert isinstance(mapped._blob, np.memmap) and not isinstance(mapped.passages, list)


@pytest.mark.slow
def test_wiki_mini_mapped_equals_loaded(cache):
    _same(open_store("wiki_mini"), load_corpus("wiki_mini"))


def test_an_entry_is_reused_and_an_edited_file_gets_a_new_one(small, cache):
    first = open_store(str(small))
    again = open_store(str(small))
    assert again.from_cache and again.entry == first.entry
    with open(small, "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "e", "title": "E", "text": "epsilon"}) + "\n")
    os.utime(small, ns=(first.entry.stat().st_mtime_ns, first.entry.stat().st_mtime_ns + 10**9))
    edited = open_store(str(small))
    assert not edited.from_cache and edited.entry != first.entry and edited["e"].text == "epsilon"
    assert [p.id for p in first] == ["7", "c", "d"]  # the old entry is untouched
    assert store_path(small) == edited.entry


def test_a_pickled_store_reopens_its_files_instead_of_copying_them(small, cache):
    mapped = open_store(str(small))
    data = pickle.dumps(mapped)
    assert len(data) < 400 and b"Limmat" not in data
    back = pickle.loads(data)
    assert list(back) == list(mapped) and back.content_hash == mapped.content_hash


def test_bad_files_fail_naming_the_file_and_leave_no_entry(tmp_path, cache):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": 1, "text": " "}) + "\n")
    with pytest.raises(CorpusError, match=f"{empty}: holds no passages \\(1 with an empty text\\)"):
        open_store(str(empty))
    assert stored_meta(str(empty)) is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": 1, "text": "a"}) + "\n{not json\n")
    with pytest.raises(CorpusError, match=f"{bad}:2"):
        open_store(str(bad))
    with pytest.raises(CorpusError, match="neither a preset"):
        open_store(str(tmp_path / "missing.jsonl"))


def test_corpus_jsonl_maps_by_default_and_retrieval_gives_the_same_hits(small, cache, tmp_path):
    cfg = to_object(compose(["corpus=jsonl", f"corpus.path={small}"]))
    assert cfg.corpus.mmap is True
    mapped = open_corpus(cfg.corpus)
    assert isinstance(mapped, MappedCorpus)
    assert type(open_corpus(to_object(compose(["corpus.mmap=true"])).corpus)) is Corpus  # vital_articles: loaded
    loaded = load_corpus(small)
    a = build_retriever(mapped, "bm25s", cache_dir=str(tmp_path / "idx")).search(["Rhine city"], 3)
    b = build_retriever(loaded, "bm25s", cache_dir=str(tmp_path / "idx"))  # same content hash: the same entry
    assert b.from_cache and b.search(["Rhine city"], 3) == a and a[0]


def test_the_start_check_reads_the_stores_size_instead_of_the_file(small, cache, monkeypatch):
    cfg = to_object(compose(["corpus=jsonl", f"corpus.path={small}", "evidence.build_in_run_max_passages=1"]))
    with pytest.raises(build_index.IndexNotBuilt, match="the memory-mapped corpus store at "):
        build_index.check_prebuilt(cfg)
    open_store(str(small))

    def no_streaming(source):  # noqa: ANN001
        raise AssertionError("the file was read again")

    monkeypatch.setattr(build_index, "digest_corpus", no_streaming)
    with pytest.raises(build_index.IndexNotBuilt) as err:
        build_index.check_prebuilt(cfg)
    assert "has 3 passages" in str(err.value) and "corpus store" not in str(err.value)
