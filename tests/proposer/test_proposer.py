"""Proposer parsing, prompts and reward against hand-computed cases (docs/method.md §3.1, §3.5)."""
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coevo.core.config import compose, to_object
from coevo.core.grpo import GroupStats
from coevo.core.types import Completion, EvidencePath, Hop, Verdict
from proposer.pipeline import (
    PENDING,
    Candidate,
    assign_proposer_rewards,
    attach_paths,
    check_targets,
    grounding_titles,
    propose_questions,
    propose_targets,
    proposer_sequences,
)
from proposer.prompts import parse_question, parse_target, question_messages, target_messages
from proposer.reward import difficulty_reward, invalid_reward, proposer_reward


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
    # run 12: "1. What is the name of the astronaut …" (the "1" then read as an unsupported word)
    assert parse_question("<question>1. What is the name of the astronaut?</question>") == (
        "What is the name of the astronaut?", "ok")
    assert parse_question("<question>- Who led it?</question>") == ("Who led it?", "ok")
    assert parse_question("<question>1989 was the year of what?</question>") == ("1989 was the year of what?", "ok")
    assert parse_question("<question>2. 3 kings?</question>") == ("2. 3 kings?", "ok")  # no word after the marker
    # a label before the question (run 13: "Your question: What is the eighth studio album …" read as meta)
    assert parse_question("<question>Your question: Who led it?</question>") == ("Who led it?", "ok")
    assert parse_question("<question>1. Question 2: Who led it?</question>") == ("Who led it?", "ok")
    meta = "What is the answer to the question: who led it?"
    assert parse_question(f"<question>{meta}</question>") == (meta, "ok")  # meta wording stays for meta_question


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


@pytest.mark.parametrize("p,expected", [(0.0, 1.0), (0.25, 0.75), (0.5, 0.5), (1.0, 0.0), (1.5, 0.0), (-1.0, 1.0)])
def test_adversarial_reward_is_one_minus_p(p, expected):
    assert difficulty_reward(p, "adversarial") == pytest.approx(expected)
    assert proposer_reward(p, kind="adversarial") == pytest.approx(expected)


def test_adversarial_is_a_config_choice():
    cfg = to_object(compose(["experiment=smoke", "proposer.reward=adversarial"]))
    assert cfg.proposer.reward == "adversarial"


@pytest.mark.parametrize("passed,expected", [(0, -0.5), (1, -5 / 12), (2, -1 / 3), (3, -0.25), (4, -1 / 6),
                                             (5, -1 / 12), (9, -1 / 12)])
def test_invalid_reward_by_stage(passed, expected):
    # -0.5 * (6 - k) / 6
    assert invalid_reward(0.5, passed, by_stage=True) == pytest.approx(expected)
    assert invalid_reward(0.5, passed, by_stage=False) == -0.5  # today's flat penalty
    assert proposer_reward(None, 0.5, "abs", passed, by_stage=True) == pytest.approx(expected)


def _cand(ref_index, index, stage, reason, reward=None, question=True):
    target = Completion([1, 2], [3, 4, 5], "X</target>", [-0.1, -0.2, -0.3], "stop")
    qcomp = Completion([6], [7, 8], "Q?</question>", [-0.4, -0.5], "stop") if question else None
    cand = Candidate(ref_index, "ref", index, target, question_completion=qcomp, stage=stage, reason=reason)
    cand.reward = reward
    return cand


@pytest.mark.parametrize("stage,reason,passed", [
    ("target", "parse:no_target_tag", 0), ("target", "not_entity", 1), ("target", "no_corpus_support", 1),
    ("path", "no_certified_path", 2), ("question", "parse:no_question_tag", 3), ("question", "too_short", 4),
    ("question", "not_question", 4), ("question", "leaks_target", 5), ("question", "unsupported_relation", 5),
    ("accepted", "accepted", 6),
])
def test_stages_passed(stage, reason, passed):
    assert _cand(0, 0, stage, reason).stages_passed == passed


def test_a_real_question_rejected_for_its_content_beats_a_junk_one():
    # run 13: "your question?" (too_short) earned what a rejected real question earned, and won
    junk, real = _cand(0, 0, "question", "too_short"), _cand(0, 1, "question", "off_target_page")
    assert proposer_reward(None, 0.5, "abs", junk.stages_passed, by_stage=True) < \
        proposer_reward(None, 0.5, "abs", real.stages_passed, by_stage=True) < 0.0


