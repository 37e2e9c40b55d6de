"""Solver episodes (docs/method.md §4.1): strict turn parsing, token-exact sequences and masks, budgets."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.core.budget import PromptBudgetError, check_prompts_fit
from coevo.core.config import RankerConfig, SolverConfig
from coevo.core.scoring import normalize_answer as normalize
from solver.agent import (
    DEMO_ANSWER,
    DEMO_QUESTION,
    Action,
    Task,
    observation_text,
    parse_action,
    run_episodes,
    solver_messages,
)
from solver.ranker import Ranker, strip_eos
from solver.search_tool import SearchTool

TASK = Task("t1", "What is the capital of France?", ["Paris"], ["p3"])
TASK2 = Task("t2", "Which river flows through Germany?", ["Rhine"], ["p4"])


@pytest.mark.parametrize("text,expected", [
    ("<search>capital of France</search>", Action("search", "capital of France", "ok")),
    ("I should look.<think>plan</think>\n<search>  capital\n of France </search>\n",
     Action("search", "capital of France", "ok")),
    ("<answer>Paris</answer>", Action("answer", "Paris", "ok")),
    ("<think>easy</think><answer>Paris</answer>  ", Action("answer", "Paris", "ok")),
    ("", Action(None, "", "no_action")),
    ("Paris", Action(None, "", "no_action")),
    ("<think>only thinking</think>", Action(None, "", "no_action")),
    ("<answer>Paris</answer> because", Action(None, "", "text_after_answer")),
    ("<search>x</search>more", Action(None, "", "text_after_search")),
    ("<search>x</search><answer>y</answer>", Action(None, "", "multiple_actions")),
    ("<answer>a</answer><answer>b</answer>", Action(None, "", "multiple_actions")),
    ("<search>capital of", Action(None, "", "unclosed_tag")),
    ("</search>x<search>", Action(None, "", "bad_tags")),
    ("<search>x</search>", Action("search", "x", "ok")),
    ("<search>a</search", Action(None, "", "unclosed_tag")),
    ("<think>a<search>x</search>", Action(None, "", "bad_tags")),
    ("<think>a</think><think>b</think><search>x</search>", Action(None, "", "bad_tags")),
    ("<search>x</search><think>a</think>", Action(None, "", "bad_tags")),
    ("<search>   </search>", Action(None, "", "empty_search")),
    ("<answer></answer>", Action(None, "", "empty_answer")),
    ("<information>Doc 1</information><answer>x</answer>", Action(None, "", "hallucinated_information")),
])
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_parse_action_unopened_closing_tag():
    assert parse_action("capital</search>") == Action(None, "", "bad_tags")
    assert parse_action("capital</answer>") == Action(None, "", "bad_tags")


FRAGMENTS = ["<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>", "<information>", " ", "\n",
             "Paris", "<", ">", "/", "search", "answer", "\x00", "é", "</", "<answer", "x"]


def test_parse_action_fuzz_10000_fragment_strings():
    rng = random.Random(1)
    verdicts = set()
    for _ in range(10_000):
        action = parse_action("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 12))))
        assert (action.kind is None) == (action.reason != "ok")
        verdicts.add(action.reason)
    assert len(verdicts) >= 8


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parse_action_never_raises(text):
    action = parse_action(text)
    assert action.kind in (None, "search", "answer") and isinstance(action.reason, str)


def test_strip_eos():
    class Tok:
        eos_token = "<|im_end|>"
    assert strip_eos("<answer>x</answer><|im_end|>", Tok()) == "<answer>x</answer>"
    assert strip_eos("<answer>x</answer>", None) == "<answer>x</answer>"


# --- episodes --------------------------------------------------------------------------------

def solver_cfg(**kw):
    base = dict(preset="t", model="t", group_size=1, max_searches=3, max_turns=4, max_episode_tokens=100_000,
                max_prompt_tokens=100_000, max_new_tokens=200)
    base.update(kw)
    return SolverConfig(**base)


@pytest.fixture
def make_tool(overlap_retriever):
    def make(mode="none", policy=None):
        cfg = RankerConfig(preset="t", model="t", mode=mode, n_candidates=4, top_k=3)
        retriever = overlap_retriever()
        return SearchTool(retriever, Ranker(cfg, policy), cfg), retriever
    return make


def n_observations(prompt):
    # Observations of this episode: after the last "Question: " (the demonstration has one too).
    return prompt.rsplit("Question: ", 1)[1].count("</information>\n")


def search_then_answer(prompt, occurrence):
    if not n_observations(prompt):
        return "<think>find it</think><search>capital of France</search> the engine stops before this"
    return "<answer>Paris</answer>"


def test_sequence_is_concatenation_of_ids_with_exact_masks(scripted_policy, make_tool, passages):
    policy = scripted_policy(search_then_answer)
    tool, _ = make_tool()
    (ep,) = run_episodes(policy, [TASK], tool, solver_cfg())
    enc = policy.tokenizer.encode
    turn0 = enc("<think>find it</think><search>capital of France</search>")
    obs = enc(observation_text([passages[0], passages[2], passages[3]]))
    turn1 = enc("<answer>Paris</answer>")
    prompt = ep.token_ids[: ep.prompt_len]
    assert policy.tokenizer.decode(prompt).endswith("Question: What is the capital of France?\n<|assistant|>")
    assert ep.token_ids == prompt + turn0 + obs + turn1
    assert ep.loss_mask == [0] * len(prompt) + [1] * len(turn0) + [0] * len(obs) + [1] * len(turn1)
    lp0 = [-(i + 1) / 100 for i in range(len(turn0))]
    lp1 = [-(i + 1) / 100 for i in range(len(turn1))]
    assert ep.logprobs == [0.0] * len(prompt) + lp0 + [0.0] * len(obs) + lp1
    assert (ep.answer, ep.format_ok, ep.end_reason) == ("Paris", True, "answer")
    assert (ep.n_searches, ep.sub_queries, ep.n_turns) == (1, ["capital of France"], 2)
    assert ep.n_generated == len(turn0) + len(turn1) == sum(ep.loss_mask)
    assert policy.generate_calls == [1, 1]
    (call,) = ep.ranker_calls
    assert call.chosen_ids == ["p0", "p2", "p3"] and call.i_ans and (call.task_id, call.turn) == ("t1", 0)


def test_prime_tag_turns_start_with_a_prompt_token_the_parser_reads(scripted_policy, make_tool, passages):
    """solver.prime_tag: each turn's prompt ends with "<" (loss mask 0, logprob 0), put back before parsing."""
    def primed(prompt, occurrence):
        assert prompt.endswith("<")
        if not n_observations(prompt):
            return "think>find it</think><search>capital of France</search>"
        return "answer>Paris</answer>" if occurrence == 0 else "Paris is the answer"

    policy = scripted_policy(primed)
    tool, _ = make_tool()
    ep, bad = run_episodes(policy, [TASK], tool, solver_cfg(prime_tag=True, group_size=2))
    enc = policy.tokenizer.encode
    turn0, turn1 = enc("think>find it</think><search>capital of France</search>"), enc("answer>Paris</answer>")
    obs = enc(observation_text([passages[0], passages[2], passages[3]]))
    prompt = ep.token_ids[: ep.prompt_len]
    assert ep.token_ids == prompt + enc("<") + turn0 + obs + enc("<") + turn1
    assert ep.loss_mask == [0] * (len(prompt) + 1) + [1] * len(turn0) + [0] * (len(obs) + 1) + [1] * len(turn1)
    assert len(ep.logprobs) == len(ep.token_ids) and ep.logprobs[len(prompt)] == 0.0
    assert (ep.answer, ep.end_reason, ep.n_searches, ep.n_generated) == ("Paris", "answer", 1, len(turn0) + len(turn1))
    assert (bad.answer, bad.end_reason) == (None, "no_action")  # "<Paris is the answer": still no action


