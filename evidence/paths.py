"""Evidence paths e0 → e1 → … → target, built by recursive retrieval (docs/method.md §3.3).

Construction runs backwards from the target: retrieve passages for it, build the local
graph, rank the target's neighbours (`graph.edge_rank`), keep the best and sample
`branching - 1` more, retrieve for each kept entity, and repeat up to `max_hops`. A branch
that runs out of reliable neighbours ends early (the hop budget is an upper bound).
Retrieval is batched per depth: at most 1 + b + b² + … searches for a path tree.

Reliable neighbours exclude dates, numbers and nationalities (they retrieve noise and make
poor bridges), hubs mentioned by more than 1% of the corpus, and any entity that is an
alias or acronym of one already on the branch ("Snow" after "Hank Snow", "IP" after
"Internet Protocol"). Every hop uses its own sentence. A disambiguated target ("Jaws (film)") links
only through sentences that name that sense (`mentions.names_sense`): the bare word is not enough.
"""
from __future__ import annotations

import random
import re
from typing import Any, Optional

import networkx as nx

from coevo.core.types import EvidencePath, Hop
from evidence.graph import (
    Support,
    add_passages,
    best_support,
    display_name,
    edge_rank,
    lower_case_mentions,
    node_label,
    resolve_node,
    same_entity,
    scored_passages,
    support_score,
)
from evidence.lazy_entities import EntityLookup
from evidence.mentions import (
    TOPIC_PRONOUNS,
    VALUE_LABELS,
    is_disambiguated,
    is_topic_anaphor,
    names_sense,
    names_title,
    normalize_entity,
    title_key,
)

SAMPLE_POOL = 6  # the extra branches are sampled among the next-best SAMPLE_POOL neighbours
UNRELIABLE_LABELS = frozenset({"DATE", "NORP"}) | VALUE_LABELS  # years, numbers, nationalities
HUB_SHARE, HUB_MIN_PASSAGES = 0.01, 50
MAX_TARGET_CHARS = 1000  # longer "targets" are not entities; do not send them to the retriever


def _mentions(sentence: str, mention: str, key: str, title: str) -> bool:
    """The sentence writes `mention`, and `mention` names `key`: same key, a folded alias, or
    a form standing for the topic of the passage titled `title` (a pronoun or description
    such as "He" or "the film", or a variant of the title such as "Richard Kevin Betts" for
    "Richard K. Betts"; evidence/topic.py)."""
    m = normalize_entity(mention)
    if not m or f" {m} " not in f" {normalize_entity(sentence)} ":
        return False
    if m in TOPIC_PRONOUNS:  # before aliases: "he" would pass as an abbreviation of "helium"
        return bool(key) and key == title_key(title)
    if not key or m == key or same_entity(m, key):
        return True
    return key == title_key(title) and (is_topic_anaphor(mention) or names_title(mention, title))


def certify_path(path: Any) -> Optional[str]:
    """None when the path is certified, else why not: `no_hops`, `missing_evidence`,
    `repeated_entity` or `discontinuous` (a hop's sentence does not mention both ends, or
    a hop does not start where the previous one ended)."""
    hops = getattr(path, "hops", None)
    if not hops or not isinstance(hops, (list, tuple)):
        return "no_hops"
    for h in hops:
        if not (isinstance(h, Hop) and isinstance(h.sentence, str) and h.sentence.strip()
                and isinstance(h.passage_id, str) and h.passage_id):
            return "missing_evidence"
    keys = [hops[0].head_key or normalize_entity(hops[0].head)]
    keys += [h.tail_key or normalize_entity(h.tail) for h in hops]
    if any(not k for k in keys) or any(same_entity(a, b) for i, a in enumerate(keys) for b in keys[i + 1:]):
        return "repeated_entity"
    for i, h in enumerate(hops):
        head = h.head_key or normalize_entity(h.head)
        if head != keys[i]:
            return "discontinuous"
        if not (_mentions(h.sentence, h.head_mention or h.head, head, h.title)
                and _mentions(h.sentence, h.tail_mention or h.tail, keys[i + 1], h.title)):
            return "discontinuous"
    return None


