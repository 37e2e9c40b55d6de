"""Deterministic validation of proposed targets (docs/method.md §3.2) and questions (docs/method.md §3.4).

No LLM is involved. Every function returns a `Verdict` for any input (never raises on
odd strings): `ok`, a reason code, the evidence behind it and a human-readable detail.

Target reason codes, checked in this order: `empty`, `too_long`, `copies_reference`,
`not_entity`, `no_corpus_support`, `ok`.
Question reason codes, in order: `empty`, `not_question`, `too_short`, `too_long`,
`multiple_questions`, `no_evidence`, `leaks_target`, `leaks_target_token`, `ok`; then, with
`evidence.open_question` (beyond ZEST, docs/method.md §3.4, `open_question_verdict`), `polar_question` and
`markup`; then, with `evidence.answer_type` (evidence/answer_type.py), `wrong_answer_type`; then, with
`evidence.meta_wording`, `head_subject`, `relation_support` (evidence/task_checks.py), `meta_question`,
`asks_about_head`, `unsupported_relation`; then, with `evidence.retrievable` (likewise,
`retrievability_verdict`), `not_retrievable`.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from coevo.core.scoring import contains_answer, normalize_answer, punctuation_to_spaces, token_f1
from coevo.core.types import HEAD_MARK, Verdict, path_hops
from evidence.entities import EntityIndex
from evidence.mentions import ALLOWED_LABELS, normalize_entity, stopwords, strip_disambiguator, title_key

COPY_F1 = 0.8  # a target this token-similar to the reference question is a copy of it
ENTITY_COVERAGE = 0.6  # the entity-like span must cover this share of the target's tokens
MIN_QUESTION_WORDS = 4
_WORD = re.compile(r"\w+", re.UNICODE)
_QMARKS = ("?", "？")
# Head words shared by many names: seeing "university" in a question does not give away
# "University of Oxford". Tokens in this list (or stopwords, or 1-2 letters) are not distinctive.
GENERIC_TOKENS = frozenset("""
university college school institute academy museum library hospital church cathedral temple
river lake mountain mount sea ocean bay island islands valley park forest desert city town
village county state province district region kingdom republic empire federation union
national international united new north south east west northern southern eastern western
central great grand old royal saint st san santa fort port company corporation inc ltd
group party council ministry department association society league club team cup award
prize festival battle war treaty act street road bridge tower house palace castle station
airport film album song band series show book novel king queen prince princess emperor
president general sir lord lady jr sr ii iii iv first second third
""".split())


def _reject(reason: str, detail: str = "", evidence: tuple[str, ...] = ()) -> Verdict:
    return Verdict(False, reason, evidence, detail)


def _clean(text: Any) -> str:
    return text.strip() if isinstance(text, str) else ""


def _index_label(target: str, index: EntityIndex) -> Optional[str]:
    """Label of the target as the corpus knows it (an indexed entity or a passage title)."""
    label = index.entity_label(target)
    if label in ALLOWED_LABELS:
        return label
    return "TITLE" if index.passage_for_title(target) is not None else None


def _spacy_label(target: str, index: EntityIndex) -> Optional[str]:
    """Label of an allowed-type span spaCy finds covering most of the target, else None."""
    n_tokens = len(normalize_entity(target).split())
    for m in index.annotate_text(target):
        if m.label in ALLOWED_LABELS and len(m.key.split()) >= ENTITY_COVERAGE * n_tokens:
            return m.label
    return None


def target_label(target: str, index: EntityIndex) -> Optional[str]:
    """The target's entity label as the target checks find it (corpus look-up first, then spaCy on the
    target itself); None when it is not entity-like. `check_target_form` and `evidence.answer_type` share it."""
    return _index_label(target, index) or _spacy_label(target, index)


def check_target_form(target: Any, index: EntityIndex, reference_question: Any = None,
                      max_chars: int = 80) -> tuple[Optional[Verdict], str]:
    """The checks before retrieval: (rejection or None, entity label when accepted so far).

    Entity-like means: the entity index (spaCy's analysis of the corpus) knows the target
    under an allowed label or as a passage title, or spaCy run on the target itself finds
    an allowed-type span (NER or title-cased noun phrase) covering most of it. The corpus
    look-up comes first: it needs no spaCy call and recognizes lower-case names.
    """
    text = _clean(target)
    if not normalize_answer(text):
        return _reject("empty"), ""
    if len(text) > max_chars:
        return _reject("too_long", f"{len(text)} > {max_chars} characters"), ""
    ref = normalize_answer(_clean(reference_question))
    norm = normalize_answer(text)
    if ref and (norm == ref or (len(ref.split()) >= 3 and ref in norm) or token_f1(norm, ref) >= COPY_F1):
        return _reject("copies_reference"), ""
    label = target_label(text, index)
    if label is None:
        return _reject("not_entity", "no entity-like span of an allowed type"), ""
    return None, label


def target_head(target: Any) -> Optional[str]:
    """The head of a qualified target: "Abuja, Nigeria" → "Abuja", "Mercury (planet)" → "Mercury";
    None when the target has no qualifier (or nothing is left without it)."""
    text = _clean(target)
    head = strip_disambiguator(text).split(",", 1)[0].strip()
    return head if normalize_answer(head) and head != text else None


def _supporting(text: str, hits: list[Any], index: EntityIndex) -> list[str]:
    """Ids of the retrieved passages that contain the normalized `text` or are titled by it."""
    norm, support = normalize_answer(text), []
    for hit in hits:
        pid = getattr(hit, "passage_id", hit)
        if pid not in index.corpus:
            continue
        passage = index.corpus[pid]
        if normalize_answer(strip_disambiguator(passage.title)) == norm or contains_answer(passage.text, text):
            support.append(pid)
    return support


def support_verdict(target: Any, hits: list[Any], index: EntityIndex, label: str = "",
                    try_head: bool = False) -> Verdict:
    """Answer-side support: a retrieved passage contains the normalized target or is titled by it.

    `try_head` (`evidence.support_head`): when nothing supports the whole target, the head of
    a qualified target may ("Abuja, Nigeria" → "Abuja"; detail `<label> head:Abuja`). It is tried only
    after the whole target failed, on the same retrieved passages, so it never rejects a
    target that passed without it; it only accepts qualified names the corpus writes bare.
    """
    text = _clean(target)
    support = _supporting(text, hits, index)
    head = target_head(text) if try_head and not support else None
    if head is not None:
        support = _supporting(head, hits, index)
        label = f"{label}{HEAD_MARK}{head}" if support else label
    if not support:
        return _reject("no_corpus_support", f"none of {len(hits)} retrieved passages contains it")
    return Verdict(True, "ok", tuple(support), label)


def _has_evidence(hops: list[Any]) -> bool:
    return bool(hops) and all(isinstance(getattr(h, "sentence", None), str) and h.sentence.strip()
                              and isinstance(getattr(h, "passage_id", None), str) and h.passage_id for h in hops)


def spaced_key(text: Any) -> str:
    """Entity key with punctuation as a word break: "Spider-Man" → "spider man".

    The docs/method.md §5.4 key deletes punctuation ("spiderman"), so "Spider Man" in a question would not
    match the target "Spider-Man" by that key alone; leakage checks compare both keys.
    """
    return normalize_entity(punctuation_to_spaces(strip_disambiguator(text) if isinstance(text, str) else ""))


def _word_keys(text: Any) -> list[str]:
    """Tokens of both keys of `text` (deleted and spaced punctuation), first appearance order."""
    return list(dict.fromkeys(normalize_entity(text).split() + spaced_key(text).split()))


def distinctive_tokens(target: Any, other_entities: list[str] = ()) -> list[str]:
    """Tokens of a multi-token target that would give it away: not stopwords, not generic
    head words, not 1-2 letters (digits excepted), and not part of another path entity
    the question may legitimately name. Both keys count ("Jean-Paul Sartre": jeanpaul,
    sartre, jean, paul); a one-word target ("Spider-Man") is checked by its whole forms only."""
    if len(normalize_entity(target).split()) < 2:
        return []
    tokens = _word_keys(target)
    shared = {t for e in other_entities for t in _word_keys(e)}
    stop = stopwords()
    return [t for t in dict.fromkeys(tokens)
            if t not in stop and t not in GENERIC_TOKENS and t not in shared
            and (len(t) >= 3 or any(ch.isdigit() for ch in t))]


def _leak(question: str, target: str) -> Optional[str]:
    """A normalized form of the target found in the question on token boundaries."""
    for norm in (normalize_answer, normalize_entity, title_key, spaced_key):
        form = norm(target)
        if form and f" {form} " in f" {norm(question)} ":
            return form
    return None


def validate_question(question: Any, target: Any, path: Any, max_chars: int = 300) -> Verdict:
    """docs/method.md §3.4 static checks: form, evidence present, no leakage of the target."""
    text = _clean(question)
    if not text:
        return _reject("empty")
    if not text.endswith(_QMARKS):
        return _reject("not_question", "does not end with '?'")
    n_words = len(_WORD.findall(text))
    if n_words < MIN_QUESTION_WORDS:
        return _reject("too_short", f"{n_words} < {MIN_QUESTION_WORDS} words")
    if len(text) > max_chars:
        return _reject("too_long", f"{len(text)} > {max_chars} characters")
    if sum(text.count(q) for q in _QMARKS) > 1:
        return _reject("multiple_questions")
    hops = path_hops(path)
    if not _has_evidence(hops):
        return _reject("no_evidence", "the evidence path has no hop with a sentence and passage id")
    evidence = tuple(dict.fromkeys(h.passage_id for h in hops))
    target_text = _clean(target)
    leaked = _leak(text, target_text) if target_text else None
    if leaked:
        return _reject("leaks_target", leaked, evidence)
    # The heads e0 … e_k-1 are the entities a question may name; the last tail is the target.
    # A head that is the target itself (a direct path from the target's own page) licenses none of its tokens.
    others = [e for e in (getattr(h, "head", "") for h in hops)
              if isinstance(e, str) and spaced_key(e) != spaced_key(target_text)]
    q_tokens = set(_word_keys(text))
    for token in distinctive_tokens(target_text, others):
        if token in q_tokens:
            return _reject("leaks_target_token", token, evidence)
    return Verdict(True, "ok", evidence)


# A question opening with an auxiliary verb and holding no wh-word asks yes or no ("Is Homer a hero of
# the Trojan War?"), never for its target; "Can you tell me which city …?" asks for a name. A tag in the
# question is the model's own markup ("…</response> Question: What …?").
POLAR_OPENERS = frozenset("""
am is are was were be do does did can could will would shall should may might must has have had
""".split())
WH_WORDS = frozenset("what which who whom whose where when why how".split())
_MARKUP = re.compile(r"</?[A-Za-z][\w-]*>")


def open_question_verdict(verdict: Verdict, question: Any) -> Verdict:
    """`evidence.open_question`: a question that passed the static checks stays accepted only when it
    asks for something (not an auxiliary verb first with no wh-word anywhere: `polar_question`) and
    holds no tag (`markup`). Not in ZEST (docs/method.md §3.4): a yes/no question cannot have an entity as its answer.
    """
    if not verdict.ok:
        return verdict
    text = _clean(question)
    words = _WORD.findall(text)
    lowered = [w.lower() for w in words]
    if lowered and lowered[0] in POLAR_OPENERS and not WH_WORDS.intersection(lowered):
        return _reject("polar_question", f"opens with {words[0]!r} and asks no wh-word", verdict.evidence)
    tag = _MARKUP.search(text)
    if tag:
        return _reject("markup", tag.group(0), verdict.evidence)
    return verdict


def retrievability_verdict(verdict: Verdict, target: Any, path: Any, hits: list[Any], index: EntityIndex) -> Verdict:
    """`evidence.retrievable`: a question that passed the static checks stays accepted only when `hits`,
    the passages retrieved for the question itself, hold one that contains the target (or is titled
    by it: `_supporting`, the docs/method.md §5.4 normalization) or the path's first-hop passage.

    Not in ZEST (docs/method.md §3.4): a solver whose first search is the question can otherwise never reach the answer
    (the last hop's passage was retrieved for the target's own name, which the question hides).
    """
    if not verdict.ok:
        return verdict
    hops = path_hops(path)
    first = hops[0].passage_id if hops else None
    ids = [getattr(hit, "passage_id", hit) for hit in hits]
    if (first is not None and first in ids) or _supporting(_clean(target), hits, index):
        return verdict
    return _reject("not_retrievable", f"none of the {len(ids)} passages retrieved for the question contains "
                   f"the target or is the first hop's passage {first}", verdict.evidence)
