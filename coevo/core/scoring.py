"""Answer normalization and metrics (SPEC §5.4): the one implementation in the project.

Rewards, ranker pseudo-relevance labels and evaluation all call these functions.
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def _is_punct(ch: str) -> bool:
    # Unicode punctuation (e.g. “ ” – …) counts too, not only ASCII.
    return ch in _PUNCT or unicodedata.category(ch).startswith("P")


def punctuation_to_spaces(text: str) -> str:
    """Every punctuation character (as `normalize_answer` deletes them) replaced by a space.

    Checks that must see "Spider-Man" as the two words of "Spider Man" normalize this
    instead of the raw text; answer scoring keeps the SQuAD deletion.
    """
    return "".join(" " if _is_punct(ch) else ch for ch in text) if isinstance(text, str) else ""


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lowercase, drop punctuation and articles, collapse whitespace."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = text.lower()
    # Deleted, as in the SQuAD script, so EM stays comparable with published numbers;
    # Unicode punctuation (curly quotes, dashes) is deleted too.
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_golds(golds: str | Iterable[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    return [g for g in golds if isinstance(g, str)]


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when the normalized prediction equals any normalized gold alias, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _as_golds(golds)))


def token_f1(a: str, b: str) -> float:
    """Token-level F1 between two strings after normalization (0.0 when either is empty)."""
    a_toks, b_toks = normalize_answer(a).split(), normalize_answer(b).split()
    if not a_toks or not b_toks:
        return float(a_toks == b_toks and bool(a_toks))
    common = Counter(a_toks) & Counter(b_toks)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(a_toks), overlap / len(b_toks)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: str | Sequence[str]) -> float:
    """Token F1 of the prediction, max over gold aliases."""
    return max((token_f1(prediction, g) for g in _as_golds(golds)), default=0.0)


def cover_em(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when some normalized gold is a substring of the normalized prediction (SPEC §5.4)."""
    pred = normalize_answer(prediction)
    return float(any((gold := normalize_answer(g)) and gold in pred for g in _as_golds(golds)))


def contains_answer(passage_text: str, golds: str | Sequence[str]) -> bool:
    """Pseudo-relevance: a normalized gold occurs in the normalized passage on token boundaries.

    Token boundaries matter for passages (unlike cover-EM on short predictions): the
    answer "art" must not make every passage containing "party" relevant.
    """
    text = f" {normalize_answer(passage_text)} "
    return any((gold := normalize_answer(g)) and f" {gold} " in text for g in _as_golds(golds))
