"""Label-free checks that a question asks for its target (beyond ZEST: docs/method.md §3.4, docs/method.md §9.1).

The static checks certify that the path supports the target and that the question hides it, not that the
question asks for it. Read by hand, most accepted tasks of a 20-step co-evolution run (docs/task-labels.md)
were false in one of a few shapes; each check below rejects one shape, from the question and the evidence
path alone (no model, no corpus), never raising on odd input. Each returns a detail (what triggered it)
or None, and runs behind its own `evidence.*` key (`CHECKS`, in the order the pipeline runs them):

- `meta_question` (`evidence.meta_wording`): the question talks about targets, answers, questions or the
  prompt's material instead of the world: one of `META_PATTERNS`, case-insensitive.
- `asks_about_head` (`evidence.head_subject`): "Who was Bill Gates?" → Microsoft. The question is
  who/what + is/was/are/were + (an article) + a name, then at most `MAX_TRAILING` words of `TRAILING`
  ("exactly", "originally" …) before its "?", and the name is a path entity other than the target: a
  hop's head, its surface form or a shorter alias of it (`graph.is_alias`, `graph.is_acronym`: "Gates"
  for "Bill Gates"; "Bill Gates's wife" names another person and passes).
- `unsupported_relation` (`evidence.relation_support`): "What is the capital of Australia?" → Tasmania
  from a sentence that says nothing of a capital. Every *content word* of the question must be written
  in the path's sentences or be a word of a path entity (heads, tails, their surface forms, the hops'
  passage titles, the target). Words compare by `word_stem`, a light suffix stripper (plural, -ed,
  -ing, final e, doubled consonant; `IRREGULAR` maps irregular forms and a few synonyms: wrote/written/
  author → write, born/birth → born, hosted → hold); two stems match when equal or when the shorter, of
  5 letters or more, starts the longer ("origin" / "originated", "direct" / "director"). The relation
  cues the evidence graph reads (verbs and prepositions between two mentions, evidence/graph.py) lie
  inside these sentences, so the sentence-wide match covers them. Not content words: words of one or
  two letters ("co" of "co-founded"; numbers are content words), `FUNCTION_WORDS` (wh-words,
  auxiliaries, pronouns, prepositions, determiners), `GENERIC_WORDS` ("name", "called", "known",
  "located" …), and the word naming the kind of answer right after which/what ("which city", "what is
  the name of the river", "what kind of animal"; in "what is the capital of …" the noun is the relation
  and is checked).
  A superlative ("largest", "highest", "best", "most") needs a superlative of the same stem in the
  sentences (or "most"/"least" itself): a comparative is no support, so "largest moon?" → Mercury from
  "larger than Mercury" is rejected although "larger" and "largest" share the stem "larg".
  What it does not catch: a relation word written in the sentence but belonging to another entity
  ("capital of Rajasthan?" → Ajmer from "his capital at Ajmer") passes when Rajasthan is a path entity;
  it is rejected only when "Rajasthan" is written nowhere on the path (then as an unsupported word). No
  parse says whose capital it is. Paraphrases the stemmer cannot see (demonyms: "French" / "France";
  synonyms outside `IRREGULAR`) are rejected: the price of a check without a model.
- `off_target_page` (`evidence.target_page`): the path's last sentence must be on the target's own page
  (its passage title names the target: the same `title_key`, an acronym, or an alias whose shorter side
  has two words or longer side at most two: "Newton" for "Newton (unit)", "Kilimanjaro" for "Mount
  Kilimanjaro", not "Egypt" for "Muhammad Ali of Egypt"). A
  sentence on another entity's page names the target in passing, and a question written from it asks
  about that page's subject: "What is the largest moon in the Solar System?" → Mercury from Titan's
  page ("… larger than Mercury"), "What is the capital of Rajasthan?" → Ajmer from Prithviraj Chauhan's,
  "Which strait connects the Mediterranean to the Atlantic?" → Red Sea from the Mediterranean's. On 69
  hand-labelled tasks (docs/task-labels-run12.jsonl) 2 of the 27 tasks off their target's page were
  true, 16 of the 42 on it.
- `rank_mismatch` (`evidence.rank_scope`): a rank the question gives must be the rank a path sentence
  gives, at the same scope. A *rank phrase* is a run of rank words (ordinals "first" … "twelfth", "last",
  "3rd"; superlatives, "most", "least") and the word after it (two after "most"/"least"): "first woman",
  "seventh largest indian", "most famous work". Some sentence must write it word for word (by
  `word_stem`), not inside a longer run ("largest moon" is not written by "second-largest moon"), and
  when the sentence goes on with a scope (in/on/of/among/within/by and up to `MAX_SCOPE` words, to a
  comma or "and"/"after"/"than" …) the question must write the scope's content words too (not a kind
  noun such as "region"). "What is the
  first woman to rule Egypt?" → Hatshepsut from "Egypt's second confirmed woman who ruled …, the first
  being Sobekneferu" is rejected (no sentence writes "first woman"), as is "What is the highest volcano in
  the world?" → Kilimanjaro from "the highest volcano in the Eastern Hemisphere" (scope "eastern
  hemisphere"). A rank the sentence paraphrases ("most famous work" against "magnum opus") is rejected:
  the price of a word-for-word rule.
- `off_target_relation` (`evidence.relation_on_target`): `unsupported_relation` with only the path's *last*
  sentence (the one that names the target) as support; entity words are still every hop's. A question
  written from an earlier hop's sentence asks for that hop's subject, and the path's last hop only links
  the target to it: "What is the smallest planet in the Solar System?" → Mars from "Mercury is … the
  smallest in the Solar System" then "Mars is the fourth planet from the Sun"; "What is the capital of the
  Netherlands?" → The Four Seasons (Vivaldi), published in Amsterdam. A true question that composes its
  hops' relations ("the river of the city where X was born") is rejected too: the price of the rule.
"""
from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable, Optional

