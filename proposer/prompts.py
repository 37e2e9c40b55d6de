"""Proposer prompts and strict parsers for call 1 (target) and call 2 (question), docs/method.md §3.1, §3.4.

Parsers take untrusted model output and return `(value | None, reason_code)`; they never raise.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

from coevo.core.types import EvidencePath

TARGET_SYSTEM = (
    "You create training tasks for a search agent. You pick the ANSWER first, then a question."
)
TARGET_USER = (
    "Reference question: {question}\n\n"
    "Pick a different, real entity of a similar kind to this question's answer (a person, place, "
    "organization, work, event, or a date/number anchored to a named topic). It must be specific "
    "enough to be looked up in Wikipedia. Do not copy the reference question.\n"
    "Reply with the entity name only, inside tags: <target>entity name</target>"
)
QUESTION_SYSTEM = (
    "You write one factual question whose answer is a given target, using a chain of evidence "
    "sentences. Never mention the target in the question."
)
QUESTION_USER = (
    "Target answer (keep it secret): {target}\n"
    "Evidence chain: {chain}\n"
    "Evidence sentences:\n{sentences}\n\n"
    "Write ONE question that needs these facts and whose answer is the target. The question must "
    "not contain the target or any distinctive word of it, and must end with a question mark.\n"
    "Reply inside tags: <question>your question?</question>"
)

_TAG_CACHE: dict[str, re.Pattern] = {}


def _tag_pattern(tag: str) -> re.Pattern:
    if tag not in _TAG_CACHE:
        _TAG_CACHE[tag] = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL | re.IGNORECASE)
    return _TAG_CACHE[tag]


def parse_tagged(text: Any, tag: str) -> tuple[Optional[str], str]:
    """Extract the single `<tag>…</tag>` block: (content, "ok") or (None, reason code).

    Reason codes: `not_text`, `no_<tag>_tag`, `multiple_<tag>s`, `empty`.
    """
    if not isinstance(text, str):
        return None, "not_text"
    found = _tag_pattern(tag).findall(text)
    if not found:
        return None, f"no_{tag}_tag"
    values = {" ".join(v.split()) for v in found}
    if len(values) > 1:
        return None, f"multiple_{tag}s"
    value = values.pop()
    if not value:
        return None, "empty"
    return value, "ok"


def parse_target(text: Any) -> tuple[Optional[str], str]:
    """Call 1 output → target entity string (whitespace-collapsed, outer quotes stripped)."""
    value, reason = parse_tagged(text, "target")
    if value is None:
        return None, reason
    value = value.strip(" \"'`*")
    return (value, "ok") if value else (None, "empty")


# A list marker or label a small model puts before its one question ("1. What …", "- What …",
# "Your question: What …"): not part of it.
_LIST_MARKER = re.compile(r"^(?:\d{1,2}[.)]|[-*•])\s+(?=[^\W\d_])")
_QUESTION_LABEL = re.compile(r"^(?:(?:your|the|new|my)\s+)?question\s*\d{0,2}\s*:\s*(?=[^\W\d_])", re.IGNORECASE)


def parse_question(text: Any) -> tuple[Optional[str], str]:
    """Call 2 output → question string, a leading list marker or "Question:" label dropped. Form checks
    (one '?', length) belong to static validation."""
    value, reason = parse_tagged(text, "question")
    if value is None:
        return None, reason
    value = _QUESTION_LABEL.sub("", _LIST_MARKER.sub("", value))
    return (value, "ok") if value else (None, "empty")


# `proposer.grounding` (not ZEST): the titles of passages retrieved for the reference question
# are the candidate answers; a title is an entity the corpus knows and has a page for.
GROUNDED_TARGET_USER = (
    "Reference question: {question}\n"
    "Wikipedia articles found for it: {titles}\n\n"
    "Pick the answer of a new question: one of these articles' subjects (a person, place, organization, work, "
    "event, or a date/number anchored to a named topic). Do not copy the reference question.\n"
    "Reply with the entity name only, inside tags: <target>entity name</target>"
)


def target_messages(reference_question: str, titles: Sequence[str] = ()) -> list[dict]:
    """Chat messages of proposer call 1; with `titles` (`proposer.grounding`) the grounded prompt."""
    question = reference_question.strip()
    user = (GROUNDED_TARGET_USER.format(question=question, titles="; ".join(titles)) if titles
            else TARGET_USER.format(question=question))
    return [{"role": "system", "content": TARGET_SYSTEM}, {"role": "user", "content": user}]


def question_messages(target: str, path: EvidencePath) -> list[dict]:
    """Chat messages of proposer call 2, from the candidate's evidence path."""
    hops = path.hops
    chain = " -> ".join([h.head for h in hops[:1]] + [h.tail for h in hops]) or target
    sentences = "\n".join(f"- ({h.title}) {h.sentence}" for h in hops) or "- (none)"
    return [{"role": "system", "content": QUESTION_SYSTEM},
            {"role": "user", "content": QUESTION_USER.format(target=target, chain=chain, sentences=sentences)}]
