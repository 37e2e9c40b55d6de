"""The passage topic inside its own passage (bridges that generalise).

An encyclopedia passage is about its title, and its sentences often name that topic
without writing the title: the opening sentence in a fuller or spaced form ("Richard
Kevin Betts( born 1947) is" under the title "Richard K. Betts"), later sentences by an
anaphoric subject ("He moved to Boston", "Its capital is Oslo", "The film stars X"). Such
sentences then joined their entities to nothing; here each such subject becomes a mention
of the title entity, so the sentence links what it mentions to the topic.

Rules (spaCy tagger tags only: the parser is not in the pipeline, see spacy_ner):
- lead subject: in the passage's first sentence, the words before the first finite verb or
  "(" name the topic when they are a variant of the title (`mentions.names_title`); the
  spans inside them are replaced by one title mention.
- anaphoric subject: in a sentence that does not mention the topic, the subject of the first
  finite verb (or a sentence-opening pronoun) stands for it when it is a topic pronoun that
  agrees with the topic (he/she/his/her for a person, it/its/they/their for anything else) or
  a definite description ("the film") whose head noun says what the topic is: a word of the
  title, or a noun of the opening "<topic> is a …" predicate.
Only subjects (of any finite verb, the first that fits) stand for the topic: an object
pronoun ("… told him …") is too often someone else. One anaphor per sentence suffices, as
an edge joins entity keys.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Optional

from evidence.mentions import (
    ALLOWED_LABELS,
    TOPIC_PRONOUNS,
    is_topic_anaphor,
    names_title,
    normalize_entity,
    stopwords,
    title_forms,
)

FINITE_TAGS = frozenset({"VBD", "VBZ", "VBP", "MD"})
ADVERB_TAGS = frozenset({"RB", "RBR", "RBS"})
# Tags inside a noun phrase before its head ("the 1999 American comedy film", "the band's debut album").
NP_TAGS = frozenset({"NN", "NNS", "NNP", "NNPS", "JJ", "JJR", "JJS", "CD", "HYPH", "POS", "VBN", "VBG"})
NOUN_TAGS = frozenset({"NN", "NNS"})
# Tags of a copula's noun phrase ("is the third-largest city", "was an actor and singer").
PREDICATE_TAGS = NP_TAGS | ADVERB_TAGS | {"DT", "CC", ","}
# Labels a surname of the topic may carry: NER calls rare surnames ORG as often as PERSON.
FOLDABLE_NAMES = frozenset({"PERSON", "NP", "ORG"})
DEFINITE = frozenset({"the", "this"})
COPULA = frozenset({"is", "was", "are", "were"})
# Longer lead "subjects" are sentences without a verb (lists, fragments), not names.
MAX_LEAD_TOKENS = 20

Span = tuple[int, int, str, str]  # (start char, end char, label, key), as spacy_ner builds them


def _first_finite(toks: list[Any]) -> Optional[int]:
    return next((i for i, t in enumerate(toks) if t.tag_ in FINITE_TAGS), None)


def _subject(toks: list[Any], v: int) -> Optional[tuple[int, int, str]]:
    """Token range [i, j) and kind (`pronoun` / `description`) of an anaphoric subject of the
    verb `toks[v]`; None when its subject is anything else (a name, a relative pronoun, …)."""
    i = v - 1
    while i >= 0 and (toks[i].tag_ in ADVERB_TAGS or toks[i].text == ","):  # "The company, however, is"
        i -= 1
    if i < 0:
        return None
    if toks[i].tag_ == "PRP":
        return (i, i + 1, "pronoun") if toks[i].lower_ in TOPIC_PRONOUNS else None
    end = i + 1
    while i >= 0 and toks[i].tag_ in NP_TAGS:
        i -= 1
    if i < 0 or i + 1 == end:
        return None
    det = toks[i]
    if det.tag_ == "PRP$" and det.lower_ in TOPIC_PRONOUNS:  # "His father was", "Its capital is"
        return i, i + 1, "pronoun"
    if det.tag_ == "DT" and det.lower_ in DEFINITE:
        # "The band's debut album was": the description is the possessor, "The band".
        pos = next((k for k in range(i + 1, end) if toks[k].tag_ == "POS"), end)
        return (i, pos, "description") if pos > i + 1 else None
    return None


def _char_span(toks: list[Any], i: int, j: int) -> tuple[int, int]:
    return toks[i].idx, toks[j - 1].idx + len(toks[j - 1].text)


def lead_subject(sent: Any, spans: list[Span], title: str, t_key: str) -> list[Span]:
    """`spans` of a passage's first sentence, with a subject that names the title in another
    form replaced by one title mention (labelled as its longest entity span inside, else TITLE)."""
    if not t_key or any(k == t_key for *_, k in spans):
        return spans
    toks = list(sent)
    j = next((k for k, t in enumerate(toks) if t.tag_ in FINITE_TAGS or t.text == "("), len(toks))
    i = 1 if toks and toks[0].tag_ == "DT" else 0  # "The ZEC …", "An animator is"
    while j > i and (toks[j - 1].is_punct or toks[j - 1].is_space):
        j -= 1
    if j <= i or j - i > MAX_LEAD_TOKENS:
        return spans
    a, b = _char_span(toks, i, j)
    if not names_title(sent.doc.text[a:b], title):
        return spans
    inside = [s for s in spans if a <= s[0] and s[1] <= b]
    if any(s not in inside and s[0] < b and a < s[1] for s in spans):
        return spans  # a span crossing the subject's edge: the subject is not one name
    named = [s for s in inside if s[2] in ALLOWED_LABELS]
    label = max(named, key=lambda s: (s[1] - s[0], -s[0]))[2] if named else "TITLE"
    return sorted([s for s in spans if s not in inside] + [(a, b, label, t_key)])


def defining_nouns(sent: Any, spans: list[Span], title: str, t_key: str) -> frozenset[str]:
    """Head nouns a description of the topic may use: the title's words ("the crisis" in
    "1997 Asian financial crisis", "the film" in "X (film)") and the common nouns of the
    predicate of an opening "<topic> is a … film" sentence."""
    stop = stopwords()
    nouns = {w for w in normalize_entity(title).split() if w not in stop}
    toks = list(sent)
    v = _first_finite(toks)
    topic_start = min((s[0] for s in spans if s[3] == t_key), default=None)
    if v is None or toks[v].lower_ not in COPULA or topic_start is None or topic_start >= toks[v].idx:
        return frozenset(nouns)
    for t in toks[v + 1:]:
        if t.tag_ not in PREDICATE_TAGS:
            break
        if t.tag_ in NOUN_TAGS and t.text.islower():
            nouns.add(t.lower_)
    return frozenset(nouns)


def _candidates(sent: Any) -> list[tuple[int, int, str]]:
    """Token ranges and kinds of the sentence's anaphoric subjects, in order: a sentence-opening
    pronoun, then the subject of each finite verb."""
    toks = list(sent)
    first = next((k for k, t in enumerate(toks) if not (t.is_punct or t.is_space)), None)
    cands = [(first, first + 1, "pronoun")] if first is not None and toks[first].lower_ in TOPIC_PRONOUNS else []
    cands += [c for v, t in enumerate(toks) if t.tag_ in FINITE_TAGS and (c := _subject(toks, v)) is not None]
    return cands


def topic_anaphor(sent: Any, spans: list[Span], t_key: str, t_label: str, person: Optional[bool],
                  nouns: frozenset[str]) -> Optional[Span]:
    """A mention of the topic for the anaphoric subject of a sentence that does not name it.

    `person` says which pronouns stand for the topic (he/she/his/her when True, it/its/
    they/their when False, none when None); a description needs a head noun in `nouns`.
    """
    if not t_key or any(k == t_key for *_, k in spans):
        return None
    toks = list(sent)
    for i, j, kind in _candidates(sent):
        a, b = _char_span(toks, i, j)
        if any(x < b and a < y for x, y, _, _ in spans):
            continue
        if kind == "pronoun":
            if person is None or (TOPIC_PRONOUNS[toks[i].lower_] == "PERSON") != person:
                continue
        elif not (is_topic_anaphor(sent.doc.text[a:b]) and toks[j - 1].tag_ in NOUN_TAGS
                  and toks[j - 1].lower_ in nouns):
            continue
        return a, b, t_label, t_key
    return None


def topic_is_person(sents: list[Any], label: Optional[str],
                    title_label: Callable[[], Optional[str]]) -> Optional[bool]:
    """Whether the topic is referred to as a person (he/she) or a thing (it/they).

    The passage's most frequent subject pronoun class decides, as the topic is what a
    Wikipedia passage keeps returning to; the small NER model mislabels too many topics
    ("Lyon" PERSON, "Leo Bianchi" ORG) to decide alone. A tie goes to the topic's label,
    else to the title's own NER label; None when nothing tells.
    """
    counts: Counter = Counter()
    for sent in sents:
        toks = list(sent)
        counts.update(TOPIC_PRONOUNS[toks[i].lower_] == "PERSON"
                      for i, _, kind in _candidates(sent) if kind == "pronoun")
    if counts[True] != counts[False]:
        return counts[True] > counts[False]
    if label is None and counts[True]:  # a tie between pronouns, and no label in the passage
        label = title_label()
    return None if label is None else label == "PERSON"


def fold_topic_names(spans_per_sent: list[list[Span]], title: str, t_key: str, person: Optional[bool]) -> None:
    """Re-key (in place) the short names a passage gives its own topic: the name before the
    comma of a "Name, Qualifier" title ("Littlerock" under "Littlerock, California") and, for
    a person, the surname ("Messi" under "Lionel Messi", even where no full name is written)."""
    aliases = set(title_forms(title)) - {t_key}
    words = t_key.split()
    for spans in spans_per_sent:
        for n, (a, b, lab, key) in enumerate(spans):
            surname = (len(words) > 1 and key == words[-1] and lab in FOLDABLE_NAMES
                       and (person or (person is None and lab == "PERSON")))
            if key in aliases or surname:
                spans[n] = (a, b, lab, t_key)


def add_topic_mentions(sents: list[Any], spans_per_sent: list[list[Span]], title: str, t_key: str,
                       title_label: Optional[Callable[[str], Optional[str]]] = None) -> None:
    """Insert the anaphoric-subject mentions of the topic into each sentence's span list (in place).

    The topic's label is its most frequent label among its mentions in the passage (TITLE
    without any); which pronouns stand for it is `topic_is_person`'s call, which may ask
    `title_label(title)` (one more spaCy run, on the title alone).
    """
    if not t_key or not sents:
        return
    labels = Counter(lab for spans in spans_per_sent for _, _, lab, k in spans if k == t_key)
    t_label = min(labels.items(), key=lambda kv: (-kv[1], kv[0]))[0] if labels else None
    person = topic_is_person(sents, t_label, lambda: title_label(title) if title_label else None)
    fold_topic_names(spans_per_sent, title, t_key, person)
    labels = Counter(lab for spans in spans_per_sent for _, _, lab, k in spans if k == t_key)
    t_label = min(labels.items(), key=lambda kv: (-kv[1], kv[0]))[0] if labels else None
    nouns = defining_nouns(sents[0], spans_per_sent[0], title, t_key)
    for sent, spans in zip(sents, spans_per_sent):
        found = topic_anaphor(sent, spans, t_key, t_label or "TITLE", person, nouns)
        if found is not None:
            spans.append(found)
            spans.sort()
