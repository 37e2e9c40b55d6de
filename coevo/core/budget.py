"""Prompt budgets: a prompt is never cut silently (docs/method.md §5.2).

A prompt longer than its policy's `max_prompt_tokens` used to lose its oldest tokens: a solver
turn was then sampled without its instructions and question while training recomputed the
log-probs on the full episode (wrong importance ratios), and a ranker prompt lost its question
and first candidates. Now each role keeps its prompts inside the budget itself (the solver's
episode ends with `token_budget`, the ranker shortens candidate texts) and whatever still does
not fit is this error, naming the role and the keys to change.
"""
from __future__ import annotations

from typing import Any, Sequence


class PromptBudgetError(ValueError):
    """A prompt does not fit its policy's `max_prompt_tokens`; the message names the role and the keys."""


def over_budget(prompt: Sequence[int], limit: int) -> bool:
    """Whether a prompt is longer than `limit` tokens (`<role>.max_prompt_tokens`; 0: no limit)."""
    return limit > 0 and len(prompt) > limit


def check_prompts_fit(prompts: Sequence[Sequence[int]], limit: int, role: str) -> None:
    """Raise PromptBudgetError when any prompt is longer than `limit` tokens (`<role>.max_prompt_tokens`)."""
    longest = max((len(p) for p in prompts), default=0)
    if any(over_budget(p, limit) for p in prompts):
        over = sum(1 for p in prompts if over_budget(p, limit))
        raise PromptBudgetError(
            f"{over} {role} prompt(s) of up to {longest} tokens exceed config key {role}.max_prompt_tokens={limit}; "
            f"expected every prompt to fit (prompts are never cut): raise {role}.max_prompt_tokens")


def model_len(cfg: Any) -> int:
    """Longest sequence one generate call of a policy can hold: its prompt budget plus its generation budget.

    vLLM's `max_model_len` comes from here, so the engine can never refuse (or cut) a prompt
    that the role's own budget admitted.
    """
    return int(cfg.max_prompt_tokens) + int(cfg.max_new_tokens)


def check_model_len(length: int, context: Any) -> None:
    """Refuse a budget (`model_len`) longer than the model's context (`max_position_embeddings`; None: unknown)."""
    if context is not None and length > int(context):
        raise PromptBudgetError(
            f"config keys max_prompt_tokens + max_new_tokens = {length} tokens exceed the model's context "
            f"(max_position_embeddings={context}); expected max_prompt_tokens + max_new_tokens <= {context}")
