"""`evidence.answer_type`: the question asks for the kind of thing its target is (beyond ZEST, docs/method.md §3.4).

The static checks certify that the path supports the target and that the question hides it, not that
the question asks for it. A 12-step co-evolution probe (docs/learning.md) accepted "What is the capital
of Botswana?" → Kalahari Desert and "How many people are there in Donetsk?" → Stalin: a solver that
copies the right name from its passage is scored wrong on those, so they teach it nothing.

The contract, deterministic and model-free:
- `asked_kind(question)` reads what the question asks for from its first asking wh-word (the
  question's first word, or one after a preposition or a request: not a relative "who"): who/whom/whose → a
  person, where → a place, when → a time, how many/much/long/… → a number, what/which + a noun it
  knows heading the phrase that follows ("which city", "what is the name of the river", "which Roman
  emperor") → that noun's kind. Anything else (no wh-word,
  "what is …" with a noun not listed, "why") asks for no known kind and is never rejected.
- Each kind lists the entity labels (spaCy's, as the target checks found them: `target_label`) an
  answer of that kind may carry. A target whose label is typed (`TYPED_LABELS`) and not in the list is
  rejected, `wrong_answer_type`. `NP` and `TITLE` (a noun phrase or a page title of unknown type) are
  never rejected: the check only refuses what the labels show to be a mismatch.
The lists lean wide (a "who" may be a band, a party or a country that won) so that a wrong spaCy label
rejects a good task rarely; the cost of a miss is one bad task, the cost of a false rejection one lost task.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from coevo.core.types import Verdict
from evidence.mentions import ALLOWED_LABELS, VALUE_LABELS

TYPED_LABELS = (ALLOWED_LABELS - {"NP", "TITLE"}) | VALUE_LABELS
ANSWER_LABELS: dict[str, frozenset[str]] = {
    "person": frozenset({"PERSON", "ORG", "NORP", "GPE"}),  # who won: a team, a party, a country
    "place": frozenset({"GPE", "LOC", "FAC", "ORG"}),  # where: a city, a region, a building, a university
    "settlement": frozenset({"GPE"}),  # which city / capital / country: not a river or a desert
    "geography": frozenset({"LOC", "GPE", "FAC"}),  # which river / mountain / island
    "time": frozenset({"DATE", "TIME", "CARDINAL", "EVENT"}),
    "number": VALUE_LABELS | {"DATE"},
    "language": frozenset({"LANGUAGE", "NORP"}),
}
_NOUN_KINDS = {
    "person": """person people man woman king queen president emperor empress author writer poet novelist
        playwright actor actress singer composer musician scientist physicist chemist mathematician
        philosopher painter artist inventor explorer ruler founder pope politician leader soldier god
        goddess character""",
    "settlement": "city capital town village country nation municipality",
    "geography": "river mountain lake sea ocean desert island continent peninsula volcano",
    "time": "year century decade date month",
    "language": "language",
}
ASK_NOUNS = {noun: kind for kind, nouns in _NOUN_KINDS.items() for noun in nouns.split()}
_HOW_NUMBER = frozenset("many much long old far tall high big large deep".split())  # "how many …" asks a number
_WH_KIND = {"who": "person", "whom": "person", "whose": "person", "where": "place", "when": "time"}
# Words between "what/which" and the noun that names the kind: "what is the name of the river".
_FILLERS = frozenset("is was are were the a an name kind type sort of".split())
# Words that end the noun phrase after the fillers: an auxiliary, a relative pronoun, a preposition, or an
# article (after the fillers one starts a new phrase: "what connects the city …" names no kind).
_PHRASE_END = frozenset("""who whom whose which that is was are were did does do has have had can could will would
    in on at of to by for from with and or between into through across over under near about after before
    during the a an""".split())
# A wh-word asks the question only where it opens it or follows one of these ("in which year", "do you
# know who", "… is which town"); after a noun it opens a relative clause ("the scientist who found it").
_ASK_AFTER = frozenset("""in on at of to by for from with during after before under since until into near about
    through between know tell me name say guess is was are were and""".split())
# A possessive noun does not name the answer ("which city's mayor" asks for a person): the word and a
# following "'s" stay one token.
_TOKEN = re.compile(r"[a-z0-9]+(?:['’]s\b)?")


def asked_kind(question: Any) -> Optional[str]:
    """The kind of answer the question asks for (a key of `ANSWER_LABELS`), or None when its wording
    names none this module knows. Never raises."""
    if not isinstance(question, str):
        return None
    words = _TOKEN.findall(question.lower())
    for i, word in enumerate(words):
        if i > 0 and words[i - 1] not in _ASK_AFTER:
            continue
        if word in _WH_KIND:
            return _WH_KIND[word]
        if word == "how":
            return "number" if i + 1 < len(words) and words[i + 1] in _HOW_NUMBER else None
        if word in ("what", "which"):
            return _noun_kind(words[i + 1:i + 14])
    return None


def _noun_kind(rest: list[str]) -> Optional[str]:
    """The kind named by the noun phrase after "what/which": fillers skipped, then the first listed noun
    before the phrase ends ("the German Communist Party leader who …" → person; "city's mayor" → None)."""
    while rest and rest[0] in _FILLERS:
        rest = rest[1:]
    for word in rest[:5]:
        if word in ASK_NOUNS:
            return ASK_NOUNS[word]
        if word in _PHRASE_END or any(ch.isdigit() for ch in word) or "'" in word or "’" in word:
            return None
    return None


def answer_type_verdict(verdict: Verdict, question: Any, label: Optional[str]) -> Verdict:
    """A question that passed the checks stays accepted unless it asks for a kind of answer its target's
    entity `label` cannot be: `wrong_answer_type`, detail "<kind> asked, target <LABEL>". An earlier
    rejection is returned as it is."""
    if not verdict.ok or label not in TYPED_LABELS:
        return verdict
    kind = asked_kind(question)
    if kind is None or label in ANSWER_LABELS[kind]:
        return verdict
    return Verdict(False, "wrong_answer_type", verdict.evidence, f"{kind} asked, target {label}")
