"""Proposer parsing, prompts and reward against hand-computed cases (SPEC §3.1, §3.5)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

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
    path = {"hops": [{"head": "Hamlet", "tail": "Denmark", "sentence": "Hamlet is set in Denmark.", "title": "Hamlet"}]}
    q = question_messages("Denmark", path)[-1]["content"]
    assert "Hamlet -> Denmark" in q and "Hamlet is set in Denmark." in q
    assert question_messages("X", {})[-1]["content"]  # a path without hops still renders
