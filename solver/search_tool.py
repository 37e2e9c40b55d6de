"""The solver's search tool (docs/method.md §4.3): first-stage retriever → N candidates → ranker → K documents.

`SearchTool.search` answers a whole turn's searches at once: one retriever call, then one
`Ranker.rank` call (one ranker `generate` call for the generating modes). Ranker output is
untrusted: on a parse failure the ranker falls back to the first-stage top-K (solver/ranker.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from coevo.core.role_config import RankerConfig
from solver.ranker import Ranker, RankerCall, SearchRequest
from solver.reward import PassageLike


@dataclass
class ToolResult:
    """What one search returns: the documents the solver reads and the ranker call record."""

    passages: list[PassageLike]
    call: RankerCall


class SearchTool:
    """The solver's search tool: first-stage top-N, then the ranker picks and orders K."""

    def __init__(self, retriever: Any, ranker: Ranker, cfg: RankerConfig) -> None:
        self.retriever = retriever
        self.ranker = ranker
        self.cfg = cfg

    def search(self, requests: Sequence[SearchRequest | tuple]) -> list[ToolResult]:
        """Answer a batch of searches: one retriever call, one ranker generate call."""
        reqs = [r if isinstance(r, SearchRequest) else SearchRequest(*r) for r in requests]
        if not reqs:
            return []
        hits = self.retriever.search([r.sub_query for r in reqs], self.cfg.n_candidates)
        corpus = self.retriever.corpus
        candidates = [[corpus[h.passage_id] for h in row[: self.cfg.n_candidates]] for row in hits]
        calls = self.ranker.rank(reqs, candidates)
        results = []
        for cands, call in zip(candidates, calls):
            by_id = {p.id: p for p in cands}
            results.append(ToolResult(passages=[by_id[pid] for pid in call.chosen_ids], call=call))
        return results


def format_documents(passages: Sequence[PassageLike]) -> str:
    """Documents as the solver reads them: `Doc 1 (Title: …) text`, one per line."""
    if not passages:
        return "No results."
    return "\n".join(f"Doc {i} (Title: {p.title}) {' '.join(p.text.split())}" for i, p in enumerate(passages, 1))
