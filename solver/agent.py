"""The solver's multi-turn search episode (docs/method.md §4.1).

Per turn the solver writes optional `<think>…</think>` reasoning, then exactly one action:
`<search>query</search>` or `<answer>text</answer>`. A valid search appends
`\\n<information>Doc 1 (Title: …) …</information>\\n`: observation tokens, loss mask 0.

`run_episodes` rolls out G episodes per task in lockstep: every turn is ONE `generate`
call for all live episodes, then ONE `SearchTool.search` call for all of that turn's
searches. Sequences are built from token ids only (prompt + generated + observation ids,
the observation tokenized on its own); decoded text is parsed, never re-tokenized.

Episode ends (`Episode.end_reason`): `answer` (the only format-valid end), a parse
failure (`parse_action` reason codes), `search_budget` (a search attempted after
`max_searches` valid ones), `max_turns` (no answer within `max_turns` generations) or
`token_budget` (the sequence would exceed `max_episode_tokens`, or the next turn's prompt, the
whole episode so far, would exceed `max_prompt_tokens`: the episode ends before any prompt
could be cut, coevo/core/budget.py). Every end but `answer`
means no answer and f = 0; the episode stops at once, since nothing after a violation can
change its reward.

`solver.prime_tag` (small models; off by default and in the paper presets): every turn's prompt
ends with "<", so the turn starts some tag while the model still picks think, search or answer.
The "<" tokens are appended to the episode as prompt tokens (loss mask 0, never trained on) and
put back in front of the completion before the unchanged strict parser reads it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple, Optional, Sequence, Union

from coevo.core.choices import GuideQuery
from coevo.core.config import SolverConfig
from coevo.core.scoring import echo_sources
from coevo.core.types import Completion, Generator, SamplingParams, Tokenizer
from solver.ranker import RankerCall, SearchRequest, strip_eos
from solver.reward import PassageLike, answer_relevant
from solver.search_tool import SearchTool, format_documents

__all__ = ["Task", "Episode", "Action", "SearchTool", "parse_action", "solver_messages", "run_episodes",
           "observation_text", "episode_echo_sources"]

SEARCH_STOP, ANSWER_STOP = "</search>", "</answer>"
TURN_PRIME = "<"  # what `solver.prime_tag` writes at the start of every turn

SOLVER_SYSTEM = (
    "You answer questions with the help of a search engine over Wikipedia. In each turn, either search with "
    "<search>query</search> (results come back inside <information> and </information>) or give the final "
    "answer, a few words only, with <answer>answer</answer>. You may think first inside <think> and </think>. "
    "You can search at most {max_searches} times. Write nothing after the closing tag of your action."
)
# One demonstration in the exact episode format (observation appended inside the assistant
# turn). Measured on SmolLM2-135M-Instruct: without it 0/128 sampled first turns held a tag;
# with it about a third opened with a well-formed <search>. It shows two searches, the second
# for the entity the first one found, and an answer that is in neither the question nor a
# query: a one-search demo whose answer was the question's subject taught "search once, echo".
DEMO_QUESTION = "In which city was the author of the novel The Master and Margarita born?"
DEMO_TURNS = (
    ("The Master and Margarita author",
     ("The Master and Margarita", "The Master and Margarita is a novel by Mikhail Bulgakov, written between "
                                  "1928 and 1940 and published in 1967.")),
    ("Mikhail Bulgakov birthplace",
     ("Mikhail Bulgakov", "Mikhail Afanasyevich Bulgakov was a Russian novelist and playwright, born in 1891 "
                          "in Kyiv.")),
)
DEMO_ANSWER = "Kyiv"


@dataclass
class Task:
    """A question the solver must answer, with its gold answers (aliases) and evidence passages."""

    id: str
    question: str
    answers: list[str]
    evidence_ids: list[str] = field(default_factory=list)
    guide: list[str] = field(default_factory=list)  # the path's search queries, hop by hop (`solver.guided_rollouts`)


class Action(NamedTuple):
    """One parsed turn: kind `search`/`answer` with its content, or kind None and a reason code."""

    kind: Optional[str]
    content: str
    reason: str


@dataclass
class Episode:
    """One rollout: the token sequence the policy trains on plus what happened in it."""

    task: Task
    rollout_idx: int
    token_ids: list[int]  # prompt + generated + observation ids, in order
    loss_mask: list[int]  # 1 on solver-generated tokens, 0 on prompt and observation tokens
    logprobs: Optional[list[float]]  # aligned with token_ids (0.0 where loss_mask is 0); None if unknown
    prompt_len: int
    answer: Optional[str] = None
    end_reason: str = ""
    n_searches: int = 0  # valid searches (tool calls that ran)
    sub_queries: list[str] = field(default_factory=list)
    ranker_calls: list[RankerCall] = field(default_factory=list)
    n_generated: int = 0
    n_turns: int = 0
    correctness: float = 0.0  # filled by the reward step
    reward: float = 0.0  # filled by the reward step
    guided: bool = False  # its turns replay the task's path (`solver.guided_rollouts`), not samples
    read_answer: bool = False  # a gold answer stood in a passage one of its searches showed it
    observations: list[str] = field(default_factory=list)  # what each valid search showed ("" if cut), as sub_queries

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def done(self) -> bool:
        return bool(self.end_reason)

    @property
    def format_ok(self) -> bool:
        """f of docs/method.md §4.1: the episode ended with a well-formed answer."""
        return self.end_reason == "answer"

    def to_record(self, decode: Optional[Callable[[list[int]], str]] = None) -> dict[str, Any]:
        """JSON-ready record for the task dump (README "Outputs"), nested in its task's record.

        Keys are the attribute names; token ids and `observations` are left out, and `transcript` (everything
        after the prompt: generated turns and observations) is decoded with `decode` when given.
        """
        transcript = decode(self.token_ids[self.prompt_len:]) if decode is not None else None
        return {"rollout_idx": self.rollout_idx, "transcript": transcript, "answer": self.answer,
                "format_ok": self.format_ok, "end_reason": self.end_reason, "correctness": self.correctness,
                "n_searches": self.n_searches, "sub_queries": self.sub_queries, "reward": self.reward,
                "n_generated": self.n_generated, "guided": self.guided, "read_answer": self.read_answer,
                "ranker_calls": [c.to_record() for c in self.ranker_calls]}


def episode_echo_sources(ep: Episode) -> list[str]:
    """What the episode's answer must not repeat (`coevo.core.scoring.echo_sources`, docs/method.md §4.2):
    its question and the queries it wrote before any observation showed that answer. The reward's echo
    guard and the `echo_rate` metric both read this, so an echo means one thing."""
    return echo_sources(ep.answer or "", ep.task.question, ep.sub_queries, ep.observations)


class _DemoPassage(NamedTuple):
    id: str
    title: str
    text: str


def solver_messages(question: str, max_searches: int) -> list[dict]:
    """Chat messages that open an episode: instructions, one demonstrated episode, the question."""
    demo = "".join(f"<search>{query}</search>{observation_text([_DemoPassage('demo', *doc)])}"
                   for query, doc in DEMO_TURNS) + f"<answer>{DEMO_ANSWER}</answer>"
    return [{"role": "system", "content": SOLVER_SYSTEM.format(max_searches=max_searches)},
            {"role": "user", "content": f"Question: {DEMO_QUESTION}"},
            {"role": "assistant", "content": demo},
            {"role": "user", "content": f"Question: {question}"}]


_TAG = re.compile(r"</?(?:think|search|answer)>")


def parse_action(text: str) -> Action:
    """Strictly parse one solver turn; never raises.

    Accepted: free text, at most one `<think>…</think>` block, then exactly one
    `<search>q</search>` or `<answer>a</answer>`, then whitespace only. Reason codes:
    no_action, multiple_actions, unclosed_tag, bad_tags (unopened, misordered or extra
    think tags), hallucinated_information (the model wrote an <information> tag),
    text_after_search / text_after_answer, empty_search / empty_answer.
    """
    if not isinstance(text, str):
        return Action(None, "", "no_action")
    if "<information>" in text or "</information>" in text:
        return Action(None, "", "hallucinated_information")
    tags = _TAG.findall(text)
    kinds = {t.strip("</>") for t in tags} - {"think"}
    if not kinds:
        return Action(None, "", "no_action")
    if len(kinds) > 1:
        return Action(None, "", "multiple_actions")
    kind = kinds.pop()
    opening, closing = f"<{kind}>", f"</{kind}>"
    if tags.count(opening) > 1 or tags.count(closing) > 1:
        return Action(None, "", "multiple_actions")
    if closing not in tags:
        return Action(None, "", "unclosed_tag")
    if tags not in ([opening, closing], ["<think>", "</think>", opening, closing]):
        return Action(None, "", "bad_tags")
    content, _, after = text.partition(opening)[2].partition(closing)
    if after.strip():
        return Action(None, "", f"text_after_{kind}")
    content = " ".join(content.split())
    if not content:
        return Action(None, "", f"empty_{kind}")
    return Action(kind, content, "ok")


def observation_text(passages: Sequence[PassageLike]) -> str:
    """The text appended after a valid search (tokenized on its own, loss mask 0)."""
    return f"\n<information>{format_documents(passages)}</information>\n"


def _encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class _GuideTurn(NamedTuple):
    """A turn the guide writes instead of the policy: no sampling log-probs, so the policy recomputes them."""

    token_ids: list[int]
    text: str
    logprobs: None = None


Turn = Union[Completion, _GuideTurn]  # one turn of an episode: sampled by the policy, or written by the guide


def _turn_sampling(cfg: SolverConfig, sampling: Optional[SamplingParams]) -> SamplingParams:
    """Sampling of every turn: the caller's (or the config's), with the action stop strings."""
    base = sampling or SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                      max_new_tokens=cfg.max_new_tokens)
    stop = list(dict.fromkeys([*base.stop, SEARCH_STOP, ANSWER_STOP]))
    # One completion per live episode: the G rollouts of a task are separate prompts.
    return SamplingParams(temperature=base.temperature, top_p=base.top_p, max_new_tokens=base.max_new_tokens,
                          stop=stop, n=1, seed=base.seed)


def _prompt_room(cfg: SolverConfig, prime: int = 0) -> int:
    """Longest episode a turn may start from: every turn's prompt is the whole episode so far (plus
    the `prime` tokens of `solver.prime_tag`), never cut."""
    return (cfg.max_prompt_tokens or cfg.max_episode_tokens) - prime


def _append_prime(ep: Episode, prime: list[int]) -> None:
    """The turn's primed tokens join the episode as prompt tokens: loss mask 0, logprob 0."""
    ep.token_ids += prime
    ep.loss_mask += [0] * len(prime)
    if ep.logprobs is not None:
        ep.logprobs += [0.0] * len(prime)