def test_stage_graded_penalty_gives_a_rejected_group_variance():
    """Two unparsable targets and two valid targets whose questions leak: flat penalty -> one
    zero-variance group; graded -> rewards [-0.5, -0.5, -1/12, -1/12] (a leak passed the question's
    form: 5 of 6 stages), mean -7/24, unbiased std sqrt(4 * (5/24)^2 / 3), advantages
    -+(5/24) / that = -+sqrt(3/4) = -+0.8660."""
    def group():
        return [_cand(0, 0, "target", "parse:no_target_tag", question=False),
                _cand(0, 1, "target", "parse:no_target_tag", question=False),
                _cand(0, 2, "question", "leaks_target"), _cand(0, 3, "question", "leaks_target")]

    base = to_object(compose(["experiment=smoke"])).proposer
    flat = group()
    assign_proposer_rewards(flat, base)
    assert [c.reward for c in flat] == [-0.5] * 4
    assert proposer_sequences(flat) == ([], GroupStats(groups=1, zero_var_groups=1, members=4))
    graded = group()
    assign_proposer_rewards(graded, dataclasses.replace(base, invalid_penalty_by_stage=True))
    assert [c.reward for c in graded] == pytest.approx([-0.5, -0.5, -1 / 12, -1 / 12])
    batch, info = proposer_sequences(graded)
    assert info == GroupStats(groups=1, zero_var_groups=0, members=4)
    # call 1 of each candidate, call 2 of the two that reached the question
    assert [round(s.advantage, 4) for s in batch] == [-0.866, -0.866, 0.866, 0.866, 0.866, 0.866]


def test_keep_zero_advantage_keeps_zero_variance_groups():
    """Group 0: rewards [1.0, 0.0] -> advantages +-0.7071; group 1: [-0.5, -0.5] -> zero variance."""
    cands = [_cand(0, 0, "accepted", "accepted", 1.0), _cand(0, 1, "accepted", "accepted", 0.0),
             _cand(1, 0, "target", "not_entity", -0.5, question=False),
             _cand(1, 1, "target", "not_entity", -0.5, question=False)]
    dropped, info = proposer_sequences(cands)
    assert [round(s.advantage, 4) for s in dropped] == [0.7071, 0.7071, -0.7071, -0.7071]
    kept, kept_info = proposer_sequences(cands, keep_zero=True)
    assert [round(s.advantage, 4) for s in kept] == [0.7071, 0.7071, -0.7071, -0.7071, 0.0, 0.0]
    assert info == kept_info == GroupStats(groups=2, zero_var_groups=1, members=4)
    # loss-masked tokens (the token-mean denominator): 2 candidates * (3 + 2) before, + 2 * 3 kept
    assert sum(sum(s.loss_mask) for s in dropped) == 10 and sum(sum(s.loss_mask) for s in kept) == 16


def test_grounding_titles_are_distinct_top_k_titles(overlap_retriever, passages):
    extra = dataclasses.replace(passages[0], id="p9", text="Paris hosts the capital city hall of France.")
    retriever = overlap_retriever(passages + [extra])
    titles = grounding_titles(retriever, ["capital of France", "zzz"], 3)
    # word overlap with {capital, of, france}: p0 Paris 3, p9 Paris 3, p2 Berlin 2, p3 France 2: the top 3
    # passages are p0, p9, p2 and the repeated title is shown once
    assert titles == [("Paris", "Berlin"), ()]  # nothing retrieved for "zzz": nothing shown
    assert grounding_titles(retriever, ["capital of France"], 0) == [()]  # off: no search at all
    assert len(retriever.queries) == 1


def test_grounded_prompt_lists_titles_and_records_them(scripted_policy):
    prompts = []
    policy = scripted_policy(lambda prompt, occ: prompts.append(prompt) or "Lyon</target>")
    cfg = dataclasses.replace(to_object(compose(["experiment=smoke"])).proposer, group_size=1)
    cands = propose_targets(policy, [(0, "who founded paris"), (1, "other")], cfg, seed=0,
                            titles=[("Paris", "France"), ()])
    assert "Wikipedia articles found for it: Paris; France" in prompts[0] and "who founded paris" in prompts[0]
    assert "Wikipedia articles found" not in prompts[1]
    assert target_messages("q")[-1]["content"] == target_messages("q", ())[-1]["content"]  # off = ZEST's prompt
    assert cands[0].to_record(None, [], {})["grounding_titles"] == ["Paris", "France"]
    assert cands[1].to_record(None, [], {})["grounding_titles"] == []


@pytest.mark.parametrize("question_stop,reply,expected", [
    (True, "Who led it? Answer: Rome</question>", ("Who led it?", "ok")),  # cut after the first "?"
    (False, "Who led it? Answer: Rome</question>", ("Who led it? Answer: Rome", "ok")),
    (True, "Who led it</question> more?", ("Who led it", "ok")),  # the closing tag came first
    (True, "no question mark at all " * 20, (None, "parse:no_question_tag")),  # budget cut: still unclosed
    # without the lever EOS closes the tag after everything; static checks reject it later (multiple_questions)
    (False, "Where is it?</answer> Question: Where?", ("Where is it?</answer> Question: Where?", "ok")),
    (True, "Where is it?</answer> Question: Where?", ("Where is it?", "ok")),
])
def test_question_stop_ends_the_question_at_its_mark(scripted_policy, question_stop, reply, expected):
    hop = Hop("Hamlet", "Denmark", "Hamlet is set in Denmark.", "p1", "Hamlet", 1.0, "relation")
    cfg = dataclasses.replace(to_object(compose(["experiment=smoke"])).proposer, question_stop=question_stop,
                              max_new_tokens=64)
    cand = Candidate(0, "ref", 0, Completion([1], [2], "Denmark</target>", [-0.1], "stop"), target="Denmark")
    cand.path = EvidencePath("Denmark", (hop,))
    propose_questions(scripted_policy(lambda prompt, occ: reply), [cand], cfg, seed=0)
    got = (cand.question, "ok" if cand.question is not None else cand.reason)
    assert got == expected
    assert cand.question_completion.text in reply  # the sampled tokens are what the policy trains on


