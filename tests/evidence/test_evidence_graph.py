"""Evidence graph: lexical cues, edges with their supports, ranking and node resolution."""
from __future__ import annotations

import networkx as nx
import pytest

from evidence.graph import (
    CO_MENTION,
    RELATION,
    best_support,
    build_graph,
    display_name,
    edge_rank,
    is_acronym,
    lexical_cue,
    resolve_node,
    same_entity,
)
from evidence.mentions import Mention, normalize_entity


def mentions(text: str, *names: str) -> list[Mention]:
    """Mentions of `names` at their first occurrence in `text`."""
    out = []
    for name in names:
        start = text.index(name)
        out.append(Mention(name, "X", normalize_entity(name), start, start + len(name)))
    return out


def linker_offsets(text: str, words: set[str]) -> list[int]:
    """Offsets of the given words, standing in for the tagger's VB*/IN/TO/POS tokens."""
    offsets, pos = [], 0
    for token in text.split(" "):
        if token.strip(".,") in words:
            offsets.append(pos)
        pos += len(token) + 1
    return offsets


@pytest.mark.parametrize("text, a, b, words, cue", [
    ("Hank Snow moved to Nashville in 1949.", "Hank Snow", "Nashville", {"moved", "to"}, RELATION),
    ("Nashville is the capital of Tennessee.", "Nashville", "Tennessee", {"is", "of"}, RELATION),
    ("Hank Snow, the Singing Ranger, sang.", "Hank Snow", "Singing Ranger", set(), RELATION),  # apposition
    ("Tennessee (Cherokee: Tanasi) is a state.", "Tennessee", "Cherokee", set(), RELATION),  # parenthetical
    ("Snow's label RCA Victor grew.", "Snow", "RCA Victor", set(), RELATION),  # possessive, tagger silent
    ("the capital of France, Paris", "France", "Paris", set(), CO_MENTION),  # bare comma: a list or not
    ("The Danube flows through Vienna and Budapest.", "Vienna", "Budapest", {"flows", "through"}, CO_MENTION),
    ("Paris and Berlin and Rome and Madrid and Lisbon and Vienna and Prague and Warsaw met Oslo.",
     "Paris", "Oslo", {"met"}, CO_MENTION),  # a verb, but nine words away: no relation
])
def test_lexical_cue(text, a, b, words, cue):
    m1, m2 = mentions(text, a, b)
    links = linker_offsets(text, words)
    assert lexical_cue(text, m1, m2, links) == cue
    assert lexical_cue(text, m2, m1, links) == cue  # order of arguments does not matter


def test_overlapping_mentions_are_co_mentions():
    text = "University of North Texas"
    whole, part = mentions(text, "University of North Texas", "North Texas")
    assert lexical_cue(text, whole, part, [11]) == CO_MENTION


def test_acronyms_and_aliases():
    assert is_acronym("ip", "internet protocol") and is_acronym("tcp", "transmission control protocol")
    assert is_acronym("dy", "dysprosium") and not is_acronym("dy", "dublin")
    assert not is_acronym("ab", "ab") and not is_acronym("new york", "new york city")
    assert same_entity("snow", "hank snow") and same_entity("us", "united states")
    assert not same_entity("hank snow", "nashville")


@pytest.mark.slow
def test_toy_graph_edges_cues_and_supports(toy_index):
    g = build_graph(["t0", "t1", "t2", "t9"], toy_index)
    assert set(g.edges) == {("hello love", "hank snow"), ("hank snow", "nashville"), ("hank snow", "1949"),
                            ("nashville", "1949"), ("nashville", "tennessee"), ("danube", "vienna"),
                            ("danube", "budapest"), ("vienna", "budapest")}
    assert g.edges["hank snow", "nashville"]["cue"] == RELATION
    assert g.edges["vienna", "budapest"]["cue"] == CO_MENTION
    (sup,) = g.edges["nashville", "tennessee"]["supports"]
    assert (sup.passage_id, sup.title, sup.sentence) == ("t2", "Nashville", "Nashville is the capital of Tennessee.")
    assert sup.surface("tennessee") == "Tennessee" and sup.surface("paris") == ""
    assert g.nodes["hank snow"]["passages"] == {"t0", "t1"}
    assert display_name(g, "hello love") == "Hello Love"


