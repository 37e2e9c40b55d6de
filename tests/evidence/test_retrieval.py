"""Retrieval: backend parity, caching (shared by parallel builders), progress, empty queries."""
import logging
import multiprocessing
import os

import numpy as np
import pytest

from coevo.core.cache import is_complete
from evidence.corpus import Corpus, Passage
from evidence.retrieval import build_retriever, tokenize


@pytest.fixture()
def corpus(retrieval_corpus):
    return retrieval_corpus


def test_tokenize_drops_stopwords():
    assert tokenize("The capital of France!") == ["capital", "france"]


@pytest.mark.parametrize("query", ["capital of France", "river Germany", "Kubrick film 1968", "France"])
def test_bm25_backends_agree(corpus, tmp_path, query):
    a = build_retriever(corpus, "bm25s", cache_dir=str(tmp_path)).search([query], 4)[0]
    b = build_retriever(corpus, "rank_bm25").search([query], 4)[0]
    assert [h.passage_id for h in a] == [h.passage_id for h in b]
    assert [round(h.score, 4) for h in a] == [round(h.score, 4) for h in b]
    assert a and all(x.score >= y.score for x, y in zip(a, a[1:]))


def test_best_hit_and_batching(corpus, tmp_path):
    r = build_retriever(corpus, "bm25s", cache_dir=str(tmp_path))
    res = r.search(["Kubrick", "Danube Hungary", "", "   ", "the of a"], 2)
    assert res[0][0].passage_id == "d5" and res[1][0].passage_id == "d4"
    assert res[2] == [] and res[3] == [] and res[4] == []
    assert r.search(["France"], 0) == [[]]
    assert len(r.search(["France"], 100)[0]) == 3  # only passages that match


def test_cache_reuse_and_invalidation(corpus, tmp_path):
    first = build_retriever(corpus, "bm25s", cache_dir=str(tmp_path))
    assert not first.from_cache
    second = build_retriever(corpus, "bm25s", cache_dir=str(tmp_path))
    assert second.from_cache
    assert second.search(["capital"], 3) == first.search(["capital"], 3)
    # a cached index is mapped, not read into this process: the page cache holds one copy per machine
    assert all(isinstance(second.model.scores[k], np.memmap) for k in ("data", "indices", "indptr"))
    changed = Corpus([Passage("x", "X", "capital city")] + corpus.passages, name="toy2")
    assert not build_retriever(changed, "bm25s", cache_dir=str(tmp_path)).from_cache


def _build_in_child(corpus, cache_dir, out_dir):
    r = build_retriever(corpus, "bm25s", cache_dir=cache_dir)
    hits = r.search(["capital"], 3)[0]
    (out_dir / str(os.getpid())).write_text(f"{r.from_cache} {','.join(h.passage_id for h in hits)}")
    os._exit(0)


def test_parallel_builders_share_one_build(corpus, tmp_path):
    ctx = multiprocessing.get_context("fork")  # the worker is a function of this module (importlib mode)
    out = tmp_path / "out"
    out.mkdir()
    procs = [ctx.Process(target=_build_in_child, args=(corpus, str(tmp_path / "idx"), out)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    results = sorted(f.read_text() for f in out.iterdir())
    # "capital" is in d0 and d2; the shorter d2 scores higher under BM25 length normalization.
    assert results == ["False d2,d0"] + ["True d2,d0"] * 3  # exactly one built, all searched the same index
    entries = [e for e in (tmp_path / "idx").iterdir() if not e.name.startswith(".")]
    assert len(entries) == 1 and is_complete(entries[0])
    assert not [e for e in (tmp_path / "idx").iterdir() if e.name.startswith(".tmp-")]


def test_index_build_reports_progress(corpus, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="coevo.progress")
    build_retriever(corpus, "bm25s", cache_dir=str(tmp_path))
    lines = [m for m in caplog.messages if m.startswith("bm25s index of corpus 'toy'")]
    # 6 passages: a line at start and at 16, 33, 50, 66, 83 and 100%.
    assert [m.split(": ")[1].split(" ")[0] for m in lines] == ["started,", "16%", "33%", "50%", "66%", "83%", "100%"]
    caplog.clear()
    build_retriever(corpus, "bm25s", cache_dir=str(tmp_path))
    assert not caplog.messages  # loading a cached index shows nothing


def test_empty_corpus_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="corpus 'none' .* holds no passages"):
        build_retriever(Corpus([], name="none"), "bm25s", cache_dir=str(tmp_path))


def test_unknown_backend(corpus):
    with pytest.raises(ValueError, match="expected one of"):
        build_retriever(corpus, "nope")


@pytest.mark.slow
def test_dense_minilm(corpus, tmp_path):
    r = build_retriever(corpus, "dense_minilm", cache_dir=str(tmp_path))
    assert r.search(["movie by Stanley Kubrick"], 1)[0][0].passage_id == "d5"
    assert r.embeddings.shape == (len(corpus), 384)
    assert build_retriever(corpus, "dense_minilm", cache_dir=str(tmp_path)).from_cache
    assert r.search([""], 3) == [[]]
