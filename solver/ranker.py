"""The generative listwise ranker of the solver's search tool (docs/method.md §4.3, §4.6).

`Ranker.rank` orders the first-stage candidates of a whole turn's searches with, for the
generating modes, ONE `generate` call for all of that turn's prompts (solver/search_tool.py
wraps it with the retriever).

Ranker output is untrusted: `parse_rerank` is strict and never raises; on any failure the
observation falls back to the first-stage top-K and the call is recorded with f = 0.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Sequence

from coevo.core.choices import RankerMode
from coevo.core.role_config import RankerConfig, shares_solver_policy
from coevo.core.types import Completion, Generator, SamplingParams, Tokenizer
from solver.ranker_prompt import fit_prompt, ranker_messages
from solver.reward import PassageLike, answer_relevant, relevance_labels

REASON_OPEN, RERANK_OPEN, RERANK_STOP = "<reason>", "<rerank>", "</rerank>"
MAX_INDEX_DIGITS = 6  # longer digit runs are out of range anyway; int() of huge strings raises

class SearchRequest(NamedTuple):
    """One search of one rollout; a plain 4-tuple (q0, sub_query, answers, evidence_ids) also works."""

    q0: str
    sub_query: str
    answers: Sequence[str]
    evidence_ids: Sequence[str] = ()
    task_id: str = ""
    rollout_idx: int = -1
    turn: int = -1


@dataclass
class RankerCall:
    """Everything one ranker call produced: for the observation, the reward and training."""

    q0: str
    sub_query: str
    task_id: str
    rollout_idx: int
    turn: int
    mode: str
    candidate_ids: list[str]  # first-stage order, N (or fewer when retrieval found fewer)
    chosen_ids: list[str]  # what the solver sees, best first
    format_ok: bool  # f of this call (always True in modes none/oracle)
    reason: str  # parse_rerank reason code, or the mode name when nothing was generated
    i_ans: bool  # any candidate pseudo-relevant (per ranker.relevance)
    relevant: list[bool]  # per candidate, aligned with candidate_ids
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: Optional[list[float]] = None  # per completion token, under the sampling policy
    output: str = ""  # decoded ranker output (for the task dump)
    group_id: Optional[str] = None  # set by solver.grouping
    r_rel: Optional[float] = None  # set by the reward step
    reward: Optional[float] = None  # set by the reward step

    @property
    def generated(self) -> bool:
        """True when the ranker policy wrote this call (so it can be trained on)."""
        return bool(self.completion_ids)

    def to_record(self) -> dict[str, Any]:
        """JSON-ready record for the task dump (README "Outputs"), nested in its rollout's record.

        Keys are the attribute names. Left out: token ids and per-candidate `relevant` labels
        (training-side), and q0, task id and rollout index (the enclosing records hold them).
        """
        return {"sub_query": self.sub_query, "turn": self.turn, "mode": self.mode, "candidate_ids": self.candidate_ids,
                "chosen_ids": self.chosen_ids, "format_ok": self.format_ok, "reason": self.reason, "i_ans": self.i_ans,
                "r_rel": self.r_rel, "reward": self.reward, "group_id": self.group_id, "output": self.output}

    def ranked_relevant(self) -> list[bool]:
        """Relevance of the returned documents, in returned order (input of Hit@k)."""
        label = dict(zip(self.candidate_ids, self.relevant))
        return [label.get(pid, False) for pid in self.chosen_ids]


def strip_eos(text: str, tokenizer: Optional[Tokenizer]) -> str:
    """Drop a trailing end-of-sequence marker an engine may decode into the text."""
    eos = getattr(tokenizer, "eos_token", None)
    stripped = text.rstrip()
    if isinstance(eos, str) and eos and stripped.endswith(eos):
        return stripped[: -len(eos)]
    return text


_TAG = re.compile(r"</?(reason|rerank)>")
_RANKING = re.compile(r"\s*\[(\d+)\](?:\s*>\s*\[(\d+)\])*\s*")
_INDEX = re.compile(r"\[(\d+)\]")


def _tag_order_error(text: str, reasoning: bool = True) -> Optional[str]:
    """Reason code when the <reason>…</reason><rerank>…</rerank> skeleton (without `reasoning`:
    <rerank>…</rerank> and no reason tag at all) is broken, else None."""
    tags = [m.group(0) for m in _TAG.finditer(text)]
    if "<rerank>" not in tags:
        return "no_rerank_tag"
    if tags.count("<rerank>") > 1 or tags.count("</rerank>") > 1:
        return "multiple_rerank_tags"
    if "</rerank>" not in tags:
        return "unclosed_rerank"
    if not reasoning:
        return "unexpected_reason_tag" if tags != ["<rerank>", "</rerank>"] else None
    if tags.count("<reason>") != 1 or tags.count("</reason>") != 1:
        return "no_reason_tag" if "<reason>" not in tags else "bad_reason_tag"
    if tags != ["<reason>", "</reason>", "<rerank>", "</rerank>"]:
        return "bad_tag_order"
    return None


def parse_rerank(text: str, n: int, k: int, reasoning: bool = True) -> tuple[Optional[list[int]], str]:
    """Strictly parse `<reason>…</reason><rerank>[i] > [j] > …</rerank>`; never raises.

    Returns (0-based candidate indices best first, "ok") or (None, reason code). Codes:
    no_rerank_tag, multiple_rerank_tags, unclosed_rerank, no_reason_tag, bad_reason_tag,
    bad_tag_order, text_after_rerank, bad_syntax, index_out_of_range, duplicate_index,
    wrong_count. Only whitespace may follow `</rerank>`. Without `reasoning` the format is
    `<rerank>…</rerank>` alone, and any reason tag is `unexpected_reason_tag`.
    """
    if not isinstance(text, str):
        return None, "no_rerank_tag"
    error = _tag_order_error(text, reasoning)
    if error:
        return None, error
    head, _, tail = text.partition("<rerank>")
    body, _, after = tail.partition(RERANK_STOP)
    if after.strip():
        return None, "text_after_rerank"
    if not _RANKING.fullmatch(body):
        return None, "bad_syntax"
    digits = _INDEX.findall(body)
    if any(len(d) > MAX_INDEX_DIGITS for d in digits):
        return None, "index_out_of_range"
    indices = [int(d) for d in digits]
    if any(not 1 <= i <= n for i in indices):
        return None, "index_out_of_range"
    if len(set(indices)) != len(indices):
        return None, "duplicate_index"
    if len(indices) != k:
        return None, "wrong_count"
    return [i - 1 for i in indices], "ok"


def oracle_order(answer_hits: Sequence[bool]) -> list[int]:
    """Answer-containing candidates first, each part in retriever order (identity when none)."""
    hits = [i for i, h in enumerate(answer_hits) if h]
    return hits + [i for i, h in enumerate(answer_hits) if not h]


class Ranker:
    """Re-ranks first-stage candidates in one of the modes trainable|frozen|none|oracle.

    `policy` generates in the trainable and frozen modes (the solver's policy object when
    `shares_solver_policy`, see `build_ranker`) and is unused in the none and oracle modes.
    """

    def __init__(self, cfg: RankerConfig, policy: Optional[Generator] = None) -> None:
        if cfg.mode not in list(RankerMode):
            raise ValueError(f"ranker.mode {cfg.mode!r} is not valid; expected one of {[str(m) for m in RankerMode]}")
        if cfg.has_model and policy is None:
            raise ValueError(f"ranker.mode={cfg.mode} needs a ranker policy")
        self.cfg = cfg
        self.policy = policy

    def sampling(self) -> SamplingParams:
        stop = [RERANK_STOP, "\n"] if self.cfg.line_stop else [RERANK_STOP]
        return SamplingParams(temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                              max_new_tokens=self.cfg.max_new_tokens, stop=stop, n=1)

    def _line_closed(self, text: str, finish_reason: str) -> str:
        """`ranker.line_stop`: a ranking that ends with its line (the engine stopped at a line break,
        or the model ended its turn with EOS) is closed there, as the proposer's question is at its
        "?"; the parser stays as strict (count, range, syntax). A ranking cut by the token limit
        stays unclosed: the model did not end it."""
        if not self.cfg.line_stop or RERANK_STOP in text:
            return text
        if finish_reason == "stop" and "\n" in text:
            return text[: text.index("\n")] + RERANK_STOP
        if finish_reason == "eos":
            return text.rstrip() + RERANK_STOP
        return text

    def rank(self, requests: Sequence[SearchRequest],
             candidates: Sequence[Sequence[PassageLike]]) -> list[RankerCall]:
        """One RankerCall per request; all generating calls share one `generate` call."""
        calls = [self._base_call(r, c) for r, c in zip(requests, candidates)]
        todo = [i for i, c in enumerate(candidates) if self.cfg.has_model and c]
        if todo:
            prompts = [self._prompt_ids(requests[i], candidates[i]) for i in todo]
            outputs = self.policy.generate(prompts, self.sampling())
            for i, prompt, out in zip(todo, prompts, outputs):
                self._apply_completion(calls[i], prompt, out[0])
        return calls

    def _k(self, n: int) -> int:
        # Retrieval can return fewer than K candidates; then all of them are ranked.
        return min(self.cfg.top_k, n)

    @property
    def opening_tag(self) -> str:
        """The output's first tag: what `ranker.prime_tag` writes at the end of the prompt."""
        return REASON_OPEN if self.cfg.reasoning else RERANK_OPEN

    def _primed(self) -> str:
        return self.opening_tag if self.cfg.prime_tag else ""

    def _budget(self) -> tuple[int, str]:
        """(tokens, keys) of this ranker's prompt budget: its own, or the tighter one of a shared policy."""
        own = (int(self.cfg.max_prompt_tokens), f"ranker.max_prompt_tokens={self.cfg.max_prompt_tokens}")
        shared = getattr(getattr(self.policy, "cfg", None), "max_prompt_tokens", None)
        role = getattr(self.policy, "role", "solver")
        return own if shared is None or shared >= own[0] else (int(shared), f"{role}.max_prompt_tokens={shared}")

    def _prompt_ids(self, req: SearchRequest, cands: Sequence[PassageLike]) -> list[int]:
        """The prompt within budget: candidate texts shortened evenly when needed, never its head cut."""
        budget, what = self._budget()
        ids, _ = fit_prompt(lambda chars: self._render(req, cands, chars), self.cfg.passage_chars, budget, what)
        return ids

    def _render(self, req: SearchRequest, cands: Sequence[PassageLike], passage_chars: int) -> list[int]:
        messages = ranker_messages(req.q0, req.sub_query, cands, self._k(len(cands)), passage_chars,
                                   self.cfg.reasoning)
        ids = self.policy.chat_prompt_ids(messages)
        if self.cfg.prime_tag:
            # As the proposer primes <target>: the opening tag keeps small models on format without
            # loosening the parser; its tokens belong to the prompt (never trained on) and are
            # re-attached to the completion before parsing.
            ids = ids + list(self.policy.tokenizer.encode(self.opening_tag, add_special_tokens=False))
        return ids

    def _base_call(self, req: SearchRequest, cands: Sequence[PassageLike]) -> RankerCall:
        """The call as modes none/oracle finish it; generating modes overwrite the ranking."""
        relevant = relevance_labels(cands, req.answers, req.evidence_ids, self.cfg.relevance)
        order = list(range(len(cands)))
        if self.cfg.mode == "oracle":
            order = oracle_order([answer_relevant(p, req.answers) for p in cands])
        chosen = [cands[i].id for i in order[: self._k(len(cands))]]
        return RankerCall(q0=req.q0, sub_query=req.sub_query, task_id=req.task_id, rollout_idx=req.rollout_idx,
                          turn=req.turn, mode=self.cfg.mode, candidate_ids=[p.id for p in cands],
                          chosen_ids=chosen, format_ok=True, reason=self.cfg.mode if cands else "no_candidates",
                          i_ans=any(relevant), relevant=relevant)

    def _apply_completion(self, call: RankerCall, prompt: list[int], completion: Completion) -> None:
        text = self._line_closed(self._primed() + strip_eos(completion.text, getattr(self.policy, "tokenizer", None)),
                                 completion.finish_reason)
        indices, reason = parse_rerank(text, len(call.candidate_ids), self._k(len(call.candidate_ids)),
                                       self.cfg.reasoning)
        # The engine's prompt_ids are what it conditioned on (the whole prompt: budgets never cut one).
        call.prompt_ids = list(completion.prompt_ids or prompt)
        call.completion_ids = list(completion.token_ids)
        call.logprobs = list(completion.logprobs) if completion.logprobs is not None else None
        call.output, call.reason, call.format_ok = self._primed() + completion.text, reason, indices is not None
        if indices is not None:
            call.chosen_ids = [call.candidate_ids[i] for i in indices]
        # else: chosen_ids keeps the first-stage top-K set by _base_call (the fallback).


def build_ranker(cfg: RankerConfig, solver_policy: Optional[Generator] = None,
                 load_policy: Optional[Callable[[], Generator]] = None) -> Ranker:
    """The ranker for a config: the solver's policy object when `shares_solver_policy`, else `load_policy()`.

    `load_policy` is a zero-argument callable (e.g. `lambda: Policy.from_config(cfg, "ranker")`)
    so modes none/oracle never load a model; for a frozen shared-backbone ranker beside a
    training solver it returns the frozen copy built from `ranker_policy_config` (coevo/core/role_config.py).
    """
    if not cfg.has_model:
        return Ranker(cfg, None)
    if shares_solver_policy(cfg, bool(getattr(solver_policy, "frozen", False))):
        if solver_policy is None:
            raise ValueError("ranker.share_backbone=true needs the solver policy")
        return Ranker(cfg, solver_policy)
    if load_policy is None:
        raise ValueError(f"ranker.mode={cfg.mode} needs a ranker policy (load_policy)")
    return Ranker(cfg, load_policy())
