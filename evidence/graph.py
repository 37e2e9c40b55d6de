"""Local evidence graph over retrieved passages (docs/method.md §3.3).

Nodes are normalized entities (`normalize_entity` keys) with their surface forms, labels and
passages as attributes. An edge joins two entities mentioned in one sentence and keeps every
supporting sentence as a `Support` with its cue:

- `relation` when a lexical relation links the two mentions in the sentence: a verb,
  preposition or possessive token between them (tagger tags stored in the entity index:
  VB*, IN, TO, POS, which covers "X of Y" and "X's Y"), or an apposition ("X, the Y",
  "X (Y)") — and the gap between them is short (at most MAX_GAP_WORDS words), since a verb
  somewhere in a long sentence does not relate its two ends;
- `co_mention` otherwise.

Edges rank by (cue, support count, best retrieval score): `edge_rank`.

Mentions come from the entity index (NER spans of the allowed types, numeric values,
title-cased phrases, passage titles, and the subjects that stand for the passage topic:
see evidence/topic.py). `anchors` add text matches of given names (the path builder anchors
its target, so "tennis player" counts as a mention of the target "Tennis", though "jaws" in lower case
does not of "Jaws (film)": `anchor_pattern`); `reach_node`
does the same for a name the graph lacks after the fact (answers that are no entity).
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Iterable, Optional

import networkx as nx

from evidence.entities import EntityIndex
from evidence.mentions import (
    Mention,
    is_topic_anaphor,
    needs_capital,
    normalize_entity,
    stopwords,
    strip_disambiguator,
    title_key,
)

RELATION, CO_MENTION = "relation", "co_mention"
CUE_RANK = {RELATION: 1, CO_MENTION: 0}
MAX_GAP_WORDS = 8
MAX_GAP_CHARS = 160  # no gap this long has only MAX_GAP_WORDS words in practice
MAX_PAIRED_MENTIONS, TABLE_WINDOW = 24, 6
MEMO_PASSAGES = 50_000  # sentence-pair memo size (passages) before it is reset
_WORD = re.compile(r"\w+", re.UNICODE)
# Apposition / parenthetical: "Hank Snow, the Singing Ranger", "Tennessee (Cherokee: ...)".
_APPOSITION = re.compile(r"^\s*(?:,\s*(?:a|an|the)\s|\()", re.IGNORECASE)
# Text fallback for the two relation shapes the issue names, should the tagger miss them.
_POSSESSIVE_OR_OF = re.compile(r"^\s*['’]s?\b|\bof\b", re.IGNORECASE)


@dataclass(frozen=True)
class Support:
    """One sentence supporting an edge; `ends` are (key, surface) of both mentions in it.

    Supports are memoized per passage and shared by every graph that holds the passage, so
    they carry no retrieval score: a graph keeps the score of each of its passages in
    `graph.graph["passages"]` (see `support_score`).
    """

    passage_id: str
    title: str
    sentence_index: int
    sentence: str
    cue: str
    ends: tuple[tuple[str, str], tuple[str, str]]

    def surface(self, key: str) -> str:
        """How the sentence writes the entity `key` ('' when it is not an end of this edge)."""
        return next((s for k, s in self.ends if k == key), "")


def lexical_cue(text: str, a: Mention, b: Mention, linkers: Iterable[int] = ()) -> str:
    """`relation` or `co_mention` for two mentions of one passage `text` (offsets in `text`)."""
    first, second = (a, b) if a.start <= b.start else (b, a)
    if first.end > second.start:
        return CO_MENTION  # overlapping spans: nothing lies between them
    if second.start - first.end > MAX_GAP_CHARS:  # cheap pre-check: surely too many words
        return CO_MENTION
    gap = text[first.end:second.start]
    if len(_WORD.findall(gap)) > MAX_GAP_WORDS:
        return CO_MENTION
    links = linkers if isinstance(linkers, (list, tuple)) else sorted(linkers)
    i = bisect.bisect_left(links, first.end)
    if i < len(links) and links[i] < second.start:
        return RELATION
    if _APPOSITION.match(gap) or _POSSESSIVE_OR_OF.search(gap):
        return RELATION
    return CO_MENTION


def scored_passages(passages: Any) -> Iterable[tuple[str, float]]:
    """(passage id, score) from ids, Hits, Passages or (id, score) pairs; junk is skipped."""
    if passages is None or isinstance(passages, (str, bytes)):
        passages = [passages] if isinstance(passages, str) else []
    for item in passages:
        if isinstance(item, str):
            yield item, 0.0
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            yield item[0], float(item[1]) if isinstance(item[1], (int, float)) else 0.0
        elif isinstance(getattr(item, "passage_id", None), str):
            yield item.passage_id, float(getattr(item, "score", 0.0) or 0.0)
        elif isinstance(getattr(item, "id", None), str):
            yield item.id, 0.0


def _add_node(graph: nx.Graph, m: Mention, passage_id: str) -> None:
    attrs = graph.nodes.get(m.key)
    if attrs is None:
        graph.add_node(m.key, surfaces=Counter(), labels=Counter(), passages=set())
        attrs = graph.nodes[m.key]
    attrs["surfaces"][m.text] += 1
    attrs["labels"][m.label] += 1
    attrs["passages"].add(passage_id)


Pair = tuple[str, str, Support]  # (key u, key v, the sentence supporting their edge)


def sentence_pairs(ann: Any, sent: Any) -> tuple[Pair, ...]:
    """Entity pairs of one sentence with their support (cue: best over repeated mentions).

    Tables and long lists flattened into one "sentence" hold dozens of entities; pairing
    all of them costs O(n²) and says nothing, so there each entity pairs with its neighbours.
    """
    by_key: dict[str, list[Mention]] = {}
    for m in sent.mentions:
        by_key.setdefault(m.key, []).append(m)
    keys = list(by_key)
    window = len(keys) if len(keys) <= MAX_PAIRED_MENTIONS else TABLE_WINDOW
    pairs = []
    for i, u in enumerate(keys):
        for v in keys[i + 1:i + 1 + window]:
            cue = CO_MENTION
            for x in by_key[u]:
                for y in by_key[v]:
                    if lexical_cue(ann.text, x, y, sent.linkers) == RELATION:
                        cue = RELATION
                        break
            ends = ((u, by_key[u][0].text), (v, by_key[v][0].text))
            pairs.append((u, v, Support(ann.passage_id, ann.title, sent.index, sent.text, cue, ends)))
    return tuple(pairs)


def _passage_pairs(index: EntityIndex, ann: Any) -> list[tuple[Pair, ...]]:
    # Memoized on the index: the same passages come back for many targets in one process.
    memo = index.derived.setdefault("sentence_pairs", {})
    pairs = memo.get(ann.passage_id)
    if pairs is None:
        if len(memo) >= MEMO_PASSAGES:
            memo.clear()
        pairs = memo[ann.passage_id] = [sentence_pairs(ann, sent) for sent in ann.sentences]
    return pairs


def _add_sentence(graph: nx.Graph, ann: Any, mentions: Iterable[Mention], score: float,
                  pairs: Iterable[Pair]) -> None:
    for m in mentions:
        _add_node(graph, m, ann.passage_id)
    adj = graph.adj
    for u, v, sup in pairs:
        data = adj[u].get(v)
        if data is None:
            graph.add_edge(u, v, supports=[sup], cue=sup.cue, score=score)
        else:
            data["supports"].append(sup)
            if sup.cue == RELATION:
                data["cue"] = RELATION
            if score > data["score"]:
                data["score"] = score


@lru_cache(maxsize=1 << 12)
def _base_char(ch: str) -> str:
    return unicodedata.normalize("NFD", ch)[0]


def fold_accents(text: str) -> str:
    """`text` without accents, one character for one ("Zürich" → "Zurich"), so offsets of a
    match in the result are offsets in `text`."""
    return text if text.isascii() else "".join(_base_char(ch) for ch in text)


def anchor_pattern(name: Any, lower: Optional[bool] = None) -> Optional[re.Pattern]:
    """Case-blind whole-word pattern of an entity name (an anchor matched by text), to be
    searched in `fold_accents` text: answers and sentences do not always agree on accents.

    `lower` False: a match must not start with a lower-case letter ("jaws" in "the lack of jaws" is a
    common noun, not "Jaws (film)"); None: False for a capitalised name (`needs_capital`), as
    `lower_case_mentions` decides with the corpus at hand (docs/method.md §3.3).
    """
    words = _WORD.findall(fold_accents(strip_disambiguator(name))) if isinstance(name, str) else []
    if not words or not title_key(name):
        return None
    # Accents are folded before matching, so [a-z] covers the Latin lower-case letters.
    proper = "" if (not needs_capital(name) if lower is None else lower) else r"(?-i:(?![a-z]))"
    return re.compile(r"(?<!\w)" + proper + r"\W+".join(re.escape(w) for w in words[:20]) + r"(?!\w)",
                      re.IGNORECASE)


def lower_case_mentions(name: Any, index: Any) -> bool:
    """Whether lower-case text may mention `name`: it is no capitalised name (`needs_capital`), or its
    own page (the passage titled exactly `name`) writes it in lower case: "A chord, in music, is …" makes
    "Chord (music)" a common noun its title capitalises by convention; the page of "Jaws (film)" never
    writes "jaws"."""
    if not needs_capital(name):
        return True
    pid = index.passage_for_title(name)
    passage = index.corpus[pid] if pid is not None else None
    if passage is None or normalize_entity(passage.title) != normalize_entity(name):
        return False
    pattern = anchor_pattern(name, lower=True)
    return pattern is not None and any(m.group(0)[:1].islower() for m in pattern.finditer(fold_accents(passage.text)))


def _anchored(sent: Any, anchors: list[tuple[str, re.Pattern]]) -> Any:
    """The sentence with a text match of each anchor entity added as a mention (label ANCHOR):
    the target's lower-case or unrecognized mentions ("tennis player") still count."""
    extra = []
    for key, pattern in anchors:
        if any(m.key == key for m in sent.mentions):
            continue
        hit = pattern.search(fold_accents(sent.text))
        if hit and not any(m.start < sent.start + hit.end() and sent.start + hit.start() < m.end
                           for m in sent.mentions):
            extra.append(Mention(sent.text[hit.start():hit.end()], "ANCHOR", key, sent.start + hit.start(),
                                 sent.start + hit.end()))
    if not extra:
        return sent
    return replace(sent, mentions=tuple(sorted(sent.mentions + tuple(extra), key=lambda m: m.start)))


