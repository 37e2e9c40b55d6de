"""Property tests: every public evidence function answers arbitrary input without raising."""
from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coevo.core.config import EvidenceConfig
from coevo.core.types import EvidencePath, Verdict
from evidence.entities import build_entity_index
from evidence.graph import CUE_RANK, build_graph, lexical_cue, resolve_node
from evidence.mentions import Mention, normalize_entity, title_key
from evidence.paths import build_evidence_paths, certify_path
from evidence.pipeline import EvidencePipeline
from evidence.validate import open_question_verdict, validate_question

PUNCT = string.punctuation + "“”‘’–—…¿¡«»·•"
garbled = st.one_of(
    st.text(max_size=60),
    st.text(alphabet=PUNCT + " ", max_size=30),  # punctuation-only targets
    st.text(alphabet=string.ascii_letters + " ", max_size=40),
    st.sampled_from(["Hank Snow", "Nashville", "the", "Tennessee?", "Ünïcödé Çity", "東京", "İstanbul", "\x00"]),
    st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=8), st.integers(100, 3000)),  # very long
)
anything = st.one_of(garbled, st.none(), st.integers(), st.floats(allow_nan=True), st.lists(st.text(), max_size=3))
json_like = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
                         lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                         max_leaves=12)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _is_verdict(v: object) -> bool:
    return isinstance(v, Verdict) and v.ok == (v.reason == "ok") and isinstance(v.reason, str)


@FAST
@given(anything)
def test_normalize_entity_total_and_idempotent(text):
    key = normalize_entity(text)
    assert isinstance(key, str) and normalize_entity(key) == key
    assert isinstance(title_key(text), str)


@FAST
@given(st.text(max_size=80), st.integers(0, 90), st.integers(0, 90), st.integers(0, 90), st.integers(0, 90),
       st.lists(st.integers(-5, 100), max_size=6))
def test_lexical_cue_total(text, a, b, c, d, linkers):
    m1, m2 = Mention("x", "X", "x", min(a, b), max(a, b)), Mention("y", "X", "y", min(c, d), max(c, d))
    assert lexical_cue(text, m1, m2, sorted(linkers)) in CUE_RANK


@FAST
@given(json_like)
def test_certify_and_from_record_total(data):
    assert certify_path(data) in (None, "no_hops", "missing_evidence", "repeated_entity", "discontinuous")
    try:
        path = EvidencePath.from_record(data)
    except ValueError:
        return
    assert certify_path(path) is None or isinstance(certify_path(path), str)


@FAST
@given(anything, anything, st.one_of(json_like, st.none()))
def test_validate_question_total(question, target, path):
    assert _is_verdict(validate_question(question, target, path))


@FAST
@given(anything)
def test_open_question_verdict_total(question):
    verdict = open_question_verdict(Verdict(True, "ok", ("p1",)), question)
    assert _is_verdict(verdict) and verdict.evidence == ("p1",)


@pytest.mark.slow
@FAST
@given(garbled, st.one_of(garbled, st.none()))
def test_validate_target_total(toy_retriever, toy_index, target, reference):
    pipe = EvidencePipeline(None, toy_retriever, toy_index, EvidenceConfig())  # type: ignore[arg-type]
    assert _is_verdict(pipe.validate_targets([target], [reference])[0])


@pytest.mark.slow
@FAST
@given(anything, st.integers(-1, 4), st.integers(-1, 3), st.integers(0, 2**32))
def test_build_evidence_paths_total(toy_retriever, toy_index, target, max_hops, branching, seed):
    paths = build_evidence_paths(target, toy_retriever, toy_index, max_hops=max_hops, branching=branching, rng=seed)
    assert all(certify_path(p) is None and len(p) <= max(max_hops, 0) for p in paths)


@pytest.mark.slow
@FAST
@given(st.lists(st.one_of(st.sampled_from([f"t{i}" for i in range(12)]), anything), max_size=6), anything)
def test_graph_and_index_lookups_total(toy_index, passages, text):
    graph = build_graph(passages, toy_index)
    assert resolve_node(graph, text) is None or resolve_node(graph, text) in graph
    assert isinstance(toy_index.passages_mentioning(text), list)
    assert toy_index.passage_for_title(text) is None or toy_index.passage_for_title(text) in toy_index.corpus
    assert toy_index.annotation(text) is None or isinstance(text, str)
    assert toy_index.document_frequency(text) >= 0 and isinstance(text in toy_index, bool)


@pytest.fixture(scope="module")
def lazy_toy_index(toy_corpus, tmp_path_factory):
    from evidence.lazy_entities import open_lazy_index

    return open_lazy_index(toy_corpus, stats_sample=6, cache_dir=str(tmp_path_factory.mktemp("lazy")))


@pytest.mark.slow
@FAST
@given(st.lists(st.one_of(st.sampled_from([f"t{i}" for i in range(12)]), anything), max_size=6), anything)
def test_lazy_index_lookups_total(lazy_toy_index, passages, text):
    lazy_toy_index.prepare(passages)
    graph = build_graph(passages, lazy_toy_index)
    assert resolve_node(graph, text) is None or resolve_node(graph, text) in graph
    found = lazy_toy_index.passage_for_title(text)
    assert found is None or found in lazy_toy_index.corpus
    assert lazy_toy_index.annotation(text) is None or isinstance(text, str)
    assert lazy_toy_index.document_frequency(text) >= 0 and isinstance(text in lazy_toy_index, bool)
    assert lazy_toy_index.entity_label(text) is None or isinstance(lazy_toy_index.entity_label(text), str)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                               HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(garbled, garbled), min_size=1, max_size=3))
def test_index_on_garbled_corpus(corpus_from_rows, tmp_path, rows):
    corpus = corpus_from_rows([(t, x[:2000]) for t, x in rows], name="garbled")
    index = build_entity_index(corpus, cache_dir=str(tmp_path))
    for passage in corpus:
        ann = index.annotation(passage.id)
        for sent in ann.sentences:
            assert passage.text[sent.start:sent.end] == sent.text
            for m in sent.mentions:
                assert m.key and passage.text[m.start:m.end] == m.text


@pytest.mark.slow
@FAST
@given(st.lists(anything, max_size=4), st.one_of(st.none(), st.lists(anything, max_size=5)), anything)
def test_pipeline_batches_total(toy_corpus, toy_retriever, toy_index, targets, references, seed):
    from coevo.core.config import EvidenceConfig
    from evidence.pipeline import EvidencePipeline

    pipe = EvidencePipeline(toy_corpus, toy_retriever, toy_index, EvidenceConfig(max_hops=2))
    verdicts = pipe.validate_targets(targets, references)
    assert len(verdicts) == len(targets) and all(_is_verdict(v) for v in verdicts)
    paths = pipe.build_paths(targets, rng=seed if isinstance(seed, int) else None)
    assert len(paths) == len(targets) and all(len(p) <= 2 for ps in paths for p in ps)
    checks = pipe.validate_questions(targets, targets, [ps[0] if ps else None for ps in paths])
    assert all(_is_verdict(v) for v in checks)
