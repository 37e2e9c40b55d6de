"""Solver and ranker rewards (docs/method.md §4.2, §4.5).

Pure functions over plain numbers and labels, so every case is hand-checkable:

- `correctness`: c_i = 0 without an answer or for an echo (the answer occurs in the question or in a
  query written before any observation held it, with `solver.reward.echo_guard`), else EM, F1 or content F1.
- `solver_rewards`: tool-aware reward over the G rollouts of one task,
  `r_i = c_i · (1 − λ · (s_i − s_min)/(s_max − s_min))`, min/max over the *correct*
  rollouts, `−α` for a format violation.
- `ranker_reward`: the composite table of docs/method.md §4.5 (malformed → −α; I_ans = 1 → r_rel, plus
  r_main when r_rel > γ; I_ans = 0 → r_main).
- `relevance_labels`: pseudo-relevance of candidates (`answer`, `evidence` or `both`).

All answer comparisons go through `coevo.core.scoring` (the project's one normalization).
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from coevo.core.choices import Correctness, Relevance
from coevo.core.scoring import contains_answer, content_f1, echoes, exact_match, f1

HIT_CUTOFFS = (1, 3, 5)  # k of Hit@k in r_rel, before capping at K
SCORERS = {Correctness.em: exact_match, Correctness.f1: f1, Correctness.f1_content: content_f1}


class PassageLike(Protocol):
    id: str
    title: str
    text: str


def correctness(answer: Optional[str], golds: Sequence[str], mode: str = "em",
                echo_of: Sequence[str] = ()) -> float:
    """c ∈ [0, 1] of one rollout: EM, token F1 or content-word F1 (max over gold aliases).

    c = 0 with no answer or when the answer `echoes` one of `echo_of`, else the score by `mode`.
    With `solver.reward.echo_guard` the caller passes `coevo.core.scoring.echo_sources`: the question
    and the queries written before any observation held the answer, so repeating the question or a
    guess searched before reading it never pays, and searching an answer already read (read-then-verify)
    keeps its score; without the guard, nothing.
    """
    if mode not in SCORERS:
        raise ValueError(f"correctness mode {mode!r} is not valid; expected one of {[str(m) for m in SCORERS]}")
    if answer is None or echoes(answer, echo_of):
        return 0.0
    return SCORERS[mode](answer, golds)


def solver_rewards(correct: Sequence[float], searches: Sequence[int], format_ok: Sequence[bool],
                   tool_cost: float = 0.2, format_penalty: float = 0.2) -> list[float]:
    """Tool-aware rewards of the G rollouts of one task (docs/method.md §4.2).

    A rollout counts as *correct* when it is format-valid and c_i > 0: with EM that is
    c_i = 1; with F1 any token overlap counts, so partially right rollouts also set the
    search-count range (and a c_i = 0 rollout gets 0 whatever the range is). s_min/s_max
    are taken over correct rollouts only; the fraction is 0 when s_max == s_min (one or
    no correct rollout, or all used the same number of searches).
    """
    if not (len(correct) == len(searches) == len(format_ok)):
        raise ValueError("correct, searches and format_ok must have one entry per rollout")
    counts = [s for c, s, ok in zip(correct, searches, format_ok) if ok and c > 0]
    s_min, s_max = (min(counts), max(counts)) if counts else (0, 0)
    rewards = []
    for c, s, ok in zip(correct, searches, format_ok):
        if not ok:
            rewards.append(-format_penalty)
            continue
        frac = (s - s_min) / (s_max - s_min) if s_max > s_min and c > 0 else 0.0
        rewards.append(c * (1.0 - tool_cost * frac))
    return rewards


def hit_cutoffs(top_k: int) -> list[int]:
    """The k of Hit@k used with K returned documents: {1, 3, 5} capped at K, deduplicated.

    Capping maps every k > K to K and the set keeps one copy, so K = 3 → [1, 3],
    K = 2 → [1, 2], K = 1 → [1], K = 4 → [1, 3, 4], K ≥ 5 → [1, 3, 5]. Counting K twice
    would weight "anything relevant in the list" more than the paper's mean does.
    """
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    return sorted({min(k, top_k) for k in HIT_CUTOFFS})


def hit_at_k(ranked_relevant: Sequence[bool], k: int) -> float:
    """1.0 when a relevant document is among the first k of the ranking, else 0.0."""
    return float(any(ranked_relevant[:k]))


def relevance_reward(ranked_relevant: Sequence[bool], top_k: int) -> float:
    """r_rel: mean Hit@k over `hit_cutoffs(top_k)` of the ranker's returned list."""
    cutoffs = hit_cutoffs(top_k)
    return sum(hit_at_k(ranked_relevant, k) for k in cutoffs) / len(cutoffs)


def ranker_reward(format_ok: bool, i_ans: bool, r_rel: float, r_main: float,
                  gamma: float = 0.5, format_penalty: float = 0.2) -> float:
    """Composite ranker reward, docs/method.md §4.5 table (r_main = correctness of the call's rollout)."""
    if not format_ok:
        return -format_penalty
    if not i_ans:
        return r_main
    return r_rel + r_main if r_rel > gamma else r_rel


def score_ranker_call(call: Any, r_main: float, cfg: Any) -> float:
    """Fill `call.r_rel` and `call.reward` (a RankerCall, `cfg` a RankerConfig); return the reward.

    r_rel is Hit@k over the documents the solver actually saw (the fallback list on a
    malformed call), with cutoffs capped at K = `cfg.top_k`.
    """
    call.r_rel = relevance_reward(call.ranked_relevant(), cfg.top_k)
    call.reward = ranker_reward(call.format_ok, call.i_ans, call.r_rel, r_main, cfg.gamma, cfg.format_penalty)
    return call.reward


def relevance_labels(passages: Sequence[PassageLike], answers: Sequence[str],
                     evidence_ids: Sequence[str], mode: str = "answer") -> list[bool]:
    """Pseudo-relevance of each passage (docs/method.md §4.5 `ranker.relevance`).

    `answer`: a gold answer occurs (normalized, token-aligned) in the passage text or its
    title; `evidence`: the passage is one of the task's evidence passages; `both`: either.
    """
    if mode not in list(Relevance):
        raise ValueError(f"ranker.relevance {mode!r} is not valid; expected one of {[str(m) for m in Relevance]}")
    evidence = set(evidence_ids or ())
    labels = []
    for p in passages:
        by_answer = mode != "evidence" and answer_relevant(p, answers)
        by_evidence = mode != "answer" and p.id in evidence
        labels.append(bool(by_answer or by_evidence))
    return labels


def answer_relevant(passage: PassageLike, answers: Sequence[str]) -> bool:
    """A gold answer occurs in the passage text or title (token-aligned, normalized)."""
    # Title and text are checked apart so no match spans the seam between them.
    return bool(answers) and (contains_answer(passage.text, answers) or contains_answer(passage.title, answers))