def add_passages(graph: nx.Graph, passages: Any, index: EntityIndex, anchors: Iterable[str] = ()) -> nx.Graph:
    """Add the entities and edges of `passages` (each passage once) to `graph`; returns it.

    `anchors` are entity names also matched by text in every sentence (see `_anchored`);
    they stick to the graph, so later `add_passages` calls match them too.
    """
    seen = graph.graph.setdefault("passages", {})
    patterns = graph.graph.setdefault("anchors", {})
    for name in [anchors] if isinstance(anchors, str) else anchors or ():
        key = title_key(name)
        pattern = anchor_pattern(name, lower_case_mentions(name, index)) if key not in patterns else None
        if pattern is not None:
            patterns[key] = pattern
    anchor_list = list(patterns.items())
    for pid, score in scored_passages(passages):
        if pid in seen:
            seen[pid] = max(seen[pid], score)
            continue
        ann = index.annotation(pid)
        if ann is None:
            continue
        seen[pid] = score
        for sent, pairs in zip(ann.sentences, _passage_pairs(index, ann)):
            anchored = _anchored(sent, anchor_list) if anchor_list else sent
            if anchored is not sent:
                pairs = sentence_pairs(ann, anchored)
            _add_sentence(graph, ann, anchored.mentions, score, pairs)
    return graph


