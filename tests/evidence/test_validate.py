"""Target validation (docs/method.md §3.2), static question validation (docs/method.md §3.4) and the batch pipeline."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from coevo.core.config import EvidenceConfig
from coevo.core.types import QUESTION_FORM_REASONS, EvidencePath, Hop, Verdict
from evidence.corpus import Passage
from evidence.paths import direct_path
from evidence.pipeline import EvidencePipeline
from evidence.validate import (
    distinctive_tokens,
    open_question_verdict,
    spaced_key,
    support_verdict,
    target_head,
    validate_question,
)


def validate_target(target, retriever, index, reference_question=None, max_chars=80):
    """One target through the pipeline's batched validation (the production path), as a batch of one."""
    pipe = EvidencePipeline(None, retriever, index, EvidenceConfig(), max_target_chars=max_chars)  # type: ignore[arg-type]
    return pipe.validate_targets([target], [reference_question])[0]


def _hop(head: str, tail: str, sentence: str, pid: str) -> Hop:
    return Hop(head=head, tail=tail, sentence=sentence, passage_id=pid, title=head, score=1.0, cue="relation")


PATH = EvidencePath("Tennessee", (
    _hop("Hank Snow", "Nashville", "Hank Snow moved to Nashville in 1949.", "t1"),
    _hop("Nashville", "Tennessee", "Nashville is the capital of Tennessee.", "t2"),
))


@pytest.mark.slow
@pytest.mark.parametrize("target, reference, reason", [
    ("", None, "empty"),
    ("   ", None, "empty"),
    ("?!…", None, "empty"),
    ("the", None, "empty"),
    (None, None, "empty"),
    ("Hank Snow " * 9, None, "too_long"),
    ("Who recorded Hello Love?", "who recorded hello love", "copies_reference"),
    ("Hank Snow", "Hank Snow?", "copies_reference"),
    ("was born in", None, "not_entity"),
    ("quickly and slowly", "Who recorded Hello Love?", "not_entity"),
    ("Barack Obama", None, "no_corpus_support"),
    ("Hank Snow", "Who recorded Hello Love?", "ok"),
    ("hank snow", None, "ok"),  # lower case: known to the entity index
    ("Vienna", None, "ok"),
])
def test_validate_target_reasons(toy_retriever, toy_index, target, reference, reason):
    verdict = validate_target(target, toy_retriever, toy_index, reference_question=reference)
    assert verdict.reason == reason and verdict.ok == (reason == "ok")


@pytest.mark.slow
def test_target_support_evidence(toy_retriever, toy_index):
    verdict = validate_target("Hank Snow", toy_retriever, toy_index)
    assert set(verdict.evidence) == {"t0", "t1"} and verdict.detail == "PERSON"
    assert validate_target("Nashville", toy_retriever, toy_index, max_chars=5).reason == "too_long"
    assert verdict.to_record() == {"ok": True, "reason": "ok", "evidence": list(verdict.evidence), "detail": "PERSON"}


@pytest.mark.parametrize("question, target, reason", [
    ("", "Tennessee", "empty"),
    (None, "Tennessee", "empty"),
    ("Name the state of the city Hank Snow moved to.", "Tennessee", "not_question"),
    ("Which state?", "Tennessee", "too_short"),
    ("Which state " + "really " * 60 + "is it?", "Tennessee", "too_long"),
    ("Where did Hank Snow move? Which state is it in?", "Tennessee", "multiple_questions"),
    ("Which state is the city Hank Snow moved to in 1949 the capital of?", "Tennessee", "ok"),
    # leakage: exact, case, article, punctuation
    ("Is Nashville the capital of Tennessee or not?", "Tennessee", "leaks_target"),
    ("Is Nashville the capital of TENNESSEE or not?", "tennessee", "leaks_target"),
    ("Which band did the Beatles influence in Nashville?", "The Beatles", "leaks_target"),
    ("Which band did Beatles' manager sign in 1962?", "the beatles", "leaks_target"),
    # a distinctive token of a multi-token target
    ("Which singer named Jennings recorded in Nashville?", "Waylon Jennings", "leaks_target_token"),
    ("Which lab did Curie found in Warsaw in 1932?", "Marie Curie", "leaks_target_token"),
    # generic head words and tokens of other path entities are not leaks
    ("Which university did the author of the book attend?", "University of Oxford", "ok"),
    ("Which team moved from Nashville to New York in 1903?", "New York Yankees", "leaks_target_token"),
])
def test_validate_question_reasons(question, target, reason):
    verdict = validate_question(question, target, PATH)
    assert verdict.reason == reason and verdict.ok == (reason == "ok")
    # the form checks' codes are the proposer penalty's form stage; leakage is past the form
    assert (reason in QUESTION_FORM_REASONS) == (reason in (
        "empty", "not_question", "too_short", "too_long", "multiple_questions"))
    if reason in ("ok", "leaks_target", "leaks_target_token"):
        assert verdict.evidence == ("t1", "t2")


