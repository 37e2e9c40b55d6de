"""Sharded, resumable entity annotation (evidence/entity_shards.py) against the one-shot build."""
from __future__ import annotations

import numpy as np
import pytest

from evidence import entity_shards, spacy_ner
from evidence.entities import build_entity_index, entity_cache_path

QUERIES = ["Hank Snow", "Nashville", "Marie Curie", "Warsaw", "Paris", "Sweden", "Stockholm", "Tennessee",
           "Vienna", "Nobody Here"]


@pytest.fixture(scope="module")
def one_shot(toy_corpus, tmp_path_factory):
    return build_entity_index(toy_corpus, cache_dir=str(tmp_path_factory.mktemp("one_shot")))


def assert_same_index(index, reference) -> None:
    assert index.vocab == reference.vocab
    assert index.labels == reference.labels
    for name in ("sent_span", "ment", "link", "ent_ptr", "ent_pass", "ent_label", "title_ent"):
        assert np.array_equal(getattr(index, f"_{name}"), getattr(reference, f"_{name}")), name
    for name in ("sent_ptr", "ment_ptr", "link_ptr"):
        assert getattr(index, f"_{name}") == getattr(reference, f"_{name}"), name
    for q in QUERIES:
        assert index.passages_mentioning(q) == reference.passages_mentioning(q), q
        assert index.document_frequency(q) == reference.document_frequency(q), q


def test_unpack_inverts_pack():
    records = [("a", [(0, 5, [(0, 1, "PERSON", "x"), (2, 3, "NP", "y")], [1, 4])]),
               ("b", []),
               ("x", [(0, 2, [], []), (3, 9, [(3, 4, "GPE", "a")], [5])])]
    arrays, vocab, labels = spacy_ner.pack(iter(records), 3)
    assert vocab == ["a", "x", "y", "b"] and labels == ["PERSON", "NP", "GPE"]
    assert list(spacy_ner.unpack(arrays, vocab, labels)) == records
    # Two parts merged equal the whole packed at once (vocab order, arrays).
    first = spacy_ner.pack(iter(records[:1]), 1)
    rest = spacy_ner.pack(iter(records[1:]), 2)
    merged, m_vocab, m_labels = spacy_ner.merge_packed([first, rest], 3)
    assert (m_vocab, m_labels) == (vocab, labels)
    assert all(np.array_equal(merged[k], arrays[k]) for k in arrays)


def test_shard_ranges():
    assert entity_shards.shard_ranges(12, 5) == [(0, 5), (5, 10), (10, 12)]
    assert entity_shards.shard_ranges(4, 10) == [(0, 4)]
    with pytest.raises(ValueError, match="evidence.shard_passages=0"):
        entity_shards.shard_ranges(4, 0)


@pytest.mark.slow
def test_sharded_build_equals_one_shot_and_loads_from_cache(toy_corpus, one_shot, tmp_path):
    stats = entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=5, workers=1)
    entry = entity_cache_path(toy_corpus, cache_dir=str(tmp_path))
    assert stats == {"path": str(entry), "built": True, "shards": 3, "reused": 0, "annotated": 3}
    assert not entity_shards.shard_root(entry).exists()  # merged into the entry, then removed
    index = build_entity_index(toy_corpus, cache_dir=str(tmp_path))
    assert index.from_cache and index.path == entry
    assert_same_index(index, one_shot)
    again = entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=5, workers=1)
    assert again["built"] is False


class Stop(RuntimeError):
    pass


@pytest.mark.slow
def test_killed_build_resumes_without_redoing_finished_shards(toy_corpus, one_shot, tmp_path, monkeypatch):
    def stop_after_first(i: int) -> None:
        raise Stop(f"killed after shard {i}")

    with pytest.raises(Stop, match="after shard 0"):
        entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=5, workers=1,
                                    on_shard=stop_after_first)
    entry = entity_cache_path(toy_corpus, cache_dir=str(tmp_path))
    assert not entry.exists()
    first = entity_shards.shard_root(entry) / "5-000000"
    assert sorted(p.name for p in entity_shards.shard_root(entry).iterdir()) == ["5-000000"]
    mtime = (first / "arrays.npz").stat().st_mtime_ns

    annotated: list[str] = []  # first passage id of each shard the rerun annotates
    real = spacy_ner.annotate_records

    def counting(passages, *args, **kwargs):
        annotated.append(passages[0].id)
        return real(passages, *args, **kwargs)

    monkeypatch.setattr(spacy_ner, "annotate_records", counting)
    seen: list[int] = []
    stats = entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=5, workers=1,
                                        on_shard=lambda i: seen.append((i, (first / "arrays.npz").stat().st_mtime_ns)))
    assert annotated == ["t5", "t10"] and [i for i, _ in seen] == [1, 2]
    assert all(m == mtime for _, m in seen)  # shard 0 was not rewritten while the others were built
    assert (stats["reused"], stats["annotated"], stats["built"]) == (1, 2, True)
    assert_same_index(build_entity_index(toy_corpus, cache_dir=str(tmp_path)), one_shot)


@pytest.mark.slow
def test_shard_of_another_corpus_is_redone(toy_corpus, corpus_from_rows, toy_rows, tmp_path):
    """A shard directory whose meta names other passages is annotated again, not merged in."""
    with pytest.raises(Stop):
        entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=5, workers=1,
                                    on_shard=lambda i: (_ for _ in ()).throw(Stop()))
    entry = entity_cache_path(toy_corpus, cache_dir=str(tmp_path))
    meta = entity_shards.shard_root(entry) / "5-000000" / "meta.json"
    meta.write_text(meta.read_text().replace('"stop": 5', '"stop": 4'))
    stats = entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=5, workers=1)
    assert (stats["reused"], stats["annotated"]) == (0, 3)


@pytest.mark.slow
def test_two_worker_processes_build_the_same_index(toy_corpus, one_shot, tmp_path):
    done: list[int] = []
    stats = entity_shards.build_sharded(toy_corpus, cache_dir=str(tmp_path), shard_passages=4, workers=2,
                                        on_shard=done.append)
    assert sorted(done) == [0, 1, 2] and stats["annotated"] == 3
    assert_same_index(build_entity_index(toy_corpus, cache_dir=str(tmp_path)), one_shot)