def build_graph(passages: Any, index: EntityIndex, anchors: Iterable[str] = ()) -> nx.Graph:
    """Evidence graph of passages (ids, Hits, Passages or (id, score) pairs) from the index."""
    return add_passages(nx.Graph(), passages, index, anchors)


def reach_node(graph: nx.Graph, text: Any, index: EntityIndex) -> Optional[str]:
    """`resolve_node`, else `text` found by text in the graph's sentences and added as an
    anchor node (label ANCHOR) with edges to the sentences' mentions; None when not written.

    Answers need not be entities: a lower-case noun ("lawyer"), a number spaCy drops ("two"),
    an unrecognized title. Like `add_passages` anchors, the name stays registered on the
    graph, so passages added later match it too.
    """
    node = resolve_node(graph, text)
    if node is not None:
        return node
    pattern, key = anchor_pattern(text, lower_case_mentions(text, index)), title_key(text)
    if pattern is None or not key:
        return node
    graph.graph.setdefault("anchors", {})[key] = pattern
    for pid, score in list(graph.graph.get("passages", {}).items()):
        ann = index.annotation(pid)
        for sent in ann.sentences if ann is not None else ():
            anchored = _anchored(sent, [(key, pattern)])
            if anchored is sent:
                continue
            # Only what the anchor adds: the sentence's other nodes and edges are in the graph.
            pairs = [p for p in sentence_pairs(ann, anchored) if key in (p[0], p[1])]
            _add_sentence(graph, ann, [m for m in anchored.mentions if m.key == key], score, pairs)
    return key if key in graph else None