def test_one_generate_call_per_turn_for_all_live_episodes(scripted_policy, make_tool):
    def responder(prompt, occurrence):
        if n_observations(prompt):
            return "<answer>Rhine</answer>"
        return ["<answer>Paris</answer>", "<search>river Germany</search>", "I do not know."][occurrence]

    policy = scripted_policy(responder)
    tool, retriever = make_tool()
    episodes = run_episodes(policy, [TASK, TASK2], tool, solver_cfg(group_size=3))
    assert policy.generate_calls == [6, 2]
    assert retriever.queries == [["river Germany", "river Germany"]]  # one batched search per turn
    assert [(e.task_id, e.rollout_idx) for e in episodes] == [(t, i) for t in ("t1", "t2") for i in range(3)]
    assert [e.end_reason for e in episodes] == ["answer", "answer", "no_action"] * 2
    assert [e.answer for e in episodes[:3]] == ["Paris", "Rhine", None]
    assert [e.n_searches for e in episodes[:3]] == [0, 1, 0]


def always_search(prompt, occurrence):
    return f"<search>capital number {n_observations(prompt)}</search>"


def test_search_beyond_max_searches_is_a_format_violation(scripted_policy, make_tool):
    tool, _ = make_tool()
    (ep,) = run_episodes(scripted_policy(always_search), [TASK], tool, solver_cfg(max_searches=1))
    assert (ep.end_reason, ep.format_ok, ep.answer, ep.n_searches) == ("search_budget", False, None, 1)
    assert ep.sub_queries == ["capital number 0"]
    assert ep.n_turns == 2  # the over-budget turn's tokens stay in the sequence (mask 1)