def as_random(rng: Any) -> random.Random:
    """A `random.Random` from a seed, a Random (used as is), a numpy Generator or None (seed 0)."""
    if isinstance(rng, random.Random):
        return rng
    if isinstance(rng, int) and not isinstance(rng, bool):
        return random.Random(rng)
    if hasattr(rng, "integers"):  # numpy Generator
        return random.Random(int(rng.integers(0, 2**63 - 1)))
    return random.Random(0)  # no seed given: still deterministic


class _Expander:
    """Grows one target's local graph by batched retrieval; each entity is searched once."""

    def __init__(self, retriever: Any, index: EntityLookup, k: int, target: str) -> None:
        self.graph, self.retriever, self.index, self.k = nx.Graph(), retriever, index, k
        self.anchors, self.target = [target], target
        # A disambiguated common noun ("Chord (music)") may be written in lower case: `names_sense`.
        self.common = is_disambiguated(target) and lower_case_mentions(target, index)
        self.searched: set[str] = set()
        # Hubs ("United States" in 4% of passages) connect everything and make vague bridges.
        self.hub_df = max(HUB_MIN_PASSAGES, int(HUB_SHARE * len(index.corpus)))

    def expand(self, queries: list[str]) -> None:
        todo = [q for q in dict.fromkeys(queries) if q and q not in self.searched]
        self.searched.update(todo)
        if todo:
            results = self.retriever.search(todo, self.k)
            # One annotation batch per round: a lazy index runs spaCy on the passages first reached here.
            self.index.prepare([pid for hits in results for pid, _ in scored_passages(hits)])
            for hits in results:
                add_passages(self.graph, hits, self.index, self.anchors)
                self.anchors = []  # registered on the graph once; later calls reuse them

    def off_sense(self, key: str, neighbour: str) -> list[tuple[str, int]]:
        """(passage id, sentence index) of the edge's sentences whose mention of the target `key` does not
        name the target's sense (`names_sense`); [] for a target without a disambiguation."""
        if not is_disambiguated(self.target):
            return []
        out = []
        for sup in self.graph.edges[key, neighbour]["supports"]:
            ann = self.index.annotation(sup.passage_id)
            text = ann.text if ann is not None else ""
            if not names_sense(self.target, sup.surface(key), sup.sentence, sup.title, text, self.common):
                out.append((sup.passage_id, sup.sentence_index))
        return out

    def reliable(self, key: str) -> bool:
        return (node_label(self.graph, key) not in UNRELIABLE_LABELS
                and self.index.document_frequency(key) <= self.hub_df)


Chain = list[tuple[str, Optional[Support]]]  # (entity key, sentence linking it to the previous one)


def _candidates(exp: _Expander, chain: Chain) -> list[tuple[str, Support]]:
    """Reliable neighbours of the chain's last entity with an unused sentence, best first."""
    graph, last = exp.graph, chain[-1][0]
    used = [(s.passage_id, s.sentence_index) for _, s in chain if s is not None]
    ranked = sorted(graph.neighbors(last), key=lambda n: tuple(-x for x in edge_rank(graph, last, n)) + (n,))
    out = []
    for n in ranked:
        if any(same_entity(n, key) for key, _ in chain) or not exp.reliable(n):
            continue
        # The first hop out of the target: only sentences naming its sense ("Jaws (film)", not "jaws").
        off = exp.off_sense(last, n) if len(chain) == 1 else []
        sup = best_support(graph, last, n, exclude=used + off)
        if sup is not None:  # each hop needs its own sentence, or two hops say one thing
            out.append((n, sup))
    return out