@pytest.mark.slow
def test_every_supporting_sentence_is_kept(toy_index):
    # Marie Curie and Pierre Curie: t5 "He married Marie Curie"; Marie Curie also in t3 twice.
    g = build_graph(["t3", "t5"], toy_index)
    sups = g.edges["marie curie", "pierre curie"]["supports"]
    assert [(s.passage_id, s.sentence_index) for s in sups] == [("t5", 1)]
    g2 = build_graph([("t3", 2.0), ("t3", 5.0)], toy_index)  # one passage is added once, best score kept
    assert g2.graph["passages"] == {"t3": 5.0}
    assert len(g2.edges["marie curie", "warsaw"]["supports"]) == 1


def test_edge_rank_relation_then_support_then_score():
    g = nx.Graph()
    g.add_edge("a", "b", cue=CO_MENTION, supports=[1, 2, 3], score=9.0)
    g.add_edge("a", "c", cue=RELATION, supports=[1], score=1.0)
    g.add_edge("a", "d", cue=RELATION, supports=[1, 2], score=0.5)
    g.add_edge("a", "e", cue=RELATION, supports=[1, 2], score=2.0)
    ranked = sorted(g.neighbors("a"), key=lambda n: edge_rank(g, "a", n), reverse=True)
    assert ranked == ["e", "d", "c", "b"]


@pytest.mark.slow
def test_best_support_skips_used_sentences(toy_index):
    g = build_graph([("t1", 1.0), ("t2", 3.0)], toy_index)
    sup = best_support(g, "nashville", "1949")
    assert sup.passage_id == "t1"
    assert best_support(g, "nashville", "1949", exclude=[("t1", 0)]) is None


@pytest.mark.slow
def test_resolve_node(toy_index):
    g = build_graph(["t0", "t1", "t2", "t3"], toy_index)
    assert resolve_node(g, "the Hank Snow") == "hank snow"
    assert resolve_node(g, "Snow") == "hank snow"  # abbreviation of a longer node
    assert resolve_node(g, "singer Hank Snow") == "hank snow"  # a longer name holding the node
    assert resolve_node(g, "Hello Love (song)") == "hello love"
    assert resolve_node(g, "Atlantis") is None and resolve_node(g, "") is None and resolve_node(g, None) is None


@pytest.mark.slow
def test_build_graph_ignores_junk(toy_index):
    g = build_graph(["nope", None, 3, ("t2", "x"), object()], toy_index)
    assert set(g.nodes) == {"nashville", "tennessee"}
    assert build_graph("t2", toy_index).number_of_edges() == 1
    assert build_graph(None, toy_index).number_of_nodes() == 0


@pytest.mark.slow
def test_anchor_matches_unrecognized_mentions(toy_index):
    g = build_graph(["t2"], toy_index, anchors=["Capital"])
    assert g.edges["capital", "tennessee"]["cue"] == RELATION  # lower-case "capital" matched by text
    assert g.nodes["capital"]["labels"] == {"ANCHOR": 1}
    assert build_graph(["t9"], toy_index, anchors=["Atlantis"]).graph["anchors"].keys() == {"atlantis"}


@pytest.mark.slow
def test_display_name_is_never_a_pronoun(toy_index):
    g = build_graph(["t4"], toy_index)  # "Warsaw is …" then "It lies on the Vistula River."
    assert g.nodes["warsaw"]["surfaces"] == {"Warsaw": 1, "It": 1}
    assert display_name(g, "warsaw") == "Warsaw"