def test_max_turns_ends_without_answer(scripted_policy, make_tool):
    tool, _ = make_tool()
    (ep,) = run_episodes(scripted_policy(always_search), [TASK], tool, solver_cfg(max_turns=2, max_searches=5))
    assert (ep.end_reason, ep.format_ok, ep.n_searches, ep.n_turns) == ("max_turns", False, 2, 2)


def test_token_budget_truncates_generation(scripted_policy, make_tool):
    policy = scripted_policy(lambda p, o: "<think>" + "x" * 100 + "</think><answer>Paris</answer>")
    tool, _ = make_tool()
    (probe,) = run_episodes(policy, [TASK], tool, solver_cfg())
    budget = probe.prompt_len + 30
    (ep,) = run_episodes(policy, [TASK], tool, solver_cfg(max_episode_tokens=budget))
    assert (ep.end_reason, ep.answer, ep.n_generated) == ("token_budget", None, 30)
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs) == budget


def test_token_budget_without_room_for_the_observation(scripted_policy, make_tool):
    policy = scripted_policy(search_then_answer)
    tool, _ = make_tool()
    (probe,) = run_episodes(policy, [TASK], tool, solver_cfg())
    turn0 = len(policy.tokenizer.encode("<think>find it</think><search>capital of France</search>"))
    (ep,) = run_episodes(policy, [TASK], tool, solver_cfg(max_episode_tokens=probe.prompt_len + turn0 + 10))
    assert (ep.end_reason, ep.n_searches) == ("token_budget", 1)
    assert ep.token_ids == probe.token_ids[: probe.prompt_len + turn0]


