"""Bridges that generalise: the passage topic inside its own passage, and answers
that are no entity node. The passages are hand-written; expected mentions and edges are what
a reader of each sentence would say, not what the code happened to produce."""
from __future__ import annotations

import networkx as nx
import pytest

from coevo.core.types import EvidencePath, Hop
from evidence import entities
from evidence.graph import RELATION, add_passages, build_graph, fold_accents, reach_node, resolve_node
from evidence.mentions import is_topic_anaphor, names_title, title_forms
from evidence.paths import certify_path

ROWS = [
    ("Moonlight Serenade (film)",  # t0: NER calls the film a PERSON; its pronouns say it is a thing
     "Moonlight Serenade is a 1950 American drama film directed by Arthur J. Kessler. The film stars Helen Ward. "
     "It was shot in Utah. It was released in 1951. He later directed Blue Road."),
    ("Arthur J. Kessler",  # t1: the lead writes a fuller name; later subjects are pronouns
     "Arthur James Kessler (born 1901) was an American director. In 1930, he moved to Denver. "
     "His father was a lawyer in Chicago. He worked as a carpenter and opened a café. He had two sons."),
    ("Ingrid Hallberg",  # t2: a later paragraph: the surname only, never the full name
     "Hallberg moved to Stockholm in 1960. She married Olof Berg in 1965."),
    ("Littlerock, California",  # t3: a "Name, Qualifier" title, named by its name only
     "Littlerock is a town in Los Angeles County. The town lies near Palmdale."),
    ("Harbor Lights (band)",  # t4: plural pronouns for a band
     "Harbor Lights is a band from Oslo. They toured Japan in 1990. Their drummer is Tom Berg."),
]


@pytest.fixture(scope="module")
def index(corpus_from_rows, tmp_path_factory):
    return entities.build_entity_index(corpus_from_rows(ROWS, name="bridges"),
                                       cache_dir=str(tmp_path_factory.mktemp("entities")))


def topic_mentions(index, pid: str) -> list[list[str]]:
    """Per sentence, the surfaces standing for the passage topic."""
    ann = index.annotation(pid)
    return [[m.text for m in s.mentions if m.key == ann.title_key] for s in ann.sentences]


@pytest.mark.slow
@pytest.mark.parametrize("pid, expected", [
    # "He later directed Blue Road" is the director: pronouns say the film is an "it".
    ("t0", [["Moonlight Serenade"], ["The film"], ["It"], ["It"], []]),
    ("t1", [["Arthur James Kessler"], ["he"], ["His"], ["He"], ["He"]]),
    ("t2", [["Hallberg"], ["She"]]),
    ("t3", [["Littlerock"], ["The town"]]),
    ("t4", [["Harbor Lights"], ["They"], ["Their"]]),
])
def test_subjects_standing_for_the_topic_are_topic_mentions(index, pid, expected):
    assert topic_mentions(index, pid) == expected


@pytest.mark.slow
def test_pronoun_and_description_subjects_make_bridge_edges(index):
    g = build_graph(["t0", "t1"], index)
    # Two-hop question "Where did the director of Moonlight Serenade move in 1930?":
    # first-hop answer Arthur J. Kessler, final answer Denver, joined by "In 1930, he moved to Denver."
    first, final = resolve_node(g, "Arthur J. Kessler"), resolve_node(g, "Denver")
    assert (first, final) == ("arthur j kessler", "denver") and g.has_edge(first, final)
    assert nx.shortest_path(g, "moonlight serenade", "chicago") == ["moonlight serenade", "arthur j kessler", "chicago"]
    assert g.has_edge("moonlight serenade", "helen ward")  # "The film stars Helen Ward."
    assert not g.has_edge("moonlight serenade", "blue road")  # "He" is not the film