from coevo.core.scoring import punctuation_to_spaces
from coevo.core.types import Verdict, path_hops
from evidence.graph import is_acronym, is_alias
from evidence.mentions import is_topic_anaphor, normalize_entity, strip_disambiguator, title_key

META_PATTERNS = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"^\W*(?:please\s+)?(?:write|generate|create|compose|formulate|produce|provide|give|ask|make)\b.*\bquestions?\b",
    r"\b(?:answer|reply|response|solution)\s+(?:to|for|of)\s+(?:the|this|that|a|an|your|my|each)\s+question\b",
    r"\bquestion\s*:",
    r"^\W*(?:what|which)\s+(?:is|was|are|were)\s+(?:the|this|that|your|my)\s+(?:target|answer)s?\b",
    r"\b(?:target|answer)\s+(?:entity|entities|word|name)\b",
    r"\b(?:the|this|that)\s+(?:given|following|above|provided)\s+(?:passage|text|sentence|evidence|context|path|"
    r"question|chain)s?\b",
    r"\b(?:according\s+to|based\s+on)\s+the\s+(?:passage|text|sentence|evidence|context|path|chain)s?\b",
    r"\b(?:evidence|reasoning)\s+(?:path|chain)s?\b",
))
FUNCTION_WORDS = frozenset("""
what which who whom whose where when why how
is was are were be been being am do does did done has have had having can could will would shall should may
might must
i me my you your he him his she her it its we us our they them their this that these those there here
one ones someone something anyone anything
a an the some any each every all no not nor other another such same both either neither
of in on at to for from by with about into onto over under between among through during before after since
until within without against across along around near upon toward towards behind beyond as than like via
per off out up down
and or but so yet if then also too very only just still ever even again already s
""".split())
GENERIC_WORDS = frozenset("""
name names named call called known refer referred term word kind type sort thing things part
located situated based find found give given take place
""".split())
# After which/what (and "what is the name of", "what kind of"), the next word names the answer's kind.
_KIND_OPENERS = re.compile(r"\b(?:which|what)\s+(?:(?:is|was|are|were)\s+(?:the\s+)?name\s+of\s+(?:the\s+)?|"
                           r"(?:kind|type|sort)\s+of\s+(?:an?\s+|the\s+)?)?([^\W\d_]+)", re.IGNORECASE)