def test_episode_ends_with_token_budget_before_its_prompt_would_be_cut(scripted_policy, make_tool):
    """solver.max_prompt_tokens below the episode: the episode stops where the next prompt would not fit."""
    policy = scripted_policy(search_then_answer)
    seen = []  # longest prompt of each generate call
    generate = policy.generate
    policy.generate = lambda prompts, sampling: seen.append(max(map(len, prompts))) or generate(prompts, sampling)
    tool, _ = make_tool()
    (probe,) = run_episodes(policy, [TASK], tool, solver_cfg())
    turn0 = len(policy.tokenizer.encode("<think>find it</think><search>capital of France</search>"))
    observed = probe.prompt_len + turn0 + len(observation_text(probe_passages(tool, probe)))
    assert probe.end_reason == "answer" and seen == [probe.prompt_len, observed]
    seen.clear()
    # The observation would make the next prompt one token longer than the budget: no second turn.
    (ep,) = run_episodes(policy, [TASK], tool, solver_cfg(max_prompt_tokens=observed - 1))
    assert (ep.end_reason, ep.n_searches, ep.n_turns) == ("token_budget", 1, 1)
    assert ep.token_ids == probe.token_ids[: probe.prompt_len + turn0] and seen == [probe.prompt_len]
    with pytest.raises(PromptBudgetError, match=f"exceed config key solver.max_prompt_tokens={observed - 1}"):
        check_prompts_fit([probe.token_ids[:observed]], observed - 1, "solver")
    (fits,) = run_episodes(policy, [TASK], tool, solver_cfg(max_prompt_tokens=observed))
    assert fits.end_reason == "answer" and fits.token_ids == probe.token_ids


def probe_passages(tool, episode):
    """The passages the episode's one search returned, in the order the solver read them."""
    corpus = tool.retriever.corpus
    return [corpus[pid] for pid in episode.ranker_calls[0].chosen_ids]


def test_prompt_over_budget_generates_nothing(scripted_policy, make_tool):
    policy = scripted_policy(search_then_answer)
    tool, _ = make_tool()
    (ep,) = run_episodes(policy, [TASK], tool, solver_cfg(max_episode_tokens=10))
    assert ep.end_reason == "token_budget" and policy.generate_calls == [] and ep.n_generated == 0


@pytest.mark.parametrize("turn,reason", [("<search> </search>", "empty_search"),
                                         ("<search>capital of France", "unclosed_tag"),
                                         ("<information>fake</information><answer>x</answer>",
                                          "hallucinated_information")])
def test_malformed_turn_ends_episode_without_search(scripted_policy, make_tool, turn, reason):
    tool, retriever = make_tool()
    (ep,) = run_episodes(scripted_policy(lambda p, o: turn), [TASK], tool, solver_cfg())
    assert (ep.end_reason, ep.format_ok, ep.n_searches) == (reason, False, 0)
    assert retriever.queries == []


def test_shared_backbone_ranker_generates_in_one_extra_call(scripted_policy, make_tool):
    def responder(prompt, occurrence):
        if "Candidates:" in prompt:
            return "<reason>Doc 3 says it</reason><rerank>[3] > [1] > [2]</rerank>"
        return search_then_answer(prompt, occurrence)

    policy = scripted_policy(responder)
    tool, _ = make_tool(mode="trainable", policy=policy)
    episodes = run_episodes(policy, [TASK], tool, solver_cfg(group_size=2))
    assert policy.generate_calls == [2, 2, 2]  # solver turn 0, ranker, solver turn 1
    for ep in episodes:
        (call,) = ep.ranker_calls
        assert call.generated and call.format_ok and call.chosen_ids == ["p3", "p0", "p2"]
        obs = policy.tokenizer.decode(ep.token_ids[ep.prompt_len:])
        assert "Doc 1 (Title: France)" in obs


def test_missing_logprobs_make_episode_logprobs_none(scripted_policy, make_tool):
    class NoLogprobs(scripted_policy):
        def _complete(self, *args):
            completion = super()._complete(*args)
            completion.logprobs = None
            return completion

    tool, _ = make_tool()
    (ep,) = run_episodes(NoLogprobs(search_then_answer), [TASK], tool, solver_cfg())
    assert ep.logprobs is None and ep.format_ok


