"""Proposer parsing, prompts and reward against hand-computed cases (SPEC §3.1, §3.5)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coevo.core.config import compose, to_object
from coevo.core.types import EvidencePath, Hop, Verdict
from proposer.pipeline import PENDING, check_targets, propose_targets
from proposer.prompts import parse_question, parse_target, question_messages, target_messages
from proposer.reward import difficulty_reward, proposer_reward


@pytest.mark.parametrize("text,expected", [
    ("<target>Marie Curie</target>", ("Marie Curie", "ok")),
    ("I think <target> \"Lake  Geneva\" </target> fits.", ("Lake Geneva", "ok")),
    ("<TARGET>Rome</TARGET>", ("Rome", "ok")),
    ("<target>Rome</target> or <target>Rome</target>", ("Rome", "ok")),
    ("<target>Rome</target> or <target>Milan</target>", (None, "multiple_targets")),
    ("Marie Curie", (None, "no_target_tag")),
    ("<target>Rome", (None, "no_target_tag")),
    ("<target>  </target>", (None, "empty")),
    ("<target>''</target>", (None, "empty")),
    (None, (None, "not_text")),
])
def test_parse_target(text, expected):
    assert parse_target(text) == expected


def test_parse_question():
    assert parse_question("<question>Who led it?</question>") == ("Who led it?", "ok")
    assert parse_question("Who led it?") == (None, "no_question_tag")


@given(st.text())
def test_parsers_survive_arbitrary_text(text):
    for parse in (parse_target, parse_question):
        value, reason = parse(text)
        assert (value is None) != (reason == "ok")


@pytest.mark.parametrize("p,abs_r,quad_r", [
    (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.5, 1.0, 1.0), (0.25, 0.5, 0.75), (0.75, 0.5, 0.75), (0.125, 0.25, 0.4375),
])
def test_difficulty_reward(p, abs_r, quad_r):
    assert difficulty_reward(p, "abs") == pytest.approx(abs_r)
    assert difficulty_reward(p, "quadratic") == pytest.approx(quad_r)


def test_invalid_penalty_and_bad_kind():
    assert proposer_reward(None, invalid_penalty=0.5) == -0.5
    assert proposer_reward(0.5) == 1.0
    with pytest.raises(ValueError, match="proposer.reward"):
        difficulty_reward(0.5, "cubic")


def test_prompts_mention_inputs_and_conceal_nothing_else():
    msgs = target_messages("who wrote hamlet")
    assert "who wrote hamlet" in msgs[-1]["content"] and "<target>" in msgs[-1]["content"]
    hop = Hop("Hamlet", "Denmark", "Hamlet is set in Denmark.", "p1", "Hamlet", 1.0, "relation")
    q = question_messages("Denmark", EvidencePath("Denmark", (hop,)))[-1]["content"]
    assert "Hamlet -> Denmark" in q and "Hamlet is set in Denmark." in q and "(Hamlet)" in q
    assert question_messages("X", EvidencePath("X"))[-1]["content"]  # a path without hops still renders


def test_stage_rejections_are_verdicts(scripted_policy):
    class NoEvidence:
        def validate_targets(self, targets, references):
            return [Verdict(False, "no_corpus_support", (), "none") for _ in targets]

    replies = {0: "Rome</target>", 1: "x" * 100}  # the second is cut by the token budget: no closing tag
    policy = scripted_policy(lambda prompt, occ: replies[int("second" in prompt)])
    cfg = to_object(compose(["experiment=smoke"])).proposer
    cands = propose_targets(policy, [(0, "first question"), (1, "second question")], cfg, seed=0)
    check_targets(NoEvidence(), cands)
    rome, cut = cands
    assert rome.target_verdict == Verdict(False, "no_corpus_support", (), "none") and rome.reason == "no_corpus_support"
    assert cut.target_verdict == Verdict(False, "parse:no_target_tag") and cut.reason == "parse:no_target_tag"
    assert rome.question_verdict is PENDING and cut.to_record(None, [], {})["question_verdict"] == PENDING.to_record()