IRREGULAR = {w: lemma for lemma, forms in {
    "write": "wrote written writes writer writers writing author authors authored",
    "born": "birth births birthplace bore borne",
    "die": "died dies dying death deaths dead",
    "win": "won wins winner winners winning",
    "lead": "led leads leader leaders leading",
    "hold": "held holds holding host hosts hosted hosting",  # "hosted": a synonym
    "build": "built builds builder building",
    "make": "made makes maker making",
    "begin": "began begun begins beginning",
    "become": "became becomes becoming",
    "fight": "fought fights fighting",
    "sing": "sang sung sings singer singers singing",
    "take": "took taken takes taking",
    "know": "knew known knows",
    "grow": "grew grown grows",
    "rise": "rose risen rises",
    "speak": "spoke spoken speaks speaker speakers",
    "teach": "taught teaches teacher teachers",
    "bring": "brought brings",
    "buy": "bought buys",
    "sell": "sold sells",
    "tell": "told tells",
    "think": "thought thinks",
    "draw": "drew drawn draws",
    "fly": "flew flown flies",
    "run": "ran runs running",
    "marry": "married marries marriage wife husband spouse",
    "found": "established establishes establishment",  # a synonym
}.items() for w in forms.split() + [lemma]}
# Superlatives of irregular or "-est"-less form; "most"/"least" mark the periphrastic ones.
_IRREGULAR_SUPERLATIVES = {"best": "good", "worst": "bad", "most": "most", "least": "least"}
# Words of 6 letters or more ending in "est" that are no superlative.
_EST_WORDS = frozenset("""
forest forests interest honest modest earnest harvest protest contest request conquest arrest suggest digest
invest manifest priest inquest bequest southwest northwest midwest everest budapest bucharest tempest behest
attest detest infest molest divest
""".split())
ORDINALS = frozenset("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth last".split())
_ORDINAL_NUMBER = re.compile(r"^\d+(?:st|nd|rd|th)$")
SCOPE_PREPOSITIONS = frozenset("in on of among within by".split())
SCOPE_STOPS = frozenset("and or but after than which who whom that while whereas before since with".split())
MAX_SCOPE = 4
DATE_NOUNS = frozenset("century centuries millennium millennia".split())
# Nouns that name a scope's kind, not the scope: "in the Pacific Northwest region" is "in the Pacific Northwest".
SCOPE_KIND_WORDS = frozenset("region regions area areas".split())
_CLAUSE_BREAK = re.compile(r"[,;:()\[\]]|\s[-–—]\s")
MAX_TRAILING = 2
TRAILING = frozenset("exactly really actually originally today now then once historically".split())
_ASK_HEAD = re.compile(r"^\s*(?:who|what)\s+(?:is|was|are|were)\s+(.+?)[\s?？.!]*$", re.IGNORECASE | re.DOTALL)


def _words(text: Any) -> list[str]:
    """Lower-case, accent-folded words, punctuation as a break, possessive 's dropped ("Spider-Man's" →
    spider, man); articles are dropped with the docs/method.md §5.4 normalization."""
    return normalize_entity(punctuation_to_spaces(text)).split() if isinstance(text, str) else []


def word_stem(word: str) -> str:
    """The light stem both sides of `unsupported_relation` compare: "capitals" → "capital", "moved" →
    "mov", "stopped" → "stop", "cities" → "city", "wrote" → "write"."""
    w = IRREGULAR.get(word, word)
    for suffix, repl in (("ies", "y"), ("ied", "y"), ("ing", ""), ("ed", ""), ("s", "")):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
            w = w[:-len(suffix)] + repl
            break
    if w.endswith("e") and len(w) >= 4:
        w = w[:-1]
    if len(w) > 3 and w[-1] == w[-2] and w[-1] not in "aeiouls":
        w = w[:-1]
    return w


def superlative_stem(word: str) -> Optional[str]:
    """The stem of a superlative ("largest" → "larg", "biggest" → "big", "best" → "good", "most" →
    "most"), None for any other word."""
    if word in _IRREGULAR_SUPERLATIVES:
        return _IRREGULAR_SUPERLATIVES[word]
    if len(word) < 6 or not word.endswith("est") or word in _EST_WORDS or word.isdigit():
        return None
    return word_stem(word[:-3] + "ed")  # "larg|est" → "larg|ed" → "larg": the stem rules of "-ed" forms


def _matches(a: str, b: str) -> bool:
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    return short == long_ or (len(short) >= 5 and long_.startswith(short))


