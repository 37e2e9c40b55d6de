"""Where a step's time goes: seconds and tokens per stage, and the one-line breakdown the console shows.

`StageTimer` times the stages of one step (target, path, question, solve, update) and, through
`metered`, counts the tokens each stage's generation calls moved: `prefill` (prompt tokens
handed to the engine) and `decode` (tokens it generated). The update stage's tokens are the
sequence tokens the updates ran forward and backward over (`update/<role>/seq_tokens`).
`breakdown_line` turns them, with the time the step's outputs took to write, into

    time 212.4s = target 12.0s (1.2k prefill + 3.4k decode, 283 tok/s) + ... + write 0.6s + other 0.1s

whose terms sum to the step's wall time: `other` is what no stage covers (it stays near zero
when the stages cover the step, which tests/coevo/orchestrate/test_timing.py checks).
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

from coevo.core.stages import stage as published_stage
from coevo.core.types import Completion, Generator, SamplingParams

GENERATION = ("prefill", "decode")


@dataclass
class StageTimer:
    """Wall-clock seconds and generation tokens per stage of one step (stages also published for
    `COEVO_STAGE_FILE`, coevo/core/stages.py)."""

    seconds: dict[str, float] = field(default_factory=dict)
    tokens: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> {"prefill": n, "decode": n}
    current: Optional[str] = None  # the stage open now (generation calls count into it)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0, outer = time.perf_counter(), self.current
        self.current = stage
        try:
            with published_stage(stage):  # bench/memory.py attributes memory samples to it
                yield
        finally:
            self.current = outer
            self.seconds[stage] = round(self.seconds.get(stage, 0.0) + time.perf_counter() - t0, 3)

    def count(self, **counts: int) -> None:
        """Add token counts to the open stage (outside every stage they belong to none and are dropped)."""
        if self.current is not None:
            into = self.tokens.setdefault(self.current, {})
            for key, n in counts.items():
                into[key] = into.get(key, 0) + int(n)

    def metered(self, actors: Any) -> Any:
        """`actors` with each policy's `generate` counted into this timer (updates and saves untouched)."""
        view = copy.copy(actors)  # the run's Actors stay as they are (checkpoints and updates use them)
        for role in ("proposer", "solver", "ranker"):
            if getattr(actors, role, None) is not None:
                setattr(view, role, MeteredPolicy(getattr(actors, role), self))
        return view


class MeteredPolicy:
    """A policy whose `generate` calls count prompt and generated tokens into a `StageTimer`.

    Every other attribute is the policy's own (tokenizer, chat_prompt_ids, cfg, frozen, ...).
    """

    def __init__(self, policy: Generator, timer: StageTimer) -> None:
        self.policy, self.timer = policy, timer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.policy, name)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        outputs = self.policy.generate(prompts, sampling)
        self.timer.count(prefill=sum(len(p) for p in prompts),
                         decode=sum(len(c.token_ids) for completions in outputs for c in completions))
        return outputs


def update_tokens(updates: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """`{"seq": n}`: sequence tokens of every role's update this step (0 when every update was skipped)."""
    return {"seq": sum(int(u.get("seq_tokens", 0)) for u in updates.values())}


def _count(n: float) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else f"{n:.0f}"


def _term(stage: str, seconds: float, tokens: Mapping[str, int]) -> str:
    gen = sum(tokens.get(k, 0) for k in GENERATION)
    if gen:
        what, moved = f"{_count(tokens.get('prefill', 0))} prefill + {_count(tokens.get('decode', 0))} decode", \
            tokens.get("decode", 0)
    elif tokens.get("seq"):
        what, moved = f"{_count(tokens['seq'])} seq", tokens["seq"]
    else:
        return f"{stage} {seconds:.1f}s"
    rate = f", {moved / seconds:.0f} tok/s" if seconds > 0 else ""
    return f"{stage} {seconds:.1f}s ({what}{rate})"


def breakdown_line(time_s: Mapping[str, float], tokens: Mapping[str, Mapping[str, int]], write_s: float,
                   wall_s: float) -> str:
    """`time <wall>s = <stage> <s>s (<tokens>, <rate>) + ... + write <s>s + other <s>s` (module docstring).

    Generation rates are decode tokens per second of the stage; the update's, sequence tokens per second.
    """
    terms = [_term(stage, seconds, tokens.get(stage, {})) for stage, seconds in time_s.items()]
    other = wall_s - sum(time_s.values()) - write_s
    return f"time {wall_s:.1f}s = " + " + ".join([*terms, f"write {write_s:.1f}s", f"other {other:.1f}s"])
