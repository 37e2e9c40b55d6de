"""Retrieval: backend parity, caching, empty queries."""
import pytest

from evidence.corpus import Corpus, Passage
from evidence.retrieval import build_retriever, tokenize

TEXTS = [
    ("Paris", "Paris is the capital and largest city of France."),
    ("Lyon", "Lyon is a city in France on the Rhone river."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Rhone", "The Rhone is a river that flows through Switzerland and France."),
    ("Danube", "The Danube river flows through Germany, Austria and Hungary."),
    ("Kubrick", "Stanley Kubrick directed the film 2001: A Space Odyssey in 1968."),
]


@pytest.fixture()
def corpus():
    return Corpus([Passage(f"d{i}", t, x) for i, (t, x) in enumerate(TEXTS)], name="toy")


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
    changed = Corpus([Passage("x", "X", "capital city")] + corpus.passages, name="toy2")
    assert not build_retriever(changed, "bm25s", cache_dir=str(tmp_path)).from_cache


def test_unknown_backend(corpus):
    with pytest.raises(ValueError, match="expected one of"):
        build_retriever(corpus, "nope")


@pytest.mark.slow
def test_dense_minilm(corpus, tmp_path):
    r = build_retriever(corpus, "dense_minilm", cache_dir=str(tmp_path))
    assert r.search(["movie by Stanley Kubrick"], 1)[0][0].passage_id == "d5"
    assert build_retriever(corpus, "dense_minilm", cache_dir=str(tmp_path)).from_cache
    assert r.search([""], 3) == [[]]