def test_demo_searches_twice_and_answers_what_no_query_names():
    """The demonstrated episode must not teach "search the subject once, echo it": two searches,
    each a well-formed turn, and an answer found in the last observation but in no query or the question."""
    demo = solver_messages("Who founded Rome?", max_searches=3)[2]["content"]
    turns = [t for t in demo.split("</information>\n") if t.strip()]
    actions = [parse_action(t.split("\n<information>")[0]) for t in turns]
    assert [a.kind for a in actions] == ["search", "search", "answer"]
    assert actions[-1].content == DEMO_ANSWER
    answer = normalize(DEMO_ANSWER)
    assert all(answer not in normalize(text) for text in [DEMO_QUESTION, actions[0].content, actions[1].content])
    assert answer in normalize(turns[1])


def test_guided_rollout_replays_the_path_and_the_rest_sample(scripted_policy, make_tool):
    """solver.guided_rollouts: the last of G rollouts searches the path's hops (the last ones that fit the
    search budget), then answers the target; it generates nothing, and its log-probs are left to the policy."""
    task = Task("t1", "What is the capital of France?", ["Paris"], ["p0"], guide=["Europe", "France", "capital"])
    policy = scripted_policy(lambda prompt, occurrence: "<answer>Lyon</answer>")
    tool, retriever = make_tool()
    sampled, guided = run_episodes(policy, [task], tool, solver_cfg(group_size=2, max_searches=2,
                                                                    guided_rollouts=True))
    assert policy.generate_calls == [1]  # only the sampled rollout asks the policy
    assert (sampled.guided, sampled.answer) == (False, "Lyon")
    assert guided.guided and guided.sub_queries == ["France", "capital"] and retriever.queries == [["France"],
                                                                                                   ["capital"]]
    assert (guided.answer, guided.end_reason, guided.logprobs) == ("Paris", "answer", None)
    enc = policy.tokenizer.encode
    generated = [t for t, m in zip(guided.token_ids, guided.loss_mask) if m]
    assert generated == enc("<search>France</search>") + enc("<search>capital</search>") + enc("<answer>Paris</answer>")
    shown = policy.tokenizer.decode([t for t, m in zip(guided.token_ids[guided.prompt_len:],
                                                       guided.loss_mask[guided.prompt_len:]) if not m])
    assert "Paris" in shown and guided.read_answer  # its searches showed it the answer: it trains
    assert "".join(guided.observations) == shown and len(guided.observations) == len(guided.sub_queries)
    # off by default, and never the only rollout of a task
    assert not any(ep.guided for ep in run_episodes(policy, [task], tool, solver_cfg(group_size=2)))
    assert not run_episodes(policy, [task], tool, solver_cfg(group_size=1, guided_rollouts=True))[0].guided


def test_guided_rollout_searches_the_question_under_guide_query_question(scripted_policy, make_tool):
    """solver.guide_query=question: the guided rollout searches the question once, whatever the path, then
    answers the target; the sampled rollouts are untouched."""
    question = "What is the capital of France?"
    task = Task("t1", question, ["Paris"], ["p0"], guide=["Europe", "France"])
    policy = scripted_policy(lambda prompt, occurrence: "<answer>Lyon</answer>")
    tool, retriever = make_tool()
    sampled, guided = run_episodes(policy, [task], tool, solver_cfg(group_size=2, max_searches=2, guided_rollouts=True,
                                                                    guide_query="question"))
    assert (sampled.guided, sampled.answer, sampled.sub_queries) == (False, "Lyon", [])
    assert guided.guided and guided.sub_queries == [question] and retriever.queries == [[question]]
    assert (guided.answer, guided.end_reason) == ("Paris", "answer")
    generated = [t for t, m in zip(guided.token_ids, guided.loss_mask) if m]
    enc = policy.tokenizer.encode
    assert generated == enc(f"<search>{question}</search>") + enc("<answer>Paris</answer>")