def test_tokens_shared_with_path_entities_are_not_leaks():
    path = EvidencePath("New York Yankees", (
        _hop("New York City", "New York Yankees", "The New York Yankees play in New York City.", "p1"),))
    question = "Which baseball team plays in New York City?"
    assert validate_question(question, "New York Yankees", path).reason == "ok"
    assert distinctive_tokens("New York Yankees", ["New York City"]) == ["yankees"]
    assert distinctive_tokens("Paris", []) == []  # single-token targets: only the whole form counts
    assert distinctive_tokens("University of Oxford") == ["oxford"]


@pytest.mark.parametrize("path", [None, EvidencePath("x", ()), {"target": "x"}, {"hops": "junk"},
                                  {"hops": [{"head": "a"}]}, "a string", 42,
                                  EvidencePath("x", (_hop("a", "b", "", "p1"),))])
def test_no_evidence(path):
    assert validate_question("Which state is the city Hank Snow moved to in?", "Tennessee", path).reason \
        == "no_evidence"


def test_path_from_task_dump_dict():
    assert validate_question("Which state is the city Hank Snow moved to in?", "Tennessee",
                             PATH.to_record()) == Verdict(True, "ok", ("t1", "t2"))


@pytest.mark.slow
def test_pipeline_batches(toy_corpus, toy_retriever, toy_index):
    pipe = EvidencePipeline(toy_corpus, toy_retriever, toy_index, EvidenceConfig())
    targets = ["Tennessee", "", "Barack Obama", "Hank Snow", 7]
    verdicts = pipe.validate_targets(targets, ["Who sang Hello Love?"] * 2)
    assert [v.reason for v in verdicts] == ["ok", "empty", "no_corpus_support", "ok", "empty"]
    assert verdicts == [validate_target(t, toy_retriever, toy_index, r)  # a batch answers as its items alone
                        for t, r in zip(targets, ["Who sang Hello Love?"] * 2 + [None] * 3)]
    paths = pipe.build_paths(["Tennessee", "Atlantis", "Marie Curie"], rng=5)
    assert paths == pipe.build_paths(["Tennessee", "Atlantis", "Marie Curie"], rng=5)
    assert len(paths[0]) == 1 and paths[1] == [] and paths[2]
    checks = pipe.validate_questions(["Which state is the city Hank Snow moved to in?", "Tennessee?"],
                                     ["Tennessee", "Tennessee"], [paths[0][0], paths[0][0]])
    assert [c.reason for c in checks] == ["ok", "too_short"]


@pytest.mark.parametrize("question, target, reason", [
    # punctuation inside the target is a word break as well as a deletion: both spellings leak
    ("Which hero did Stan Lee create as Spider Man in 1962?", "Spider-Man", "leaks_target"),
    ("Which hero did Stan Lee create as Spider-Man in 1962?", "Spider Man", "leaks_target"),
    ("Which hero did Stan Lee create as Spiderman in 1962?", "Spider-Man", "leaks_target"),
    ("Which hero did Stan Lee create as spider-man in 1962?", "Spider-Man", "leaks_target"),
    ("Which band recorded the album Back in Black, AC DC?", "AC/DC", "leaks_target"),
    # a one-word hyphenated target is checked by its whole forms only: its parts are not tokens
    ("Which man did Stan Lee create in 1962 for a comic?", "Spider-Man", "ok"),
    # a part of a hyphenated token of a multi-word target is a distinctive token
    ("Which philosopher named Paul wrote Nausea in Nashville?", "Jean-Paul Sartre", "leaks_target_token"),
    ("Which philosopher named Jean-Paul wrote Nausea in Nashville?", "Jean-Paul Sartre", "leaks_target_token"),
    ("Which philosopher wrote Nausea in Nashville?", "Jean-Paul Sartre", "ok"),
])
def test_leakage_with_punctuation(question, target, reason):
    verdict = validate_question(question, target, PATH)
    assert verdict.reason == reason and verdict.ok == (reason == "ok")


def test_spaced_key_and_distinctive_tokens():
    assert spaced_key("Spider-Man") == "spider man" and spaced_key("Mercury (planet)") == "mercury"
    assert spaced_key("The Beatles'") == "beatles"
    assert distinctive_tokens("Spider-Man") == []
    assert distinctive_tokens("Jean-Paul Sartre") == ["jeanpaul", "sartre", "jean", "paul"]
    # tokens of another path entity, in either spelling, are not leaks
    assert distinctive_tokens("Jean-Paul Sartre", ["Jean Genet"]) == ["jeanpaul", "sartre", "paul"]