def _new_episode(task: Task, rollout_idx: int, prompt_ids: list[int], cfg: SolverConfig, prime: int = 0) -> Episode:
    ep = Episode(task=task, rollout_idx=rollout_idx, token_ids=list(prompt_ids), loss_mask=[0] * len(prompt_ids),
                 logprobs=[0.0] * len(prompt_ids), prompt_len=len(prompt_ids))
    if len(prompt_ids) + prime >= cfg.max_episode_tokens or len(prompt_ids) > _prompt_room(cfg, prime):
        ep.end_reason = "token_budget"
    return ep


def _apply_turn(ep: Episode, completion: Turn, tokenizer: Tokenizer, cfg: SolverConfig,
                prime: list[int]) -> Optional[str]:
    """Append one generated turn (after its `prime` tokens); return the search query when the turn is a valid search."""
    _append_prime(ep, prime)
    room = cfg.max_episode_tokens - len(ep.token_ids)
    generated = list(completion.token_ids)[:room]
    ep.token_ids += generated
    ep.loss_mask += [1] * len(generated)
    if ep.logprobs is not None and completion.logprobs is not None:
        ep.logprobs += list(completion.logprobs)[: len(generated)]
    else:
        ep.logprobs = None  # one turn without logprobs: the policy recomputes them all
    ep.n_generated += len(generated)
    ep.n_turns += 1
    if len(completion.token_ids) > room:
        ep.end_reason = "token_budget"
        return None
    action = parse_action((TURN_PRIME if prime else "") + strip_eos(completion.text, tokenizer))
    if action.kind is None:
        ep.end_reason = action.reason
    elif action.kind == "answer":
        ep.answer, ep.end_reason = action.content, "answer"
    elif ep.n_searches >= cfg.max_searches:
        ep.end_reason = "search_budget"
    else:
        return action.content
    return None