def test_direct_generation_asks_for_the_supporting_passage_not_a_path():
    class Evidence:
        calls: list = []

        def build_paths(self, targets, seed):
            self.calls.append(("paths", targets))
            return [[] for _ in targets]

        def direct_paths(self, targets, support_ids):
            self.calls.append(("direct", targets, support_ids))
            return [[EvidencePath(t)] for t in targets]

    def cand(target, evidence):
        c = Candidate(0, "ref", 0, Completion([1], [2], "x", [-0.1], "eos"), target=target)
        c.target_verdict = Verdict(True, "ok", evidence)
        return c

    cands = [cand("Rome", ("p1", "p2")), cand("Oslo", ("p3",))]
    attach_paths(Evidence(), cands, seed=0, direct=True)
    assert Evidence.calls == [("direct", ["Rome", "Oslo"], [["p1", "p2"], ["p3"]])]
    assert [c.path.target for c in cands] == ["Rome", "Oslo"] and all(c.paths_found == 1 for c in cands)
    attach_paths(Evidence(), [cand("Rome", ("p1",))], seed=0)
    assert Evidence.calls[-1] == ("paths", ["Rome"])


def test_a_question_prompt_over_budget_is_rejected_with_its_reason_and_never_generated(scripted_policy):
    # Two candidates: one with a short path, one whose evidence sentence is far over the budget.
    short = Hop("Hamlet", "Denmark", "Hamlet is set in Denmark.", "p1", "Hamlet", 1.0, "relation")
    long = Hop("Hamlet", "Denmark", "Hamlet is set in Denmark. " * 400, "p1", "Hamlet", 1.0, "relation")
    base = to_object(compose(["experiment=smoke"])).proposer
    cands = []
    for i, hop in enumerate((short, long)):
        cand = Candidate(0, "ref", i, Completion([1], [2], "Denmark</target>", [-0.1], "stop"), target="Denmark")
        cand.path = EvidencePath("Denmark", (hop,))
        cands.append(cand)
    policy = scripted_policy(lambda prompt, occ: "Where is Hamlet set?</question>")
    limit = len(policy.chat_prompt_ids(question_messages("Denmark", cands[0].path))) + 50
    cfg = dataclasses.replace(base, max_prompt_tokens=limit, max_new_tokens=64)
    propose_questions(policy, cands, cfg, seed=0)
    assert cands[0].question == "Where is Hamlet set?" and cands[0].live
    assert (cands[1].stage, cands[1].reason, cands[1].question) == ("question", "prompt_budget", None)
    assert cands[1].question_verdict == Verdict(False, "prompt_budget")
    assert cands[1].stages_passed == 3  # like a question that did not parse: target parse, validation, path


def test_a_tasks_answers_are_the_target_its_supported_head_and_the_path_tail() -> None:
    path = EvidencePath("Abuja, Nigeria", (Hop("Nigeria", "Abuja", "Abuja is the capital of Nigeria.", "p1", "Nigeria",
                                                1.0, "capital"),))
    cand = Candidate(0, "ref", 0, Completion([1], [2], "x", [-0.1], "eos"), target="Abuja, Nigeria",
                     target_verdict=Verdict(True, "ok", ("p1",), "GPE head:Abuja"), path=path)
    assert cand.answers == ["Abuja, Nigeria", "Abuja"]  # the tail repeats the head: one alias
    cand.target_verdict = Verdict(True, "ok", ("p1",), "GPE")  # the whole target was supported
    cand.path = dataclasses.replace(path, hops=(dataclasses.replace(path.hops[0], tail="Zürich"),))
    assert cand.answers == ["Abuja, Nigeria", "Zürich", "Zurich"]
    assert cand.to_record(None, [], {})["answers"] == cand.answers


def test_a_tasks_guide_searches_each_hops_head_but_never_an_answer() -> None:
    hop = Hop("Africa", "Nigeria", "Nigeria is in Africa.", "p0", "Nigeria", 1.0, "in")
    last = Hop("Nigeria", "Abuja", "Abuja is the capital of Nigeria.", "p1", "Nigeria", 1.0, "capital")
    cand = Candidate(0, "ref", 0, Completion([1], [2], "x", [-0.1], "eos"), target="Abuja",
                     target_verdict=Verdict(True, "ok", ("p1",), "GPE"), path=EvidencePath("Abuja", (hop, last)))
    assert cand.guide == ["Africa", "Nigeria"]
    cand.path = EvidencePath("Abuja", (dataclasses.replace(hop, head="Abuja city"), last))
    assert cand.guide == ["Nigeria"]  # a head holding the answer would make the guided answer an echo
    cand.path = None
    assert cand.guide == []
