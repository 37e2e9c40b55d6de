"""Lazy entity annotation (evidence/lazy_entities.py) and its on-disk store (evidence/annotation_store.py)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from coevo.core.config import EvidenceConfig
from evidence.annotation_store import AnnotationStore, AnnotationStoreError, decode_record, encode_record
from evidence.corpus import Corpus, load_corpus, shared_data_dir
from evidence.entities import build_entity_index
from evidence.lazy_entities import LazyEntityIndex, open_lazy_index, sample_corpus, stats_entry_path
from evidence.paths import build_evidence_paths
from evidence.pipeline import EvidencePipeline
from evidence.retrieval import build_retriever

RECORD = ("hank snow", [[0, 9, [[0, 9, "PERSON", "hank snow"]], [3]], [10, 20, [], []]])


def _records(indexes) -> dict:
    return {i: (f"title {i}", [[0, 5, [[0, 5, "PERSON", f"key {i}"]], [1, 2]]]) for i in indexes}


def test_records_round_trip_and_junk_is_named(tmp_path):
    assert decode_record(encode_record(RECORD), "x") == ("hank snow", [list(s) for s in RECORD[1]])
    for junk in ["", "{}", "[1, []]", '["t", [[0]]]', '["t", [[0, 1, [[0, 1, 2, "k"]], []]]]', "[\"t\", 5]"]:
        with pytest.raises(AnnotationStoreError, match="where-it-was"):
            decode_record(junk, "where-it-was")
    store = AnnotationStore(tmp_path / "s", {"corpus": "toy"}, block=10)
    store.put(_records(range(25)))
    expected = {i: decode_record(encode_record(r), "") for i, r in _records([3, 17, 24]).items()}
    assert store.get([3, 17, 24, 99]) == expected
    assert store.count() == 25 and len(list((tmp_path / "s").glob("block-*.sqlite"))) == 3
    store.put({3: ("another", [])})  # a second writer of a stored passage changes nothing
    assert store.get([3])[3][0] == "title 3"
    with sqlite3.connect(tmp_path / "s" / "block-000001.sqlite") as conn:
        conn.execute("UPDATE ann SET rec = 'not json' WHERE p = 12")
    with pytest.raises(AnnotationStoreError, match=r"block-000001\.sqlite: passage index 12"):
        AnnotationStore(tmp_path / "s", {}, block=10).get([12])
    (tmp_path / "s" / "block-000009.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(AnnotationStoreError, match=r"block-000009\.sqlite: not an annotation store"):
        AnnotationStore(tmp_path / "s", {}, block=10).get([95])


def _writer(root: str, start: int, stop: int) -> None:
    store = AnnotationStore(root, {}, block=50)
    for i in range(start, stop, 7):  # many small transactions, interleaved with the other writer's
        store.put(_records(range(i, min(i + 7, stop))))


def _endless_writer(root: str) -> None:
    store = AnnotationStore(root, {}, block=1_000_000)
    i = 0
    while True:
        store.put(_records(range(i, i + 50)))
        i += 50


def test_processes_share_the_store_and_a_killed_writer_corrupts_nothing(tmp_path):
    root = str(tmp_path / "s")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(root, 0, 300)), ctx.Process(target=_writer, args=(root, 150, 450))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = AnnotationStore(root, {}, block=50)
    assert store.count() == 450 and store.get(range(450)) == {
        i: decode_record(encode_record(r), "") for i, r in _records(range(450)).items()}

    killed = ctx.Process(target=_endless_writer, args=(str(tmp_path / "k"),))
    killed.start()
    deadline = time.monotonic() + 60
    while not list((tmp_path / "k").glob("block-*.sqlite")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # mid-transaction, most likely
    os.kill(killed.pid, signal.SIGKILL)
    killed.join(30)
    after = AnnotationStore(tmp_path / "k", {})
    n = after.count()
    assert n > 0 and n % 50 == 0  # whole transactions only
    assert len(after.get(range(n))) == n
    after.put(_records(range(n, n + 5)))  # and it still takes writes
    assert after.count() == n + 5


def test_the_sample_is_seeded_uniform_and_the_corpus_itself_when_smaller(toy_corpus):
    assert sample_corpus(toy_corpus, 12) is toy_corpus and sample_corpus(toy_corpus, 100) is toy_corpus
    a, b = sample_corpus(toy_corpus, 5), sample_corpus(toy_corpus, 5)
    assert [p.id for p in a] == [p.id for p in b] and len(a) == 5
    assert [toy_corpus.index_of(p.id) for p in a] == sorted(toy_corpus.index_of(p.id) for p in a)
    assert a.content_hash == b.content_hash != toy_corpus.content_hash
    with pytest.raises(ValueError, match="evidence.stats_sample"):
        sample_corpus(toy_corpus, 0)


@pytest.mark.slow
def test_lazy_index_answers_as_the_eager_one_on_the_toy_corpus(toy_corpus, toy_index, toy_retriever, tmp_path):
    cache = str(Path(toy_index.path).parent)  # the eager entry is the whole-corpus sample's: loaded, not rebuilt
    lazy = open_lazy_index(toy_corpus, stats_sample=100, cache_dir=cache)
    lazy.store = AnnotationStore(tmp_path / "store", {})  # a fresh store: every passage is annotated here
    assert lazy.stats is not toy_index and lazy.stats.from_cache and lazy.scale == 1.0
    names = [p.title for p in toy_corpus] + ["the Danube", "hank snow", "Nowhere", "", "1949", "capital"]
    for name in names:
        assert lazy.passage_for_title(name) == toy_index.passage_for_title(name), name
        assert lazy.document_frequency(name) == toy_index.document_frequency(name), name
        assert lazy.entity_label(name) == toy_index.entity_label(name), name
        assert (name in lazy) == (name in toy_index), name
    for target in ["Tennessee", "Poland", "Sweden", "Paris", "Nashville"]:
        assert build_evidence_paths(target, toy_retriever, lazy, rng=3) == \
            build_evidence_paths(target, toy_retriever, toy_index, rng=3), target
    assert 0 < lazy.annotated == lazy.store.count() <= len(toy_corpus)
    for p in toy_corpus:
        if lazy.store.get([toy_corpus.index_of(p.id)]):
            assert lazy.annotation(p.id) == toy_index.annotation(p.id)
    assert lazy.annotation("nope") is None and lazy.annotation(None) is None  # type: ignore[arg-type]


@pytest.mark.slow
def test_statistics_of_a_sample_scale_to_the_corpus(toy_corpus, tmp_path):
    lazy = open_lazy_index(toy_corpus, stats_sample=6, cache_dir=str(tmp_path))
    sample = sample_corpus(toy_corpus, 6)
    assert list(lazy.stats.corpus) == list(sample) and lazy.scale == 2.0
    assert Path(lazy.stats.path) == stats_entry_path(toy_corpus, None, 6, str(tmp_path))
    for key in ["capital", "Marie Curie", "Sweden", "Hank Snow", "Atlantis"]:
        assert lazy.document_frequency(key) == 2 * lazy.stats.document_frequency(key)
    assert lazy.passage_for_title("Vienna") == "t10"  # titles cover the whole corpus, sampled or not


def _wiki_subset() -> tuple[Corpus, list[str]]:
    """~200 wiki_mini passages: the MuSiQue/HotpotQA gold passages of 30 dev questions and their answers."""
    from coevo.core.inputs import load_labelled_questions

    full = load_corpus("wiki_mini")
    questions, _ = load_labelled_questions(shared_data_dir() / "wiki_mini" / "questions_dev.jsonl")
    multi = [q for q in questions if len(q.gold_ids) >= 2][:30]
    keep = {pid for q in multi for pid in q.gold_ids}
    for p in full:  # neighbours in corpus order: distractors
        if len(keep) >= 200:
            break
        keep.add(p.id)
    return Corpus([p for p in full if p.id in keep], name="wiki_mini_lazy"), [q.answers[0] for q in multi]


@pytest.mark.slow
def test_lazy_and_eager_annotation_give_the_same_paths_on_wiki_mini(tmp_path):
    if not (shared_data_dir() / "wiki_mini" / "corpus.jsonl.gz").exists():
        pytest.skip("shared data not found (set COEVO_SHARED_DATA)")
    corpus, targets = _wiki_subset()
    cache = str(tmp_path / "entities")
    eager = build_entity_index(corpus, cache_dir=cache)
    retriever = build_retriever(corpus, "bm25s", cache_dir=str(tmp_path / "bm25"))
    cfg = EvidenceConfig(annotation="lazy", stats_sample=len(corpus), retrieve_k=5)
    lazy = EvidencePipeline.from_config(corpus, retriever, cfg, cache_dir=cache).index
    assert isinstance(lazy, LazyEntityIndex) and lazy.stats.path == eager.path  # exact statistics
    eager_paths = [build_evidence_paths(t, retriever, eager, rng=i, retrieve_k=5) for i, t in enumerate(targets)]
    lazy_paths = [build_evidence_paths(t, retriever, lazy, rng=i, retrieve_k=5) for i, t in enumerate(targets)]
    assert lazy_paths == eager_paths
    assert sum(len(p) for p in eager_paths) >= 10  # the comparison covers real paths
    assert 0 < lazy.annotated < len(corpus)  # only reached passages were annotated
    again = open_lazy_index(corpus, stats_sample=len(corpus), cache_dir=cache)  # another process, same machine
    assert [build_evidence_paths(t, retriever, again, rng=i, retrieve_k=5) for i, t in enumerate(targets)] == \
        eager_paths and again.annotated == 0  # every passage came from the store
