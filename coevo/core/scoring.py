"""Answer normalization and metrics (docs/method.md §5.4): the one implementation in the project.

Rewards, ranker pseudo-relevance labels and evaluation all call these functions.
"""
from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Iterable, Optional, Sequence

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


# Function words that carry no answer content: a sentence that restates the question around the
# answer shares these with any gold, so content F1 leaves them out (articles are gone already).
# Not retrieval's stopword list (evidence.mentions.stopwords): that one is part of the BM25 index key.
FUNCTION_WORDS = frozenset("""
    about above after again against all am and any are as at be because been before being below between both
    but by can could did do does doing down during each few for from further had has have having he her here
    hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now
    of off on once only or other our ours ourselves out over own same she should so some such than that their
    theirs them themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
""".split())


def content_tokens(text: str) -> list[str]:
    """The normalized tokens of `text` that are not function words."""
    return [t for t in normalize_answer(text).split() if t not in FUNCTION_WORDS]


# Generic words that name a kind of thing, not which one: the head of a name ("Mount", "Lake", "University",
# "Treaty", "Saint"), a title ("King", "President") or a name-forming modifier ("New", "North", "United").
# Two different names of one kind share them, so a match on them alone is no evidence of the right answer.
NAME_HEADS = frozenset("""
    mount mt mountain mountains lake lakes river sea ocean bay gulf island islands isle cape peninsula valley
    desert forest park falls canyon strait glacier volcano hill hills coast
    city town village county province state states kingdom republic empire district region port fort
    saint st san santa sao university college school institute academy church cathedral abbey temple palace
    castle tower bridge museum hospital station airport stadium street road avenue square
    company corporation inc ltd group party club
    king queen prince princess emperor empress pope president sir lord lady duke earl general captain dr mr mrs
    battle war treaty act award prize cup
    new north south east west northern southern eastern western upper lower great greater little grand
    central united
""".split())


def content_f1(prediction: str, golds: str | Sequence[str]) -> float:
    """Token F1 over content words (`content_tokens`), max over gold aliases; 0 against an alias
    when the shared words are all generic name words (`NAME_HEADS`).

    "The capital of Nigeria is Abuja" scores 1/2 against "Abuja" (content: capital, nigeria,
    abuja) where plain F1 gives 1/3: partial credit that rises as the answer sheds words.
    "Mount Fuji" scores 0 against "Mount Kilimanjaro" (only the head "mount" is shared: a wrong
    name of the right kind) but 2/3 against "Fuji", as "Barack Obama" does against "Obama". The
    rule reads only the two strings and a fixed word list: no label decides what a head is. A gold
    made only of function words ("The Who") is scored on all its tokens; one whose content words are
    all name words ("Great Lakes") is scored without the head rule.
    """
    best = 0.0
    pred_toks = content_tokens(prediction)
    for gold in _as_golds(golds):
        gold_toks = content_tokens(gold)
        if not gold_toks:
            best = max(best, token_f1(prediction, gold))
            continue
        shared = Counter(pred_toks) & Counter(gold_toks)
        if not shared or (set(shared) <= NAME_HEADS and not set(gold_toks) <= NAME_HEADS):
            continue
        common = sum(shared.values())
        precision, recall = common / len(pred_toks), common / len(gold_toks)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def echoes(answer: str, sources: Iterable[str]) -> bool:
    """Whether the normalized answer occurs, on token boundaries, in one of `sources`: an answer that
    repeats what it was given or asked for when `sources` are `echo_sources`."""
    key = normalize_answer(answer)
    return bool(key) and any(f" {key} " in f" {normalize_answer(s)} " for s in sources if isinstance(s, str))


def echo_sources(answer: str, question: str, queries: Sequence[str], observations: Sequence[str]) -> list[str]:
    """What a rollout's answer must not repeat to count as found (docs/method.md §4.2): the question and
    each query written before any observation held the answer; `echoes(answer, echo_sources(...))` is
    the one definition of an echo.

    `observations[i]` is the text that `queries[i]` returned, so `queries[i]` was written after
    `observations[:i]`. With k the first observation holding the answer (`echoes(answer, [observations[k]])`),
    the sources are the question and `queries[:k + 1]`; later queries verify what the rollout read
    (read "Hamlet" in a passage, then searched "Hamlet": not an echo). No known observation holds it
    (none read, or none recorded): every query is a source, the rule without observations.
    """
    for k, observation in enumerate(observations[:len(queries)]):
        if echoes(answer, [observation]):
            return [question, *queries[:k + 1]]
    return [question, *queries]


def cover_em(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 when some normalized gold is a substring of the normalized prediction (docs/method.md §5.4)."""
    pred = normalize_answer(prediction)
    return float(any((gold := normalize_answer(g)) and gold in pred for g in _as_golds(golds)))


def fold_accents(text: str) -> str:
    """`text` without combining marks ("Zürich" → "Zurich", "Ångström" → "Angstrom"), letters kept otherwise."""
    return "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))


def answer_aliases(names: Iterable[Optional[str]]) -> list[str]:
    """The gold aliases of one task: `names` in order, each followed by its accent-folded spelling,
    without a name that normalizes like an earlier one or to nothing.

    Accent folding is an alias, not part of `normalize_answer`: EM stays comparable with
    published numbers, and an answer written without accents still matches.
    """
    aliases: list[str] = []
    seen: set[str] = set()
    for name in names:
        for alias in (name, fold_accents(name)) if isinstance(name, str) else ():
            key = normalize_answer(alias)
            if key and key not in seen:
                seen.add(key)
                aliases.append(alias.strip())
    return aliases


def contains_answer(passage_text: str, golds: str | Sequence[str]) -> bool:
    """Pseudo-relevance: a normalized gold occurs in the normalized passage on token boundaries.

    Token boundaries matter for passages (unlike cover-EM on short predictions): the
    answer "art" must not make every passage containing "party" relevant.
    """
    text = f" {normalize_answer(passage_text)} "
    return any((gold := normalize_answer(g)) and f" {gold} " in text for g in _as_golds(golds))