def _observe(episodes: list[Episode], queries: list[str], search_tool: SearchTool, tokenizer: Tokenizer,
             cfg: SolverConfig, turn: int, prime: int = 0) -> None:
    """Run this turn's searches in one batch and append each observation (loss mask 0)."""
    requests = [SearchRequest(ep.task.question, q, ep.task.answers, ep.task.evidence_ids, ep.task.id,
                              ep.rollout_idx, turn) for ep, q in zip(episodes, queries)]
    results = search_tool.search(requests)
    for ep, query, result in zip(episodes, queries, results):
        ep.n_searches += 1
        ep.sub_queries.append(query)
        ep.ranker_calls.append(result.call)
        shown = observation_text(result.passages)
        obs_ids = _encode(tokenizer, shown)
        length = len(ep.token_ids) + len(obs_ids)
        if length + prime >= cfg.max_episode_tokens or length > _prompt_room(cfg, prime):
            # No room to read the documents and still answer (or the next prompt would not fit): the episode is over.
            ep.end_reason = "token_budget"
            ep.observations.append("")
            continue
        ep.observations.append(shown)
        ep.token_ids += obs_ids
        ep.loss_mask += [0] * len(obs_ids)
        if ep.logprobs is not None:
            ep.logprobs += [0.0] * len(obs_ids)
        ep.read_answer = ep.read_answer or any(answer_relevant(p, ep.task.answers) for p in result.passages)


