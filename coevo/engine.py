"""Generation engine interface shared by the `hf` and `vllm` engines.

Callers (solver episodes, ranker calls, proposer calls) only see `Engine.generate`: token-id
prompts in, token-id completions out. Engines never re-tokenize decoded text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol


@dataclass
class SamplingParams:
    """How to sample one batch of completions."""

    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus threshold
    max_new_tokens: int = 128  # per completion
    stop: list[str] = field(default_factory=list)  # generation ends after any of these strings (kept in the text)
    n: int = 1  # completions per prompt
    seed: Optional[int] = None  # makes sampling reproducible when set


@dataclass
class Completion:
    """One sampled continuation of one prompt."""

    prompt_ids: list[int]  # the prompt exactly as given
    token_ids: list[int]  # generated tokens (up to and including the stop string / EOS)
    text: str  # decoded `token_ids`
    logprobs: Optional[list[float]] = None  # per generated token, under the sampling policy
    finish_reason: str = "length"  # stop | eos | length


class Engine(Protocol):
    """Anything that turns token-id prompts into completions."""

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """Return, for each prompt, `sampling.n` completions."""
        ...

    def sync_weights(self, model) -> None:  # noqa: ANN001 - a transformers PreTrainedModel
        """Serve the current weights of `model` from now on (no-op for engines that share it)."""
        ...