def edge_rank(graph: nx.Graph, u: str, v: str) -> tuple[int, int, float]:
    """Sort key (higher is better): relation over co-mention, then support count, then score."""
    data = graph.edges[u, v]
    return CUE_RANK[data["cue"]], len(data["supports"]), data["score"]


def best_support(graph: nx.Graph, u: str, v: str, exclude: Iterable[tuple[str, int]] = ()) -> Optional[Support]:
    """The edge's strongest sentence (best cue, then retrieval score, then corpus position),
    skipping (passage id, sentence index) pairs in `exclude`; None when none is left."""
    used, scores = set(exclude), graph.graph.get("passages", {})
    sups = [s for s in graph.edges[u, v]["supports"] if (s.passage_id, s.sentence_index) not in used]
    return min(sups, key=lambda s: (-CUE_RANK[s.cue], -scores.get(s.passage_id, 0.0), s.passage_id,
                                    s.sentence_index), default=None)


def support_score(graph: nx.Graph, support: Support) -> float:
    """Retrieval score of the support's passage in this graph (its best retrieval)."""
    return float(graph.graph.get("passages", {}).get(support.passage_id, 0.0))


def display_name(graph: nx.Graph, key: str) -> str:
    """Most frequent surface form of a node, without a leading article ("the Beatles" → "Beatles")."""
    surfaces = graph.nodes[key]["surfaces"] if key in graph else None
    if not surfaces:
        return key
    # A topic pronoun or description ("It", "the city" for Warsaw) is a mention, never a name.
    named = {s: c for s, c in surfaces.items() if not is_topic_anaphor(s)} or surfaces
    name = min(named.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    return re.sub(r"^(?:the|a|an)\s+", "", name, flags=re.IGNORECASE).strip() or name


def node_label(graph: nx.Graph, key: str) -> str:
    """Most frequent label of a node ('' when unknown)."""
    labels = graph.nodes[key]["labels"] if key in graph else None
    return min(labels.items(), key=lambda kv: (-kv[1], kv[0]))[0] if labels else ""


def is_alias(a: str, b: str) -> bool:
    """Whether one key's tokens are a contiguous run of the other's ("snow" / "hank snow")."""
    ta, tb = a.split(), b.split()
    if not ta or not tb:
        return False
    short, long_ = (ta, tb) if len(ta) <= len(tb) else (tb, ta)
    return any(long_[i:i + len(short)] == short for i in range(len(long_) - len(short) + 1))


def _content(tokens: list[str]) -> set[str]:
    stop = stopwords()
    return {t for t in tokens if t not in stop}


_ACRONYM_SKIP = frozenset({"of", "and", "for", "in", "on", "de", "to"})


def is_acronym(short: str, long_: str) -> bool:
    """Whether one-word key `short` abbreviates `long_`: its initials ("ip" / "internet
    protocol") or, for a one-word `long_`, its first letters ("dy" / "dysprosium")."""
    if " " in short or not 2 <= len(short) <= 6 or short == long_:
        return False
    words = [w for w in long_.split() if w not in _ACRONYM_SKIP]
    if len(words) >= 2:
        return short == "".join(w[0] for w in words)
    return len(short) <= 3 and long_.startswith(short)


def same_entity(a: str, b: str) -> bool:
    """Keys that name one entity for path purposes: equal, alias or acronym of each other."""
    return a == b or is_alias(a, b) or is_acronym(a, b) or is_acronym(b, a)


def resolve_node(graph: nx.Graph, text: Any) -> Optional[str]:
    """The node naming `text`, tried in order: same key; same title key; the shortest node it
    abbreviates ("Stanley Hall" → "g stanley hall"); the longest node inside it that holds
    more than half of its content words ("President James K. Polk" → "james k polk")."""
    key = normalize_entity(text)
    if not key:
        return None
    for cand in (key, title_key(text)):
        if cand in graph:
            return cand
    n_tok = len(key.split())
    hosts = [n for n in graph.nodes if len(n.split()) > n_tok and is_alias(key, n)]
    if hosts:
        return min(hosts, key=lambda n: (len(n.split()), -len(graph.nodes[n]["passages"]), n))
    content = _content(key.split())
    inner = [n for n in graph.nodes if len(n.split()) < n_tok and is_alias(n, key)
             and 2 * len(_content(n.split()) & content) > len(content)]
    if inner:
        return min(inner, key=lambda n: (-len(n.split()), -len(graph.nodes[n]["passages"]), n))
    return None