def guide_turn(ep: Episode, tokenizer: Tokenizer, cfg: SolverConfig, primed: bool) -> _GuideTurn:
    """The next turn of a guided rollout: its next search while the episode's budgets allow, then
    `<answer>target</answer>`. Its searches (`solver.guide_query`): the path's hop heads (the last hops
    when the path is longer), or the question itself, once."""
    room = max(0, min(cfg.max_searches, cfg.max_turns - 1))
    guide = [ep.task.question] if cfg.guide_query == GuideQuery.question else ep.task.guide
    queries = guide[-room:] if room else []
    if ep.n_turns < len(queries):
        text = f"<search>{queries[ep.n_turns]}</search>"
    else:
        text = f"<answer>{ep.task.answers[0]}</answer>"
    text = text[len(TURN_PRIME):] if primed else text  # the primed "<" is already in the prompt
    return _GuideTurn(_encode(tokenizer, text), text)


def _turn_outputs(solver: Generator, live: list[Episode], params: SamplingParams, prime: list[int],
                  cfg: SolverConfig, group_of: dict[int, int]) -> list[Turn]:
    """One completion per live episode: one batched `generate` for the sampled ones, the guide for the rest.

    Each prompt carries its task's group id (`SamplingParams.groups`, by `id(episode)` in `group_of`): a
    data-parallel policy generates a task's rollouts on one rank.
    """
    sampled = [ep for ep in live if not ep.guided]
    params = replace(params, groups=[group_of[id(ep)] for ep in sampled])
    generated = iter(solver.generate([list(ep.token_ids) + prime for ep in sampled], params) if sampled else [])
    return [guide_turn(ep, solver.tokenizer, cfg, bool(prime)) if ep.guided else next(generated)[0] for ep in live]


def run_episodes(solver: Generator, tasks: Sequence[Task], search_tool: SearchTool, cfg: SolverConfig,
                 sampling: Optional[SamplingParams] = None, group_size: Optional[int] = None) -> list[Episode]:
    """G = `group_size` (default `cfg.group_size`) rollouts per task, task-major order.

    `cfg` is a SolverConfig (max_searches, max_turns, max_episode_tokens and, when
    `sampling` is None, temperature/top_p/max_new_tokens). With `solver.guided_rollouts` the last
    of G > 1 rollouts of a task with a `guide` replays a route to the answer (`guide_turn`): its search
    results are real, it is scored like any other rollout, and its tokens train like sampled ones
    when those results showed it the answer (`solver.training.in_groups`).
    """
    n_rollouts = group_size or cfg.group_size
    params = _turn_sampling(cfg, sampling)
    prime = _encode(solver.tokenizer, TURN_PRIME) if cfg.prime_tag else []
    episodes = []
    for task in tasks:
        prompt_ids = solver.chat_prompt_ids(solver_messages(task.question, cfg.max_searches))
        group = [_new_episode(task, i, prompt_ids, cfg, len(prime)) for i in range(n_rollouts)]
        group[-1].guided = bool(cfg.guided_rollouts and task.guide and task.answers
                                and n_rollouts > 1)
        episodes += group
    group_of = {id(ep): i // n_rollouts for i, ep in enumerate(episodes)}  # task-major: a task's rollouts adjacent
    for turn in range(cfg.max_turns):
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        searching, queries = [], []
        for ep, completion in zip(live, _turn_outputs(solver, live, params, prime, cfg, group_of)):
            query = _apply_turn(ep, completion, solver.tokenizer, cfg, prime)
            if query is not None:
                searching.append(ep)
                queries.append(query)
        if searching:
            _observe(searching, queries, search_tool, solver.tokenizer, cfg, turn, len(prime))
    for ep in episodes:
        if not ep.done:
            ep.end_reason = "max_turns"
    return episodes