def _hops(path: Any) -> list[Any]:
    """The path's hops that carry a sentence (a hand-edited dump may lack one)."""
    return [h for h in path_hops(path) if isinstance(getattr(h, "sentence", None), str)]


def _names(hop: Any, ends: tuple[str, ...]) -> list[str]:
    """Names of the hop's `ends` ("head", "tail"): display name, key and surface form (not a pronoun)."""
    out = []
    for end in ends:
        mention = getattr(hop, f"{end}_mention", "")
        out += [getattr(hop, end, ""), getattr(hop, f"{end}_key", "")]
        out += [mention] if isinstance(mention, str) and not is_topic_anaphor(mention) else []
    return [n for n in out if isinstance(n, str) and n.strip()]


def _kind_words(question: str) -> set[str]:
    """The word naming the answer's kind right after which/what ("which city" → {"city"})."""
    return {m.group(1).lower() for m in _KIND_OPENERS.finditer(question)}


def unsupported_words(question: Any, target: Any, path: Any, last_hop: bool = False) -> list[str]:
    """Content words of the question that nothing on the path writes (the module docstring's rule), in
    question order; [] when every one is supported (or the path has no sentence: `no_evidence` is another check).
    `last_hop`: only the last hop's sentence (the target's) counts as support; entity words are still the path's."""
    hops = _hops(path)
    if not isinstance(question, str) or not hops:
        return []
    sentence_words = [w for h in (hops[-1:] if last_hop else hops) for w in _words(h.sentence)]
    entity_words = {w for h in hops for n in _names(h, ("head", "tail")) + [strip_disambiguator(h.title)]
                    for w in _words(n)} | set(_words(target))
    stems = {word_stem(w) for w in sentence_words} | {word_stem(w) for w in entity_words}
    superlatives = {s for s in map(superlative_stem, sentence_words) if s is not None}
    skip = FUNCTION_WORDS | GENERIC_WORDS | _kind_words(question)
    out = []
    for word in dict.fromkeys(_words(question)):
        if word in skip or word in entity_words or (len(word) <= 2 and not word.isdigit()):
            continue
        sup = superlative_stem(word)
        if sup is not None:
            if sup not in superlatives:
                out.append(word)
        elif not any(_matches(word_stem(word), s) for s in stems):
            out.append(word)
    return out


def asked_head(question: Any, target: Any, path: Any) -> Optional[str]:
    """The path entity the question asks about as a whole ("Who was Bill Gates?" → "Bill Gates"), else None."""
    match = _ASK_HEAD.match(question) if isinstance(question, str) else None
    if match is None:
        return None
    words, trailing = _words(match.group(1)), 0
    while len(words) > 1 and words[-1] in TRAILING and trailing < MAX_TRAILING:
        words, trailing = words[:-1], trailing + 1
    subject = " ".join(words)
    if not subject:
        return None
    target_key = normalize_entity(strip_disambiguator(target)) if isinstance(target, str) else ""
    for hop in _hops(path):
        for name in _names(hop, ("head",)):
            key = normalize_entity(punctuation_to_spaces(strip_disambiguator(name)))
            # The name or a shorter form of it ("Gates", "IBM"); "Bill Gates wife" names someone else.
            shorter = len(words) < len(key.split()) and (is_alias(subject, key) or is_acronym(subject, key))
            if key and key != target_key and (subject == key or shorter):
                return name
    return None


def meta_wording(question: Any, target: Any = None, path: Any = None) -> Optional[str]:
    """The wording about targets, answers, questions or the prompt's material that the question holds, else None."""
    if not isinstance(question, str):
        return None
    for pattern in META_PATTERNS:
        found = pattern.search(question)
        if found:
            return found.group(0).strip()
    return None


def off_target_page(question: Any, target: Any, path: Any) -> Optional[str]:
    """The title of the page the path's last sentence is on when it is not the target's page, else None
    (also when the path has no titled sentence or the target is not a string)."""
    hops = _hops(path)
    title = getattr(hops[-1], "title", None) if hops else None
    page, want = (title_key(x) if isinstance(x, str) else "" for x in (title, target))
    if not page or not want:
        return None
    short, long_ = sorted((page, want), key=lambda k: len(k.split()))
    named = page == want or is_acronym(page, want) or is_acronym(want, page) or (
        (len(short.split()) >= 2 or len(long_.split()) <= 2) and is_alias(page, want))
    return None if named else title