def _grow(exp: _Expander, chains: list[Chain], branching: int, rand: random.Random,
          finished: list[Chain]) -> list[Chain]:
    """One hop for every live chain; chains with no reliable neighbour go to `finished`."""
    exp.expand([display_name(exp.graph, c[-1][0]) for c in chains if len(c) > 1])
    grown = []
    for chain in chains:
        cands = _candidates(exp, chain)
        if not cands:
            if len(chain) > 1:
                finished.append(chain)
            continue
        pool = cands[1:1 + SAMPLE_POOL]
        picks = cands[:1] + rand.sample(pool, min(max(branching - 1, 0), len(pool)))
        grown.extend(chain + [c] for c in picks)
    return grown


def _to_path(graph: nx.Graph, chain: Chain, target: str) -> EvidencePath:
    """Chain [(target, None), (e_k-1, s), …, (e0, s)] (built backwards) → path e0 → … → target."""
    hops = []
    for (tail, _), (head, sup) in zip(chain[::-1][1:], chain[::-1]):
        hops.append(Hop(head=display_name(graph, head), tail=display_name(graph, tail), sentence=sup.sentence,
                        passage_id=sup.passage_id, title=sup.title, score=support_score(graph, sup), cue=sup.cue,
                        head_key=head, tail_key=tail, head_mention=sup.surface(head),
                        tail_mention=sup.surface(tail)))
    return EvidencePath(target=target, hops=tuple(hops))


def build_evidence_paths(target: Any, retriever: Any, index: EntityLookup, max_hops: int = 3, branching: int = 2,
                         rng: Any = None, retrieve_k: int = 5) -> list[EvidencePath]:
    """Certified evidence paths ending at `target`: longest first, and among paths of one
    length the greedy branch (best-ranked neighbour at every hop) before sampled ones.

    `rng` is a seed, `random.Random` or numpy Generator (None: seed 0); the same seed,
    index and retriever give the same paths. Returns [] when nothing certifiable is found.
    """
    if not isinstance(target, str) or not normalize_entity(target) or len(target) > MAX_TARGET_CHARS:
        return []
    max_hops, branching, retrieve_k = int(max_hops), max(int(branching), 1), int(retrieve_k)
    if max_hops < 1 or retrieve_k < 1:
        return []
    rand = as_random(rng)
    exp = _Expander(retriever, index, retrieve_k, target)
    exp.expand([target.strip()])
    start = resolve_node(exp.graph, target)
    if start is None:
        return []
    chains: list[Chain] = [[(start, None)]]
    finished: list[Chain] = []
    for _ in range(max_hops):
        chains = _grow(exp, chains, branching, rand, finished)
        if not chains:
            break
    paths, seen = [], set()
    for chain in finished + chains:
        path = _to_path(exp.graph, chain, target)
        ident = tuple(key for key, _ in chain)
        if ident not in seen and certify_path(path) is None:
            seen.add(ident)
            paths.append(path)
    return sorted(paths, key=lambda p: -len(p))  # stable: growth order kept within a length


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def direct_path(target: str, passage: Any) -> EvidencePath:
    """`proposer.generation=direct`: the target and its answer-side passage, no certified chain.

    ZEST's comparison for path-guided generation: one uncertified hop from the passage's title
    to the target, carrying the passage's first sentence that names the target (its first
    sentence when none does), so the question prompt and the static checks see the same shape
    as a path's. Nothing here checks that the sentence links the two: that is the point.
    """
    sentences = [s for s in _SENTENCE_END.split(" ".join(str(passage.text).split())) if s]
    key = f" {normalize_entity(target)} "
    named = [s for s in sentences if key in f" {normalize_entity(s)} "]
    sentence = (named or sentences or [str(passage.title)])[0]
    hop = Hop(head=str(passage.title), tail=target, sentence=sentence, passage_id=str(passage.id),
              title=str(passage.title), score=0.0, cue="direct")
    return EvidencePath(target, (hop,))