@pytest.mark.parametrize("target, head", [
    ("Abuja, Nigeria", "Abuja"), ("Mercury (planet)", "Mercury"), ("Paris, Texas (film)", "Paris"),
    ("Abuja", None), (", Nigeria", None), ("", None), (None, None),
])
def test_target_head(target, head):
    assert target_head(target) == head


def test_support_from_the_head_of_a_qualified_target(toy_corpus):
    index = SimpleNamespace(corpus=toy_corpus)  # support needs only the passages
    hits = ["t2", "t10", "t9"]  # Nashville, Vienna, Danube
    assert support_verdict("Vienna, Austria", hits, index, "GPE").reason == "no_corpus_support"  # default: off
    verdict = support_verdict("Vienna, Austria", hits, index, "GPE", try_head=True)
    # "Vienna" is the title of t10 and occurs in t9's text
    assert verdict == Verdict(True, "ok", ("t10", "t9"), "GPE head:Vienna")
    # a target the whole form supports is unchanged by the option (the head is never tried)
    for try_head in (False, True):
        verdict = support_verdict("Nashville", hits, index, "GPE", try_head=try_head)
        assert verdict == Verdict(True, "ok", ("t2",), "GPE")
    assert support_verdict("Abuja, Nigeria", hits, index, "GPE", try_head=True).reason == "no_corpus_support"


def test_direct_path_is_one_uncertified_hop_from_the_answer_passage():
    page = Passage("p7", "Hank Snow", "Hank Snow was a singer. In 1949 he moved to Nashville, Tennessee. He died.")
    path = direct_path("Tennessee", page)
    assert [(h.head, h.tail, h.sentence, h.passage_id, h.cue) for h in path.hops] == [
        ("Hank Snow", "Tennessee", "In 1949 he moved to Nashville, Tennessee.", "p7", "direct")]
    # no sentence names the target: the first sentence is shown
    assert direct_path("Ohio", page).hops[0].sentence == "Hank Snow was a singer."
    # question checks take it like any path
    assert validate_question("Which state did Hank Snow move to in 1949?", "Tennessee", path) == \
        Verdict(True, "ok", ("p7",))


def test_a_head_equal_to_the_target_does_not_license_its_tokens():
    own_page = EvidencePath("Waylon Jennings", (_hop("Waylon Jennings", "Waylon Jennings",
                                                     "Waylon Jennings was a singer.", "p1"),))
    assert validate_question("Which singer named Jennings recorded in Nashville?", "Waylon Jennings",
                             own_page).reason == "leaks_target_token"


# Questions run 6's trained proposer wrote (docs/learning.md, task quality), and near misses.
@pytest.mark.parametrize("question, reason", [
    ("Is Homer a hero of the Trojan War?", "polar_question"),
    ("Is it possible to use a browser to display content locally on a device?", "polar_question"),
    ("  does the Nile flow north?", "polar_question"),
    ("Were the Allies negotiating in Paris in 1919?", "polar_question"),
    ("You don't have the answer to this question!</response> Question: What is a species known as Agnat?", "markup"),
    ("What is the <b>capital</b> of Nigeria?", "markup"),
    ("What lies between the Black Sea and the Caspian Sea?", "ok"),
    ("Isle of Man's capital is which town?", "ok"),  # "Isle", not "Is"
    ("Which planet has the moon Titan, and is it a gas giant?", "ok"),  # only the opening word decides
    ("Can you tell me which city is Egypt's capital?", "ok"),  # run 7: a request for a name
    ("Do you know who painted the ceiling?", "ok"),
    ("What does 3 < 4 mean in the puzzle?", "ok"),  # a bare "<" is not a tag
])
def test_open_question_reasons(question, reason):
    verdict = open_question_verdict(Verdict(True, "ok", ("t1",)), question)
    assert verdict.reason == reason and verdict.ok == (reason == "ok") and verdict.evidence == ("t1",)


def test_open_question_keeps_an_earlier_rejection():
    rejected = Verdict(False, "leaks_target", ("t1",), "tennessee")
    assert open_question_verdict(rejected, "Is Tennessee a state?") is rejected


@pytest.mark.parametrize("enabled, reasons", [(False, ["ok", "ok"]), (True, ["polar_question", "ok"])])
def test_pipeline_applies_open_question_only_when_enabled(enabled, reasons):
    pipe = EvidencePipeline(None, None, None, EvidenceConfig(open_question=enabled))  # type: ignore[arg-type]
    questions = ["Is Nashville the capital of the state Hank Snow lived in?",
                 "Which state is the city Hank Snow moved to in 1949 the capital of?"]
    assert [v.reason for v in pipe.validate_questions(questions, ["Tennessee"] * 2, [PATH] * 2)] == reasons