_NOT_SCOPE_WORDS = FUNCTION_WORDS | GENERIC_WORDS | SCOPE_KIND_WORDS


def _is_rank(word: str) -> bool:
    return word in ORDINALS or bool(_ORDINAL_NUMBER.match(word)) or superlative_stem(word) is not None


def rank_phrases(words: list[str]) -> list[tuple[int, int]]:
    """(start, end) of each rank phrase in `words`: a run of rank words and the word after it, two after
    "most"/"least" ("fourth most notable peak on earth" → the span of "fourth most notable peak")."""
    out, i = [], 0
    while i < len(words):
        if not _is_rank(words[i]):
            i += 1
            continue
        j = i
        while j < len(words) and _is_rank(words[j]):
            j += 1
        if j < len(words) and words[j] in DATE_NOUNS:  # "18th-century": a date, not a rank
            i = j
            continue
        out.append((i, min(j + (2 if words[j - 1] in ("most", "least") else 1), len(words))))
        i = j
    return out


def _scope(clause: list[str], k: int) -> list[str]:
    """Content words of the scope that opens at `clause[k]` ("in the eastern hemisphere" → eastern,
    hemisphere), [] when no scope preposition stands there."""
    if k >= len(clause) or clause[k] not in SCOPE_PREPOSITIONS:
        return []
    out = []
    for word in clause[k + 1:k + 1 + MAX_SCOPE]:
        if word in SCOPE_STOPS:
            break
        if word not in _NOT_SCOPE_WORDS and (len(word) > 2 or word.isdigit()):
            out.append(word)
    return out


def _same(a: str, b: str) -> bool:
    return _matches(word_stem(a), word_stem(b))


def rank_mismatch(question: Any, target: Any, path: Any) -> Optional[str]:
    """The question's first rank phrase that no path sentence writes at the question's scope (the module
    docstring's rule), with what the sentence's scope holds when that is what differs; None when all hold
    or the path has no sentence (`no_evidence` is another check)."""
    words = _words(question)
    clauses = [_words(c) for h in _hops(path) for c in _CLAUSE_BREAK.split(h.sentence)]
    if not clauses:
        return None
    for start, end in rank_phrases(words):
        phrase, scopes = words[start:end], []
        for clause in clauses:
            for j in range(len(clause) - len(phrase) + 1):
                if all(_same(a, b) for a, b in zip(phrase, clause[j:])) and (j == 0 or not _is_rank(clause[j - 1])):
                    scopes.append(_scope(clause, j + len(phrase)))
        held = [s for s in scopes if all(any(_same(w, q) for q in words) for w in s)]
        if not held:
            scope = next((s for s in scopes if s), None)
            return " ".join(phrase) + (f" (the sentence's scope: {' '.join(scope)})" if scope else "")
    return None


def _unsupported(question: Any, target: Any, path: Any, last_hop: bool = False) -> Optional[str]:
    words = unsupported_words(question, target, path, last_hop)
    return " ".join(words) if words else None


# (config key under `evidence`, reason code, finder(question, target, path) -> detail or None), in run order.
CHECKS: tuple[tuple[str, str, Callable[[Any, Any, Any], Optional[str]]], ...] = (
    ("meta_wording", "meta_question", meta_wording),
    ("head_subject", "asks_about_head", asked_head),
    ("relation_support", "unsupported_relation", _unsupported),
    ("target_page", "off_target_page", off_target_page),
    ("rank_scope", "rank_mismatch", rank_mismatch),
    ("relation_on_target", "off_target_relation", partial(_unsupported, last_hop=True)),
)


def task_check_verdict(verdict: Verdict, question: Any, target: Any, path: Any, keys: Any) -> Verdict:
    """The `CHECKS` whose config key is in `keys`, in order, on a question that passed the earlier checks:
    the first that finds something rejects with its reason code and detail. An earlier rejection is
    returned as it is."""
    for key, reason, find in CHECKS:
        if not verdict.ok:
            break
        detail = find(question, target, path) if key in keys else None
        if detail is not None:
            verdict = Verdict(False, reason, verdict.evidence, detail)
    return verdict
