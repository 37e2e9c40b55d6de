"""Task generation stages (docs/method.md §3): call 1 → target checks → paths → call 2 → question checks.

Each stage takes the step's candidates, fills its part and marks rejections with the stage
and reason code; a rejected candidate skips later stages but stays in the dump and in the
proposer's GRPO group (with the invalid-task penalty). `evidence` is anything with the
`validate_targets`, `build_paths`, `validate_questions` batch methods (the evidence actor's
proxy in the loop, a local pipeline in tests).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from coevo.core.budget import over_budget
from coevo.core.choices import PathLength
from coevo.core.config import ProposerConfig
from coevo.core.grpo import GroupStats, group_advantages
from coevo.core.scoring import answer_aliases, echoes
from coevo.core.types import (
    HEAD_MARK,
    QUESTION_FORM_REASONS,
    Completion,
    EvidencePath,
    SamplingParams,
    TrainSequence,
    Verdict,
)
from proposer.hops import NO_PATH_OF_K_HOPS, choose_path
from proposer.prompts import parse_question, parse_target, question_messages, target_messages
from proposer.reward import N_STAGES, proposer_reward

TARGET_MAX_TOKENS = 48  # an entity name plus tags; longer outputs are cut and fail to parse
QUESTION_MAX_TOKENS = 128
TARGET_OPEN, QUESTION_OPEN = "<target>", "<question>"
PENDING = Verdict(False, "pending")  # a stage not reached (yet)
PROMPT_BUDGET = "prompt_budget"  # reason code: the question prompt is over proposer.max_prompt_tokens


@dataclass
class Candidate:
    """One proposed task, from target to rewards; becomes one line of the task dump (`to_record`)."""

    ref_index: int  # position of the reference question in the run's question list
    reference: str
    index: int  # position inside the reference question's group
    target_completion: Completion
    grounding: tuple[str, ...] = ()  # titles shown in call 1 (`proposer.grounding`), empty when off
    target: Optional[str] = None
    target_verdict: Verdict = PENDING
    paths_found: int = 0
    path: Optional[EvidencePath] = None  # the certified path `evidence.hops` chose (proposer/hops.py)
    question_completion: Optional[Completion] = None
    question: Optional[str] = None
    question_verdict: Verdict = PENDING
    stage: str = "target"  # last stage reached: target | path | question | accepted
    reason: str = "pending"  # reason code of the rejection, "accepted" otherwise
    accuracy: Optional[float] = None
    reward: Optional[float] = None

    @property
    def live(self) -> bool:
        return self.reason == "pending"

    def reject(self, stage: str, reason: str) -> None:
        self.stage, self.reason = stage, reason

    @property
    def accepted(self) -> bool:
        return self.reason == "accepted"

    @property
    def answers(self) -> list[str]:
        """The task's gold aliases: the target, the head the corpus supported instead of it
        (`evidence.support_head`: "Abuja, Nigeria" → "Abuja"), the evidence path's last tail as
        the graph names it, each with its accent-folded spelling (`answer_aliases`)."""
        detail = self.target_verdict.detail
        head = detail.split(HEAD_MARK, 1)[1] if self.target_verdict.ok and HEAD_MARK in detail else None
        tail = self.path.hops[-1].tail if self.path is not None and self.path.hops else None
        return answer_aliases([self.target, head, tail])

    @property
    def guide(self) -> list[str]:
        """The path replayed as searches, one per hop: each hop's head entity, the name the hop's passage
        is found by; a head that contains an answer is left out (a guided answer never echoes its query)."""
        if self.path is None:
            return []
        answers = self.answers
        return [hop.head for hop in self.path.hops if not any(echoes(a, [hop.head]) for a in answers)]

    @property
    def stages_passed(self) -> int:
        """Checks passed, in order: target parse, target validation, path, question parse, question form
        (`QUESTION_FORM_REASONS`), question content."""
        if self.accepted:
            return N_STAGES
        first = {"target": 0, "path": 2, "question": 3}.get(self.stage, 0)
        # A parse failure (or a prompt never generated) stops at the stage's first check; a verdict's
        # rejection is one check later, and a question past its form one more.
        unparsed = self.reason.startswith("parse:") or self.reason == PROMPT_BUDGET
        if self.stage == "path" or unparsed:
            return first
        return first + 1 + (self.stage == "question" and self.reason not in QUESTION_FORM_REASONS)

    def to_record(self, task_id: Optional[str], rollouts: list[dict[str, Any]],
                  timings: dict[str, float]) -> dict[str, Any]:
        """One line of tasks/step_<n>.jsonl; the keys are documented in README "Outputs".

        `rollouts` are the solver episodes' own records (`Episode.to_record`): the proposer
        package never imports the solver's types.
        """
        question = self.question_completion
        return {
            "task_id": task_id, "reference_question": self.reference, "reference_index": self.ref_index,
            "candidate": self.index, "grounding_titles": list(self.grounding),
            "target_output": TARGET_OPEN + self.target_completion.text,
            "target": self.target, "answers": self.answers if self.target else [],
            "target_verdict": self.target_verdict.to_record(), "paths_found": self.paths_found,
            "evidence_path": self.path.to_record() if self.path is not None else None,
            "question_output": QUESTION_OPEN + question.text if question is not None else None,
            "question": self.question, "question_verdict": self.question_verdict.to_record(),
            "stage": self.stage, "reason": self.reason, "accepted": self.accepted,
            "accuracy": self.accuracy, "proposer_reward": self.reward, "rollouts": rollouts, "timings_s": timings,
        }


def _sampling(cfg: ProposerConfig, max_tokens: int, stops: list[str], seed: Optional[int], n: int) -> SamplingParams:
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                          max_new_tokens=min(max_tokens, cfg.max_new_tokens), stop=stops, n=n, seed=seed)


def primed_prompt(policy: Any, messages: list[dict], opening_tag: str) -> list[int]:
    """Chat prompt ending with the answer's opening tag already written by the assistant.

    Priming the tag keeps small models on format without loosening the strict parser; the
    tag tokens belong to the prompt (never trained on) and are re-attached before parsing.
    """
    return policy.chat_prompt_ids(messages) + list(policy.tokenizer.encode(opening_tag, add_special_tokens=False))


def _closed(opening_tag: str, comp: Completion, end_stop: Optional[str] = None) -> str:
    """Primed tag + completion; a turn the model ended itself (EOS) closes an open tag.

    `end_stop` is a stop string that ends the answer itself (`proposer.question_stop`: "?"):
    a completion stopped there is cut right after it and closed, as EOS would close it.
    A completion cut by the token budget stays unclosed and fails to parse.
    """
    text = opening_tag + comp.text
    closing = opening_tag.replace("<", "</", 1)
    if closing in text:
        return text
    if end_stop and comp.finish_reason == "stop" and end_stop in text:
        return text[: text.index(end_stop) + len(end_stop)] + closing
    return text + closing if comp.finish_reason == "eos" else text


def grounding_titles(retriever: Any, questions: Sequence[str], k: int) -> list[tuple[str, ...]]:
    """Distinct titles of the top-`k` passages retrieved for each question (`proposer.grounding`).

    `retriever` has the search tool's surface: `search(queries, k)` → hits with `passage_id`,
    and `corpus[passage_id]` → a passage with a `title`.
    """
    if k <= 0:
        return [() for _ in questions]
    hits = retriever.search(list(questions), k)
    return [tuple(dict.fromkeys(retriever.corpus[h.passage_id].title for h in row)) for row in hits]


def propose_targets(proposer: Any, references: list[tuple[int, str]], cfg: ProposerConfig,
                    seed: Optional[int] = None,
                    titles: Optional[Sequence[tuple[str, ...]]] = None) -> list[Candidate]:
    """Call 1: `group_size` sampled targets per reference question, one generate call in all.

    `titles`: one tuple per reference, shown in the prompt (`grounding_titles`); None: ZEST's prompt.
    """
    titles = list(titles) if titles is not None else [() for _ in references]
    prompts = [primed_prompt(proposer, target_messages(q, shown), TARGET_OPEN)
               for (_, q), shown in zip(references, titles)]
    outputs = proposer.generate(prompts, _sampling(cfg, TARGET_MAX_TOKENS, ["</target>"], seed, cfg.group_size))
    cands = []
    for (ref_index, question), shown, completions in zip(references, titles, outputs):
        for i, comp in enumerate(completions):
            cand = Candidate(ref_index, question, i, comp, grounding=shown)
            cand.target, reason = parse_target(_closed(TARGET_OPEN, comp))
            if cand.target is None:
                cand.target_verdict = Verdict(False, f"parse:{reason}")
                cand.reject("target", f"parse:{reason}")
            cands.append(cand)
    return cands


def check_targets(evidence: Any, cands: list[Candidate]) -> None:
    """docs/method.md §3.2 on every parsed target (one batch call)."""
    live = [c for c in cands if c.live]
    if not live:
        return
    verdicts = evidence.validate_targets([c.target for c in live], [c.reference for c in live])
    for cand, verdict in zip(live, verdicts):
        cand.target_verdict = verdict
        if not verdict.ok:
            cand.reject("target", verdict.reason)


def attach_paths(evidence: Any, cands: list[Candidate], seed: int, direct: bool = False,
                 hops: PathLength | int = PathLength.longest) -> None:
    """docs/method.md §3.3: certified evidence paths per valid target; `hops` (`evidence.hops`, or the curriculum's
    level) picks the one used: the first (longest, best-ranked) by default. A fixed k that no path
    reaches rejects the candidate with `no_path_of_k_hops` (proposer/hops.py says why, not a fallback).

    `direct` (`proposer.generation=direct`): the target's supporting passage instead of a path.
    """
    live = [c for c in cands if c.live]
    if not live:
        return
    if direct:
        paths = evidence.direct_paths([c.target for c in live], [list(c.target_verdict.evidence) for c in live])
    else:
        paths = evidence.build_paths([c.target for c in live], seed)
    rand = random.Random(f"hops:{seed}")  # the step's seed, its own stream (the path builder draws from `seed`)
    for cand, found in zip(live, paths):
        cand.paths_found = len(found)
        if not found:
            cand.reject("path", "no_certified_path")
            continue
        cand.path = choose_path(found, hops, rand)
        if cand.path is None:
            cand.reject("path", NO_PATH_OF_K_HOPS)


def propose_questions(proposer: Any, cands: list[Candidate], cfg: ProposerConfig, seed: Optional[int] = None) -> None:
    """Call 2: one question per candidate with a path (one generate call in all)."""
    live = [c for c in cands if c.live]
    if not live:
        return
    prompts = [primed_prompt(proposer, question_messages(c.target, c.path), QUESTION_OPEN) for c in live]
    # An evidence path with very long sentences can outgrow the budget: that candidate is rejected with
    # its own reason code (counted in the step's reasons), never cut, and never stops the run.
    for cand in [c for c, p in zip(live, prompts) if over_budget(p, cfg.max_prompt_tokens)]:
        cand.question_verdict = Verdict(False, PROMPT_BUDGET)
        cand.reject("question", PROMPT_BUDGET)
    live, prompts = [c for c in live if c.live], [p for c, p in zip(live, prompts) if c.live]
    if not live:
        return
    end_stop = "?" if cfg.question_stop else None
    stops = ["</question>"] + ([end_stop] if end_stop else [])
    outputs = proposer.generate(prompts, _sampling(cfg, QUESTION_MAX_TOKENS, stops, seed, 1))
    for cand, completions in zip(live, outputs):
        cand.question_completion = completions[0]
        cand.question, reason = parse_question(_closed(QUESTION_OPEN, completions[0], end_stop))
        if cand.question is None:
            cand.question_verdict = Verdict(False, f"parse:{reason}")
            cand.reject("question", f"parse:{reason}")


def check_questions(evidence: Any, cands: list[Candidate]) -> None:
    """docs/method.md §3.4 static checks (form, evidence, leakage) on every parsed question."""
    live = [c for c in cands if c.live]
    if not live:
        return
    verdicts = evidence.validate_questions([c.question for c in live], [c.target for c in live],
                                           [c.path for c in live])
    for cand, verdict in zip(live, verdicts):
        cand.question_verdict = verdict
        if verdict.ok:
            cand.stage, cand.reason = "accepted", "accepted"
        else:
            cand.reject("question", verdict.reason)


def assign_proposer_rewards(cands: list[Candidate], cfg: ProposerConfig) -> None:
    """docs/method.md §3.5: difficulty reward for accepted tasks, −invalid_penalty for rejected ones
    (graded by the stages passed with `proposer.invalid_penalty_by_stage`)."""
    for cand in cands:
        accuracy = cand.accuracy if cand.accepted else None
        cand.reward = proposer_reward(accuracy, cfg.invalid_penalty, cfg.reward, cand.stages_passed,
                                      cfg.invalid_penalty_by_stage)


def proposer_sequences(cands: list[Candidate], scale_std: bool = True,
                       keep_zero: bool = False) -> tuple[list[TrainSequence], GroupStats]:
    """GRPO batch of the proposer (docs/method.md §3.5) and its group statistics (members: candidates).

    A reference question's `group_size` candidates form one group; call-1 and call-2 tokens
    of a candidate share its advantage. Zero-advantage candidates (zero-variance groups) are
    left out unless `keep_zero`: they add no policy gradient, but kept they count in the
    token-mean denominator and get the KL term (`proposer.keep_zero_advantage`).
    """
    if not cands:
        return [], GroupStats(0, 0, 0)
    rewards = torch.tensor([c.reward for c in cands], dtype=torch.float32)
    advantages, n_zero = group_advantages(rewards, [c.ref_index for c in cands], scale_std=scale_std)
    batch = []
    for cand, adv in zip(cands, advantages.tolist()):
        if adv == 0.0 and not keep_zero:
            continue
        for comp in (cand.target_completion, cand.question_completion):
            if comp is not None and comp.token_ids:
                batch.append(TrainSequence.from_completion(comp, adv))
    return batch, GroupStats(len({c.ref_index for c in cands}), int(n_zero), len(cands))
