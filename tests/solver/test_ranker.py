"""Ranker prompt, strict rerank parsing, modes and the search tool (docs/method.md §4.3, §4.6)."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.core.budget import PromptBudgetError
from coevo.core.config import RankerConfig, SolverConfig, compose, to_object
from coevo.core.role_config import ranker_policy_config, shares_solver_policy
from evidence.corpus import Passage
from solver.ranker import (
    Ranker,
    SearchRequest,
    build_ranker,
    oracle_order,
    parse_rerank,
    ranker_messages,
)
from solver.ranker_prompt import fit_prompt
from solver.search_tool import SearchTool, format_documents

REASON = "<reason>doc 3 names the capital</reason>"


@pytest.mark.parametrize("text,expected", [
    (REASON + "<rerank>[3] > [1] > [2]</rerank>", [2, 0, 1]),
    (REASON + "\n<rerank>[3]>[1]>[2]</rerank>  \n", [2, 0, 1]),
    ("prefix " + REASON + "<rerank> [5] >  [4] > [1] </rerank>", [4, 3, 0]),
])
def test_parse_rerank_ok(text, expected):
    assert parse_rerank(text, 5, 3) == (expected, "ok")


@pytest.mark.parametrize("text,code", [
    ("", "no_rerank_tag"),
    ("[1] > [2] > [3]", "no_rerank_tag"),
    (REASON + "<rerank>[1] > [2] > [3]", "unclosed_rerank"),
    (REASON + "<rerank>[1] > [2] > [3]</rerank><rerank>[1]</rerank>", "multiple_rerank_tags"),
    ("<rerank>[1] > [2] > [3]</rerank>", "no_reason_tag"),
    ("<reason>a<rerank>[1] > [2] > [3]</rerank>", "bad_reason_tag"),
    ("<rerank>[1] > [2] > [3]</rerank>" + REASON, "bad_tag_order"),
    (REASON + "<rerank>[1] > [2] > [3]</rerank> because", "text_after_rerank"),
    (REASON + "<rerank>1 > 2 > 3</rerank>", "bad_syntax"),
    (REASON + "<rerank>[1], [2], [3]</rerank>", "bad_syntax"),
    (REASON + "<rerank>[1] > [2] ></rerank>", "bad_syntax"),
    (REASON + "<rerank>[-1] > [2] > [3]</rerank>", "bad_syntax"),
    (REASON + "<rerank></rerank>", "bad_syntax"),
    (REASON + "<rerank>[0] > [2] > [3]</rerank>", "index_out_of_range"),
    (REASON + "<rerank>[6] > [2] > [3]</rerank>", "index_out_of_range"),
    (REASON + "<rerank>[" + "9" * 5000 + "] > [2] > [3]</rerank>", "index_out_of_range"),
    (REASON + "<rerank>[2] > [2] > [3]</rerank>", "duplicate_index"),
    (REASON + "<rerank>[2] > [3]</rerank>", "wrong_count"),
    (REASON + "<rerank>[2] > [3] > [4] > [1]</rerank>", "wrong_count"),
])
def test_parse_rerank_failures(text, code):
    assert parse_rerank(text, 5, 3) == (None, code)


FRAGMENTS = ["<reason>", "</reason>", "<rerank>", "</rerank>", "[", "]", ">", " ", "\n", "1", "3", "12",
             "99999999", "-", "[2]", " > ", "x", "<", "/", "é", "\x00", "<rerank", "reason>"]


def test_parse_rerank_fuzz_10000_fragment_strings():
    rng = random.Random(0)
    verdicts = set()
    for _ in range(10_000):
        text = "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 30)))
        indices, code = parse_rerank(text, rng.randint(0, 12), rng.randint(1, 5))
        assert isinstance(code, str) and (indices is None) == (code != "ok")
        verdicts.add(code)
    assert len(verdicts) >= 6  # the generator reaches many different verdicts


@settings(max_examples=300, deadline=None)
@given(st.text(), st.integers(-3, 60), st.integers(-3, 10))
def test_parse_rerank_never_raises(text, n, k):
    indices, code = parse_rerank(text, n, k)
    if indices is not None:
        assert code == "ok" and len(indices) == k and len(set(indices)) == k and all(0 <= i < n for i in indices)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 10), min_size=1, max_size=5, unique=True))
def test_parse_rerank_roundtrip(order):
    text = REASON + "<rerank>" + " > ".join(f"[{i}]" for i in order) + "</rerank>"
    assert parse_rerank(text, 10, len(order)) == ([i - 1 for i in order], "ok")


def test_ranker_messages_hold_q0_subquery_numbered_truncated_candidates(passages):
    msgs = ranker_messages("Q0?", "sub query", passages[:3], k=2, passage_chars=10)
    user = msgs[-1]["content"]
    assert "Question: Q0?" in user and "Search query: sub query" in user
    assert "[1] (Paris) Paris is t…" in user and "[3] (Berlin) Berlin is…" in user
    assert "exactly 2" in msgs[0]["content"]
    assert msgs[2]["content"].endswith("<rerank>[2] > [3]</rerank>")  # the demonstration ranks k too
    assert parse_rerank(msgs[2]["content"], 6, 2) == ([1, 2], "ok")


def test_oracle_order():
    assert oracle_order([False, True, False, True]) == [1, 3, 0, 2]
    assert oracle_order([False, False]) == [0, 1]


def _cfg(**kw):
    return RankerConfig(preset="t", model="t", n_candidates=4, top_k=2, **kw)


@pytest.fixture
def make_tool(scripted_policy, overlap_retriever):
    def make(mode, responder=None, **kw):
        policy = scripted_policy(responder) if responder else None
        retriever = overlap_retriever()
        cfg = _cfg(mode=mode, **kw)
        return SearchTool(retriever, Ranker(cfg, policy), cfg), policy, retriever
    return make


REQ = SearchRequest("What is the capital of France?", "capital of France", ["Paris"], ["p1"], "t1", 0, 0)
# "capital of France" candidates, first-stage order: p0 (3 shared words), p2, p3 (2 each), p1 (of, france)


def test_trainable_mode_uses_ranker_order_and_records_training_data(make_tool):
    tool, policy, _ = make_tool("trainable", lambda p, o: REASON + "<rerank>[3] > [2]</rerank>")
    (result,) = tool.search([REQ])
    call = result.call
    assert call.candidate_ids == ["p0", "p2", "p3", "p1"]
    assert call.chosen_ids == ["p3", "p2"] and [p.id for p in result.passages] == ["p3", "p2"]
    assert call.format_ok and call.reason == "ok" and call.generated
    assert call.i_ans and call.relevant == [True, False, True, False]
    assert policy.tokenizer.decode(call.completion_ids) == call.output
    assert len(call.logprobs) == len(call.completion_ids)
    assert policy.tokenizer.decode(call.prompt_ids).count("Candidates:") == 2  # demonstration + this call
    assert (call.task_id, call.rollout_idx, call.turn) == ("t1", 0, 0)
    assert call.ranked_relevant() == [True, False]


def test_malformed_output_falls_back_to_first_stage_top_k(make_tool):
    tool, _, _ = make_tool("frozen", lambda p, o: "I think [2] is best")
    (result,) = tool.search([REQ])
    assert not result.call.format_ok and result.call.reason == "no_rerank_tag"
    assert result.call.chosen_ids == ["p0", "p2"]


def test_all_prompts_of_a_turn_share_one_generate_call(make_tool):
    tool, policy, retriever = make_tool("trainable", lambda p, o: REASON + "<rerank>[1] > [2]</rerank>")
    reqs = [REQ, REQ._replace(sub_query="Germany river", rollout_idx=1), ("q0", "zzz unknown", ["x"], [])]
    results = tool.search(reqs)
    assert policy.generate_calls == [2]  # the no-candidate search generates nothing
    assert len(retriever.queries) == 1
    assert results[2].passages == [] and results[2].call.reason == "no_candidates"
    assert not results[2].call.generated


def test_none_mode_is_first_stage_top_k_without_generation(make_tool):
    tool, _, _ = make_tool("none")
    (result,) = tool.search([REQ])
    assert result.call.chosen_ids == ["p0", "p2"] and result.call.format_ok and not result.call.generated


def test_oracle_mode_promotes_answer_passages(make_tool):
    tool, _, _ = make_tool("oracle")
    (result,) = tool.search([REQ])
    assert result.call.chosen_ids == ["p0", "p3"]  # both mention Paris, retriever order kept
    (miss,) = tool.search([REQ._replace(answers=["Munich"])])
    assert miss.call.chosen_ids == ["p0", "p2"] and not miss.call.i_ans


def test_evidence_relevance_sets_i_ans(make_tool):
    tool, _, _ = make_tool("none", relevance="evidence")
    (result,) = tool.search([REQ._replace(answers=["nothing here"])])
    assert result.call.relevant == [False, False, False, True] and result.call.i_ans


def test_fewer_candidates_than_k_ranks_them_all(make_tool):
    tool, _, _ = make_tool("trainable", lambda p, o: REASON + "<rerank>[1]</rerank>")
    (result,) = tool.search([REQ._replace(sub_query="Alps")])
    assert result.call.candidate_ids == ["p5"] and result.call.format_ok and result.call.chosen_ids == ["p5"]


def test_build_ranker_share_backbone_and_modes(scripted_policy):
    solver = scripted_policy(lambda p, o: "")
    assert build_ranker(_cfg(share_backbone=True), solver).policy is solver
    own = scripted_policy(lambda p, o: "")
    assert build_ranker(_cfg(), solver, lambda: own).policy is own
    assert build_ranker(_cfg(mode="oracle"), solver, lambda: pytest.fail("must not load")).policy is None
    with pytest.raises(ValueError):
        Ranker(_cfg(mode="trainable"), None)
    with pytest.raises(ValueError):
        Ranker(_cfg(mode="learned"), solver)


def test_format_documents(passages):
    assert format_documents(passages[:2]) == ("Doc 1 (Title: Paris) Paris is the capital of France.\n"
                                             "Doc 2 (Title: Lyon) Lyon is a city in France.")
    assert format_documents([]) == "No results."


@pytest.mark.parametrize("text,expected", [
    ("<rerank>[3] > [1] > [2]</rerank>", ([2, 0, 1], "ok")),
    ("\n<rerank> [5]>[4] > [1] </rerank> \n", ([4, 3, 0], "ok")),
    (REASON + "<rerank>[3] > [1] > [2]</rerank>", (None, "unexpected_reason_tag")),
    ("<rerank>[3] > [1] > [2]</rerank><reason>x</reason>", (None, "unexpected_reason_tag")),
    ("<rerank>[3] > [1] > [2]</rerank> because", (None, "text_after_rerank")),
    ("<rerank>[3] > [1]</rerank>", (None, "wrong_count")),
    ("[3] > [1] > [2]", (None, "no_rerank_tag")),
])
def test_parse_rerank_without_reasoning(text, expected):
    assert parse_rerank(text, 5, 3, reasoning=False) == expected


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(-3, 20), st.integers(-3, 6))
def test_parse_rerank_without_reasoning_never_raises(text, n, k):
    indices, code = parse_rerank(text, n, k, reasoning=False)
    assert (indices is None) == (code != "ok")


def test_ranker_messages_without_reasoning_ask_for_rerank_only(passages):
    msgs = ranker_messages("Q0?", "sub query", passages[:3], k=2, reasoning=False)
    assert all("<reason>" not in m["content"] for m in msgs)
    assert msgs[2]["content"] == "<rerank>[2] > [3]</rerank>"
    assert parse_rerank(msgs[2]["content"], 6, 2, reasoning=False) == ([1, 2], "ok")
    assert parse_rerank(msgs[2]["content"], 6, 2) == (None, "no_reason_tag")  # default format unchanged


@pytest.mark.parametrize("reasoning,tag,reply", [
    (True, "<reason>", "doc 3 names it</reason><rerank>[3] > [2]</rerank>"),
    (False, "<rerank>", "[3] > [2]</rerank>"),
])
def test_primed_tag_is_in_the_prompt_and_reattached_before_parsing(make_tool, reasoning, tag, reply):
    tool, policy, _ = make_tool("trainable", lambda p, o: reply, prime_tag=True, reasoning=reasoning)
    (result,) = tool.search([REQ])
    call = result.call
    assert call.format_ok and call.chosen_ids == ["p3", "p2"]
    assert policy.tokenizer.decode(call.prompt_ids).endswith("<|assistant|>" + tag)  # tag tokens: prompt, mask 0
    assert policy.tokenizer.decode(call.completion_ids) == reply  # only generated tokens are trained
    assert call.output == tag + reply
    # Unprimed, the same reply lacks its opening tag and fails the (unchanged) parser.
    unprimed, _, _ = make_tool("trainable", lambda p, o: reply, reasoning=reasoning)
    (plain,) = unprimed.search([REQ])
    assert not plain.call.format_ok and plain.call.reason == ("no_reason_tag" if reasoning else "no_rerank_tag")


def test_primed_model_that_repeats_the_tag_fails(make_tool):
    tool, _, _ = make_tool("trainable", lambda p, o: REASON + "<rerank>[3] > [2]</rerank>", prime_tag=True)
    (result,) = tool.search([REQ])
    assert not result.call.format_ok and result.call.reason == "bad_reason_tag"
    assert result.call.chosen_ids == ["p0", "p2"]  # first-stage fallback


def test_frozen_shared_backbone_ranker_is_a_separate_frozen_copy(scripted_policy):
    solver = scripted_policy(lambda p, o: "")  # a training solver: frozen is False
    copy = scripted_policy(lambda p, o: "")
    copy.frozen = True
    frozen_shared = _cfg(mode="frozen", share_backbone=True)
    ranker = build_ranker(frozen_shared, solver, lambda: copy)
    assert ranker.policy is copy and ranker.policy is not solver and ranker.policy.frozen
    assert not shares_solver_policy(frozen_shared, solver_frozen=False)
    # a trainable shared ranker is the solver itself; so is a frozen one beside a frozen solver
    assert build_ranker(_cfg(share_backbone=True), solver, lambda: pytest.fail("must not load")).policy is solver
    solver.frozen = True
    assert build_ranker(frozen_shared, solver, lambda: pytest.fail("must not load")).policy is solver


@pytest.mark.parametrize("mode, has_model", [("trainable", True), ("frozen", True), ("none", False),
                                             ("oracle", False)])
def test_the_ranker_has_a_model_in_the_generating_modes_only(mode, has_model):
    assert _cfg(mode=mode).has_model is has_model
    assert _cfg(mode=mode, share_backbone=True).has_model is has_model  # the solver's model is still a model


def test_ranker_policy_config():
    solver_cfg = SolverConfig(preset="s", model="solver-model", checkpoint="/ckpt/solver", dtype="bfloat16")
    own = ranker_policy_config(_cfg(mode="frozen", share_backbone=True, num_cpus=2.0), solver_cfg)
    # the solver's model and start weights, frozen, with the ranker's serving settings
    assert (own.preset, own.model, own.checkpoint, own.dtype) == ("s", "solver-model", "/ckpt/solver", "bfloat16")
    assert own.frozen and own.mode == "frozen" and own.num_cpus == 2.0 and own.top_k == 2
    assert ranker_policy_config(_cfg(share_backbone=True), solver_cfg) is None  # trainable: the solver's object
    assert ranker_policy_config(_cfg(mode="oracle"), solver_cfg) is None
    separate = _cfg(mode="frozen")
    assert ranker_policy_config(separate, solver_cfg) is separate
    frozen_solver = SolverConfig(preset="s", model="solver-model", frozen=True)
    assert ranker_policy_config(_cfg(mode="frozen", share_backbone=True), frozen_solver) is None


@pytest.mark.parametrize("reply,ok,reason,chosen", [
    ("[3] > [2]\nBecause doc 3 says so.", True, "ok", ["p3", "p2"]),  # stopped at the line break, closed there
    ("[3] > [9]\nmore", False, "index_out_of_range", ["p0", "p2"]),  # the parser stays strict
    ("[3]\n> [2]", False, "wrong_count", ["p0", "p2"]),
    ("[3] > [2]</rerank>\n", True, "ok", ["p3", "p2"]),  # the closing tag came first
    ("[3] > [2]", True, "ok", ["p3", "p2"]),  # the turn ended (EOS) with the line: closed there
    ("[3] > [2] > [1]", False, "wrong_count", ["p0", "p2"]),  # closed at EOS, the count still checked
])
def test_line_stop_ends_the_ranking_at_its_line_break(make_tool, reply, ok, reason, chosen):
    tool, policy, _ = make_tool("trainable", lambda p, o: reply, prime_tag=True, reasoning=False, line_stop=True)
    (result,) = tool.search([REQ])
    call = result.call
    assert (call.format_ok, call.reason, call.chosen_ids) == (ok, reason, chosen)
    assert policy.tokenizer.decode(call.completion_ids) in reply  # what was sampled is what is trained
    # without the lever the same reply is unclosed
    plain, _, _ = make_tool("trainable", lambda p, o: reply, prime_tag=True, reasoning=False)
    (res,) = plain.search([REQ])
    assert res.call.format_ok == ("</rerank>" in reply)


def test_line_stop_leaves_a_ranking_cut_by_the_token_limit_unclosed(make_tool):
    tool, _, _ = make_tool("trainable", lambda p, o: "[3] > [2] > [1] > [0]", prime_tag=True, reasoning=False,
                           line_stop=True, max_new_tokens=3)
    (result,) = tool.search([REQ])
    assert (result.call.format_ok, result.call.reason) == (False, "unclosed_rerank")


def test_line_stop_needs_the_no_reasoning_format():
    with pytest.raises(ValueError, match="ranker.line_stop=true needs ranker.reasoning=false"):
        to_object(compose(["experiment=smoke", "ranker.line_stop=true"]))


# ---- prompt budget (docs/method.md §5.2): candidate texts shortened evenly, never the head cut ----------------

Q0 = "Which city is the capital of France?"
WIDE = [Passage(f"w{i}", f"T{i}", "x" * 700) for i in range(50)]  # N=50 candidates longer than 600 chars


def _wide_ranker(scripted_policy, budget, reply="<reason>r</reason><rerank>[50] > [1] > [2] > [3] > [4]</rerank>"):
    cfg = RankerConfig(preset="t", model="t", n_candidates=50, top_k=5, passage_chars=600, max_prompt_tokens=budget)
    return Ranker(cfg, scripted_policy(lambda p, o: reply))


def test_ranker_prompt_at_n50_keeps_instructions_and_question_and_cuts_candidates_evenly(scripted_policy):
    req = SearchRequest(Q0, "capital of France", ["Paris"], [], "t", 0, 0)
    probe = _wide_ranker(scripted_policy, 100_000)
    # Char tokenizer: one token per character, so the prompt is L0 + 50 x chars (each text "x" * chars + "…").
    base = len(probe.policy.chat_prompt_ids(ranker_messages(Q0, req.sub_query, WIDE, 5, passage_chars=0)))
    full = len(probe.policy.chat_prompt_ids(ranker_messages(Q0, req.sub_query, WIDE, 5, passage_chars=600)))
    assert full == base + 50 * 600
    budget = base + 50 * 123 + 17  # room for 123 characters per candidate, and 17 tokens to spare
    ranker = _wide_ranker(scripted_policy, budget)
    (call,) = ranker.rank([req], [WIDE])
    prompt = ranker.policy.tokenizer.decode(call.prompt_ids)
    assert len(call.prompt_ids) == base + 50 * 123 <= budget
    system = ranker_messages(Q0, req.sub_query, WIDE, 5)[0]["content"]
    assert prompt.startswith("<|system|>" + system) and f"Question: {Q0}\nSearch query: capital of France" in prompt
    for i in range(1, 51):  # every candidate is still there, each cut to the same length
        assert f"\n[{i}] (T{i - 1}) {'x' * 123}…\n" in prompt
    assert call.format_ok and call.chosen_ids == ["w49", "w0", "w1", "w2", "w3"]  # index 50 is the 50th passage


def test_ranker_prompt_that_cannot_fit_is_an_error_naming_the_keys(scripted_policy):
    req = SearchRequest(Q0, "capital of France", ["Paris"], [], "t", 0, 0)
    ranker = _wide_ranker(scripted_policy, 500)
    with pytest.raises(PromptBudgetError, match=r"over ranker.max_prompt_tokens=500.*ranker.n_candidates"):
        ranker.rank([req], [WIDE])


def test_fit_prompt_finds_the_longest_common_cut():
    def render(chars):  # a prompt of 100 fixed tokens plus 7 candidates of min(chars, 40) tokens
        return [0] * (100 + 7 * min(chars, 40))
    assert fit_prompt(render, 300, 10_000, "b") == (render(300), 300)  # fits: untouched
    assert fit_prompt(render, 300, 100 + 7 * 25 + 6, "b") == (render(25), 25)
    with pytest.raises(PromptBudgetError, match="over b;"):
        fit_prompt(render, 300, 99, "b")
