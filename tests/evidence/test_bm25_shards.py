"""The sharded bm25s build (evidence/bm25_shards.py) against bm25s's own in-memory build."""
from __future__ import annotations

import itertools

import bm25s
import numpy as np
import pytest

from evidence import bm25_shards
from evidence.corpus import Corpus, load_corpus
from evidence.retrieval import tokenize


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(list(itertools.islice(load_corpus("wiki_mini"), 300)), name="wiki300")


def _reference(corpus: Corpus) -> bm25s.BM25:
    model = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    model.index([tokenize(f"{p.title} {p.text}") for p in corpus], show_progress=False)
    return model


def _columns(model: bm25s.BM25) -> dict[str, tuple[list[int], list[float]]]:
    """token -> (passages, scores) of its CSC column."""
    data, indices, indptr = (np.asarray(model.scores[k]) for k in ("data", "indices", "indptr"))
    return {t: (indices[indptr[i]:indptr[i + 1]].tolist(), data[indptr[i]:indptr[i + 1]].tolist())
            for t, i in model.vocab_dict.items() if t}


def test_sharded_index_has_bm25s_columns_and_search_results(corpus, tmp_path):
    out = tmp_path / "index"
    out.mkdir()
    stats = bm25_shards.build_sharded_bm25s(corpus, out, tmp_path / "work", tokenize, shard_passages=37)
    assert stats == {"shards": 9, "reused": 0, "passages": 300} and not (tmp_path / "work").exists()
    ours, ref = bm25s.BM25.load(str(out), mmap=True, show_progress=False), _reference(corpus)
    assert ours.scores["num_docs"] == 300 and set(ours.vocab_dict) == set(ref.vocab_dict)
    assert _columns(ours) == _columns(ref)  # every token's passages (in order) and float32 scores, exactly
    queries = [tokenize(f"{p.title} {p.text[:60]}") for p in itertools.islice(corpus, 0, 300, 7)]
    for q in queries:
        q = [t for t in q if t in ours.vocab_dict]
        a_docs, a_scores = ours.retrieve([q], k=10, show_progress=False, n_threads=1)
        b_docs, b_scores = ref.retrieve([q], k=10, show_progress=False, n_threads=1)
        assert a_scores.tolist() == b_scores.tolist() and a_docs.tolist() == b_docs.tolist()


def test_a_killed_build_resumes_from_its_finished_shards(corpus, tmp_path, monkeypatch):
    out, work = tmp_path / "index", tmp_path / "work"
    out.mkdir()
    real, calls = bm25_shards._count_shard, []

    def dies_on_the_third(*args, **kwargs):  # noqa: ANN002, ANN003
        calls.append(args[1])
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        real(*args, **kwargs)

    monkeypatch.setattr(bm25_shards, "_count_shard", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        bm25_shards.build_sharded_bm25s(corpus, out, work, tokenize, shard_passages=100)
    assert sorted(p.name for p in work.iterdir() if not p.name.startswith(".")) == ["100-000000", "100-000001"]
    monkeypatch.setattr(bm25_shards, "_count_shard", real)
    stats = bm25_shards.build_sharded_bm25s(corpus, out, work, tokenize, shard_passages=100)
    assert stats == {"shards": 3, "reused": 2, "passages": 300}
    assert _columns(bm25s.BM25.load(str(out), mmap=True, show_progress=False)) == _columns(_reference(corpus))
