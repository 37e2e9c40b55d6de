"""`evidence.retrievable`: a question whose own top-N search reaches neither the target nor the path's
first-hop passage is rejected (`not_retrievable`), with one batched search and no model."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from coevo.core.config import EvidenceConfig
from coevo.core.types import Completion, EvidencePath, Hop, Verdict
from coevo.orchestrate.records import step_metrics
from evidence.corpus import Corpus, Passage
from evidence.pipeline import EvidencePipeline
from evidence.validate import retrievability_verdict
from proposer.pipeline import Candidate, check_questions

PASSAGES = [
    Passage("a0", "Hank Snow", "Hank Snow was a country singer who moved to Nashville in 1949."),
    Passage("a1", "Nashville", "Nashville is the capital of Tennessee."),
    Passage("a2", "Hello Love", "Hello Love is a song recorded by Hank Snow."),
    Passage("a3", "Grand Ole Opry", "The Grand Ole Opry is a weekly country music stage concert."),
]
# Hank Snow -> Nashville (a0) -> Tennessee (a1)
PATH = EvidencePath("Tennessee", (
    Hop("Hank Snow", "Nashville", PASSAGES[0].text, "a0", "Hank Snow", 1.0, "relation"),
    Hop("Nashville", "Tennessee", PASSAGES[1].text, "a1", "Nashville", 1.0, "relation"),
))
REACHABLE = "Which state holds the city that singer Hank Snow moved to?"  # finds a0, the first hop's passage
BY_TARGET = "Which state has the capital Nashville?"  # finds a1 first: it contains Tennessee
UNREACHABLE = "Which state hosts Grand Ole Opry concerts weekly?"  # finds a3 only
RANK_TWO = "Which state did the Grand Ole Opry singer Hank move to?"  # a3 first, a0 second


@pytest.fixture()
def pipeline(overlap_retriever):
    def build(retrievable: bool = True, k: int | None = 2, first_search_k: int = 10) -> EvidencePipeline:
        corpus = Corpus(PASSAGES, name="retrievable")
        index = SimpleNamespace(corpus=corpus)  # the check reads passages only: no spaCy
        cfg = EvidenceConfig(retrievable=retrievable, retrievable_k=k)
        return EvidencePipeline(corpus, overlap_retriever(PASSAGES), index, cfg, first_search_k=first_search_k)
    return build


def test_an_unreachable_question_is_rejected_and_a_reachable_one_accepted(pipeline):
    pipe = pipeline()
    questions = [REACHABLE, BY_TARGET, UNREACHABLE, "Tennessee?"]
    verdicts = pipe.validate_questions(questions, ["Tennessee"] * 4, [PATH] * 4)
    assert [v.reason for v in verdicts] == ["ok", "ok", "not_retrievable", "too_short"]
    assert verdicts[0] == Verdict(True, "ok", ("a0", "a1"))  # the static verdict, unchanged
    assert verdicts[2].evidence == ("a0", "a1") and "first hop's passage a0" in verdicts[2].detail
    # one batched search, of the questions that passed the static checks only
    assert pipe.retriever.queries == [[REACHABLE, BY_TARGET, UNREACHABLE]]


def test_n_is_what_the_first_search_sees(pipeline):
    def reason(pipe: EvidencePipeline) -> str:
        return pipe.validate_questions([RANK_TWO], ["Tennessee"], [PATH])[0].reason

    assert [h.passage_id for h in pipeline().retriever.search([RANK_TWO], 2)[0]] == ["a3", "a0"]
    assert (reason(pipeline(k=1)), reason(pipeline(k=2))) == ("not_retrievable", "ok")
    # default N: ranker.n_candidates, which the evidence actor passes as first_search_k
    assert (reason(pipeline(k=None, first_search_k=1)), reason(pipeline(k=None, first_search_k=2))) == \
        ("not_retrievable", "ok")


def test_the_check_is_off_unless_asked_for(pipeline):
    pipe = pipeline(retrievable=False)
    assert pipe.validate_questions([UNREACHABLE], ["Tennessee"], [PATH])[0].ok
    assert pipe.retriever.queries == []


def test_the_target_is_found_with_the_projects_normalization(pipeline):
    corpus = Corpus(PASSAGES, name="retrievable")
    index = SimpleNamespace(corpus=corpus)
    ok = Verdict(True, "ok", ("x",))
    hits = ["a1"]  # "Nashville is the capital of Tennessee."
    other_path = EvidencePath("Tennessee", (Hop("X", "Tennessee", "X is in Tennessee.", "zz", "X", 1.0, "relation"),))
    assert retrievability_verdict(ok, "the TENNESSEE", other_path, hits, index) == ok  # article, case
    assert retrievability_verdict(ok, "Nashville", other_path, ["a3"], index).reason == "not_retrievable"
    assert retrievability_verdict(ok, "Grand Ole Opry", other_path, ["a3"], index) == ok  # the title counts
    rejected = Verdict(False, "leaks_target")
    assert retrievability_verdict(rejected, "x", other_path, [], index) is rejected  # earlier reasons win


def test_not_retrievable_is_counted_in_the_steps_reasons(pipeline):
    cands = []
    for i, question in enumerate((REACHABLE, UNREACHABLE)):
        cand = Candidate(0, "ref", i, Completion([1], [2], "x", [-0.1], "eos"), target="Tennessee", question=question)
        cand.target_verdict, cand.path = Verdict(True, "ok", ("a1",)), PATH
        cands.append(cand)
    check_questions(pipeline(), cands)
    assert [(c.stage, c.reason) for c in cands] == [("accepted", "accepted"), ("question", "not_retrievable")]
    assert cands[1].stages_passed == 5  # past the question parse and form, rejected by a content check
    assert step_metrics(cands, [], [], top_k=3)["reasons"] == {"not_retrievable": 1}
