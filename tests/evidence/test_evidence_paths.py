"""Evidence paths: the known toy chain, certification, seeds, hop budget, JSON round trip."""
from __future__ import annotations

import json
import random

import pytest

from coevo.core.types import EvidencePath, Hop
from evidence.paths import build_evidence_paths, certify_path


def hop(head: str, tail: str, sentence: str, pid: str = "p1", title: str = "T", **kw) -> Hop:
    return Hop(head=head, tail=tail, sentence=sentence, passage_id=pid, title=title, score=1.0, cue="relation", **kw)


GOOD = EvidencePath("Tennessee", (
    hop("Hank Snow", "Nashville", "Hank Snow moved to Nashville in 1949.", "t1"),
    hop("Nashville", "Tennessee", "Nashville is the capital of Tennessee.", "t2"),
))


def test_certify_accepts_a_good_path():
    assert certify_path(GOOD) is None
    assert GOOD.entities == ["Hank Snow", "Nashville", "Tennessee"] and GOOD.bridges == ["Nashville"]
    assert GOOD.evidence_ids == ["t1", "t2"] and len(GOOD) == 2


@pytest.mark.parametrize("hops, reason", [
    ((), "no_hops"),
    ((hop("Hank Snow", "Nashville", "", "t1"),), "missing_evidence"),
    ((hop("Hank Snow", "Nashville", "Hank Snow moved to Nashville.", ""),), "missing_evidence"),
    ((hop("Nashville", "Tennessee", "Nashville is in Tennessee."),
      hop("Tennessee", "Nashville", "Tennessee's capital is Nashville.")), "repeated_entity"),
    ((hop("Hank Snow", "Nashville", "Hank Snow moved to Nashville."),
      hop("Nashville", "Snow", "Snow sang in Nashville.")), "repeated_entity"),  # alias of Hank Snow
    ((hop("Hank Snow", "Nashville", "Hank Snow sang."),), "discontinuous"),  # tail not in the sentence
    ((hop("Hank Snow", "Nashville", "Hank Snow moved to Nashville."),
      hop("Memphis", "Tennessee", "Memphis is in Tennessee.")), "discontinuous"),  # chain breaks
])
def test_certify_rejects(hops, reason):
    assert certify_path(EvidencePath("x", hops)) == reason


def test_certify_pronoun_stands_for_the_passage_topic_only():
    ok = hop("Warsaw", "Vistula River", "It lies on the Vistula River.", "t4", title="Warsaw", head_mention="It")
    assert certify_path(EvidencePath("Vistula River", (ok,))) is None
    wrong = hop("Warsaw", "Vistula River", "It lies on the Vistula River.", "t4", title="Krakow", head_mention="It")
    assert certify_path(EvidencePath("Vistula River", (wrong,))) == "discontinuous"


def test_certify_survives_junk():
    assert certify_path(None) == "no_hops"
    assert certify_path(EvidencePath("x", ("not a hop",))) == "missing_evidence"


def test_round_trip_through_json():
    data = json.loads(json.dumps(GOOD.to_record()))
    assert data["evidence_ids"] == ["t1", "t2"] and data["hops"][0]["sentence"].startswith("Hank Snow")
    assert EvidencePath.from_record(data) == GOOD
    with pytest.raises(ValueError):
        EvidencePath.from_record({"hops": [{"head": "a"}]})
    with pytest.raises(ValueError):
        EvidencePath.from_record(["not", "a", "dict"])


@pytest.mark.slow
def test_known_chain_is_found_exactly(toy_retriever, toy_index):
    (path,) = build_evidence_paths("Tennessee", toy_retriever, toy_index, max_hops=3, branching=2, rng=0)
    assert [(h.head, h.tail, h.passage_id, h.title, h.cue) for h in path.hops] == [
        ("Hello Love", "Hank Snow", "t0", "Hello Love", "relation"),
        ("Hank Snow", "Nashville", "t1", "Hank Snow", "relation"),
        ("Nashville", "Tennessee", "t2", "Nashville", "relation"),
    ]
    assert [h.sentence for h in path.hops] == [
        "Hello Love is a song recorded by Hank Snow.",
        "Hank Snow moved to Nashville in 1949.",  # 1949 is a neighbour too, but dates never bridge
        "Nashville is the capital of Tennessee.",
    ]
    assert path.evidence_ids == ["t0", "t1", "t2"] and path.target == "Tennessee"
    assert all(h.score > 0 for h in path.hops)  # BM25 scores of the passages retrieved for each entity
    assert certify_path(path) is None


@pytest.mark.slow
@pytest.mark.parametrize("max_hops, expected", [
    (1, [("Nashville", "Tennessee")]),
    (2, [("Hank Snow", "Nashville"), ("Nashville", "Tennessee")]),
    (5, [("Hello Love", "Hank Snow"), ("Hank Snow", "Nashville"), ("Nashville", "Tennessee")]),
])
def test_hop_budget_is_an_upper_bound(toy_retriever, toy_index, max_hops, expected):
    paths = build_evidence_paths("Tennessee", toy_retriever, toy_index, max_hops=max_hops, rng=0)
    assert [[(h.head, h.tail) for h in p.hops] for p in paths] == [expected]


@pytest.mark.slow
def test_seeded_reproducibility_and_branching(toy_retriever, toy_index):
    def run(target, seed, branching=2):
        return [p.to_record() for p in build_evidence_paths(target, toy_retriever, toy_index, branching=branching,
                                                            rng=random.Random(seed))]

    for target in ("Marie Curie", "Sweden", "Paris", "Warsaw"):
        assert run(target, 7) == run(target, 7)
        assert build_evidence_paths(target, toy_retriever, toy_index, rng=3) == \
            build_evidence_paths(target, toy_retriever, toy_index, rng=random.Random(3))
        greedy = run(target, 7, branching=1)
        assert len(greedy) <= 1 and all(p in run(target, 11) for p in greedy)
    wide = build_evidence_paths("Marie Curie", toy_retriever, toy_index, branching=3, rng=0)
    assert len(wide) >= 2 and all(certify_path(p) is None and 1 <= len(p) <= 3 for p in wide)
    assert len({tuple(p.entities) for p in wide}) == len(wide)  # no duplicate paths


@pytest.mark.slow
def test_no_path_cases(toy_retriever, toy_index):
    assert build_evidence_paths("Atlantis", toy_retriever, toy_index) == []
    assert build_evidence_paths("Tennessee", toy_retriever, toy_index, max_hops=0) == []
    assert build_evidence_paths("Tennessee", toy_retriever, toy_index, retrieve_k=0) == []
    assert build_evidence_paths("", toy_retriever, toy_index) == []
    assert build_evidence_paths(None, toy_retriever, toy_index) == []