@pytest.mark.slow
def test_reach_node_finds_answers_that_are_no_entity(index):
    g = build_graph(["t1"], index)
    assert resolve_node(g, "carpenter") is None and resolve_node(g, "two") is None
    assert reach_node(g, "carpenter", index) == "carpenter"  # a common noun
    assert g.edges["carpenter", "arthur j kessler"]["cue"] == RELATION  # "He worked as a carpenter"
    assert reach_node(g, "two", index) == "two"  # a number spaCy keeps no entity for
    assert g.has_edge("two", "arthur j kessler")
    assert reach_node(g, "Cafe", index) == "cafe" and g.nodes["cafe"]["surfaces"] == {"café": 1}  # accents
    assert reach_node(g, "Denver", index) == "denver" and "denver" not in g.graph["anchors"]  # an entity: as is
    n_nodes = g.number_of_nodes()
    assert reach_node(g, "Atlantis", index) is None and g.number_of_nodes() == n_nodes
    assert reach_node(g, "", index) is None and reach_node(g, None, index) is None


@pytest.mark.slow
def test_reached_answers_stay_anchored_for_passages_added_later(index):
    g = build_graph(["t4"], index)
    assert reach_node(g, "drummer", index) == "drummer"
    g = build_graph(["t1"], index)
    assert reach_node(g, "drummer", index) is None  # not in "Arthur J. Kessler"
    add_passages(g, ["t4"], index)
    assert g.has_edge("drummer", "tom berg")


def hop(head: str, tail: str, sentence: str, title: str, **kw) -> Hop:
    return Hop(head=head, tail=tail, sentence=sentence, passage_id="p", title=title, score=1.0, cue="relation", **kw)


def test_certify_accepts_topic_forms_of_the_hops_own_passage_only():
    film = hop("Moonlight Serenade", "Helen Ward", "The film stars Helen Ward.", "Moonlight Serenade (film)",
               head_mention="The film")
    assert certify_path(EvidencePath("Helen Ward", (film,))) is None
    other = hop("Moonlight Serenade", "Helen Ward", "The film stars Helen Ward.", "Blue Road", head_mention="The film")
    assert certify_path(EvidencePath("Helen Ward", (other,))) == "discontinuous"
    lead = hop("Arthur J. Kessler", "Denver", "Arthur James Kessler moved to Denver.", "Arthur J. Kessler",
               head_mention="Arthur James Kessler")
    assert certify_path(EvidencePath("Denver", (lead,))) is None
    stranger = hop("Arthur J. Kessler", "Denver", "Arthur James Kessler moved to Denver.", "Olof Berg",
                   head_mention="Arthur James Kessler")
    assert certify_path(EvidencePath("Denver", (stranger,))) == "discontinuous"


@pytest.mark.parametrize("surface, title, expected", [
    ("Richard Kevin Betts", "Richard K. Betts", True),  # initial spelled out
    ("Love, Honor and Oh- Baby!", "Love, Honor and Oh-Baby!", True),  # spacing
    ("Live at the Rainbow'74", "Live at the Rainbow '74", True),  # spacing only
    ("Richar", "Richar, Duke of Lower Lorraine", True),  # the name before the comma
    ("An animator", "Animator", True),
    ("Paris Commune", "Paris", False),  # head-final: a commune, not Paris
    ("Snow's son Jimmie Rodgers Snow", "Hank Snow", False),  # half of the title's words only
    ("", "Paris", False),
])
def test_names_title(surface, title, expected):
    assert names_title(surface, title) is expected


def test_topic_forms_and_anaphors():
    assert title_forms("Littlerock, California") == ["littlerock california", "littlerock"]
    assert title_forms("Hello Love (song)") == ["hello love"]
    assert [is_topic_anaphor(s) for s in ("He", "their", "The film", "this 1999 film", "The Beatles", "Paris", None)] \
        == [True, True, True, True, False, False, False]


def test_fold_accents_keeps_offsets():
    text = "He opened a café in Zürich."
    folded = fold_accents(text)
    assert folded == "He opened a cafe in Zurich." and len(folded) == len(text)
    assert fold_accents("plain") == "plain"


def test_entity_cache_key_names_the_annotator_version(toy_corpus, tmp_path, monkeypatch):
    path = entities.entity_cache_path(toy_corpus, cache_dir=str(tmp_path))
    assert entities.ANNOTATOR_VERSION in path.name
    monkeypatch.setattr(entities, "ANNOTATOR_VERSION", "ents-test")
    assert entities.entity_cache_path(toy_corpus, cache_dir=str(tmp_path)) != path
