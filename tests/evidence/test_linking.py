"""Linking a target by its name (docs/method.md §3.3): a lower-case common noun is not a capitalised title.

The case: a 4-step co-evolution run accepted "What is the origin of a jawless ancestor to vertebrates?" →
Jaws (film), its one hop matching the film's key "jaws" to "jaws" in the Agnatha passage.
"""
from __future__ import annotations

import pytest

from evidence.corpus import Corpus, Passage
from evidence.graph import build_graph, lower_case_mentions
from evidence.mentions import is_disambiguated, names_sense, needs_capital
from evidence.paths import build_evidence_paths

AGNATHA = ("Agnatha or jawless fish is a paraphyletic infraphylum of animals in the subphylum Vertebrata of the "
           "phylum Chordata, characterized by the lack of jaws. The group consists of both living and extinct clades. "
           "They are sister to vertebrates with jaws known as gnathostomes, who evolved from jawless ancestors during "
           "the early Silurian by developing folding articulations in the first pairs of gill arches.")
JAWS = ("Jaws is a 1975 American thriller film directed by Steven Spielberg, based on the 1974 novel by Peter "
        "Benchley. It stars Roy Scheider as police chief Martin Brody, who hunts a man-eating great white shark.")
CHORD = "A chord, in music, is any harmonic set of pitches consisting of multiple notes."


@pytest.fixture(scope="module")
def jaws_corpus(tmp_path_factory):
    from evidence.entities import build_entity_index
    from evidence.retrieval import build_retriever

    corpus = Corpus([Passage("a0", "Agnatha", AGNATHA), Passage("a1", "Jaws (film)", JAWS),
                     Passage("a2", "Chord (music)", CHORD)], name="jaws")
    tmp = tmp_path_factory.mktemp("jaws")
    return build_retriever(corpus, "bm25s", cache_dir=str(tmp / "bm25")), \
        build_entity_index(corpus, cache_dir=str(tmp / "entities"))


@pytest.mark.slow
def test_jawless_fish_do_not_link_to_the_film(jaws_corpus):
    retriever, index = jaws_corpus
    paths = build_evidence_paths("Jaws (film)", retriever, index, max_hops=2, rng=0)
    assert paths, "the film's own passage still gives a path"
    assert all(h.passage_id != "a0" for p in paths for h in p.hops)  # nothing from Agnatha
    last = [p.hops[-1] for p in paths]
    assert {h.passage_id for h in last} == {"a1"} and {h.tail_key for h in last} == {"jaws"}
    # the agnatha passage alone: the capitalised name's anchor does not match "jaws"; a lower-case name does
    assert "jaws" not in build_graph(["a0"], index, anchors=["Jaws (film)"])
    assert "jaws" in build_graph(["a0"], index, anchors=["jaws"])
    assert "jaws" in build_graph(["a1"], index, anchors=["Jaws (film)"])  # "Jaws is a 1975 … film"


@pytest.mark.slow
def test_lower_case_mentions_follow_the_names_own_page(jaws_corpus):
    _, index = jaws_corpus
    assert not lower_case_mentions("Jaws (film)", index)  # its page writes "Jaws" only
    assert lower_case_mentions("Chord (music)", index)  # "A chord, in music, is …"
    assert lower_case_mentions("Tennis", index)  # no capitalised name: no page needed
    assert not lower_case_mentions("Jaws (novel)", index)  # no page of its own here


def test_needs_capital():
    assert [needs_capital(n) for n in ("Jaws (film)", "Hank Snow", "Tennis", "Capital", "iPod (device)", "", None)] \
        == [True, True, False, False, False, False, False]
    assert [is_disambiguated(n) for n in ("Jaws (film)", "Jaws", "(film)", None)] == [True, False, False, False]


@pytest.mark.parametrize("surface, sentence, title, text, common, linked", [
    ("jaws", "They are sister to vertebrates with jaws.", "Agnatha", AGNATHA, False, False),
    ("Jaws", "Jaws is a 1975 film.", "Jaws (film)", JAWS, False, True),  # its own page
    ("Jaws", "Jaws is a 1974 novel.", "Jaws (novel)", "Jaws is a 1974 novel.", False, False),  # another sense's page
    ("Jaws", "Jaws was a hit.", "Steven Spielberg", "Jaws was a hit.", False, False),  # sentence-initial only
    ("Jaws", "Jaws was a hit.", "Steven Spielberg", "Jaws was a hit, a film of 1975.", False, True),  # "film"
    ("Jaws", "In 1975 Jaws was a hit.", "Steven Spielberg", "In 1975 Jaws was a hit.", False, True),  # mid-sentence
    ("jaws", "Sharks have jaws.", "Shark", "Sharks have jaws in the film.", False, False),  # lower case: a noun
    ("chord", "Play a chord.", "Guitar", "Play a chord of music.", True, True),  # common noun, "music"
    ("chord", "Play a chord.", "Rope", "Play a chord.", True, False),
])
def test_names_sense(surface, sentence, title, text, common, linked):
    assert names_sense("Jaws (film)" if surface.lower() == "jaws" else "Chord (music)", surface, sentence, title,
                       text, common) is linked


def test_names_sense_without_disambiguation_and_junk():
    assert names_sense("Tennis", "tennis", "He plays tennis.", "Roger Federer", "")
    assert names_sense(None, None, None, None, None)
    assert not names_sense("Jaws (film)", None, None, None, None)
