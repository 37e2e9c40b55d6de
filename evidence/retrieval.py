"""First-stage retrieval: one batched interface over bm25s, rank-bm25, dense MiniLM, FAISS and HTTP.

`build_retriever(corpus, backend_or_config)` is the one place a backend is chosen; it returns
an object with `search(queries, k) -> list[list[Hit]]` (best first; `Retriever` in
evidence/hits.py). Indexes are cached on disk under `$COEVO_CACHE/indexes/<backend>-…-<corpus
hash>` and reused on the next build; dense_minilm's index is the passage-embeddings entry
(`embeddings-…-<corpus hash>`) that dense_faiss builds its indexes from, so the two encode a
corpus once between them. `dense_faiss` and that store live in evidence/dense_faiss.py, the
client of a running retrieval server (`http`) in evidence/http_retrieval.py.
"""
from __future__ import annotations

import logging
import math
import re
import time
from pathlib import Path
from typing import Optional

import numpy as np

from coevo.core.cache import cache_entry
from coevo.core.config import FaissConfig, RetrievalConfig
from evidence.bm25_shards import build_sharded_bm25s
from evidence.corpus import Corpus
from evidence.dense_faiss import (
    DenseFaissRetriever,
    embeddings_path,
    encode,
    encoder_spec,
    index_file,
    load_encoder,
    passage_embeddings,
    probe_spec,
)
from evidence.hits import Hit, Retriever, index_root, live_queries, minilm_path, top_hits
from evidence.http_retrieval import HttpRetriever
from evidence.mentions import stopwords

# Hit & co. re-exported
__all__ = ["BACKENDS", "Hit", "Retriever", "build_retriever", "index_cache_path", "minilm_path", "tokenize"]

BACKENDS = ("bm25s", "rank_bm25", "dense_minilm", "dense_faiss", "http")
TOKENIZER_VERSION = "re-word-lower-stop-v1"  # part of the cache key: change it when tokenize changes

logging.getLogger("bm25s").setLevel(logging.WARNING)  # its DEBUG lines flood Hydra's job log

_WORD = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens minus English stopwords; shared by both BM25 backends."""
    stop = stopwords()
    return [t for t in _WORD.findall(text.lower()) if t not in stop]


def _query_tokens(query: str) -> list[str]:
    # Duplicates are dropped so both engines score a query term once.
    return list(dict.fromkeys(tokenize(query))) if isinstance(query, str) else []


def _index_dir(corpus: Corpus, backend: str, cache_dir: Optional[str]) -> Path:
    return index_root(cache_dir) / f"{backend}-{TOKENIZER_VERSION}-{corpus.content_hash[:16]}"


class BM25sRetriever:
    """bm25s (Lucene BM25, k1=1.5, b=0.75) over `tokenize` tokens."""

    backend = "bm25s"

    def __init__(self, corpus: Corpus, cache_dir: Optional[str] = None) -> None:
        import bm25s

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on import
        self.corpus = corpus
        t0 = time.perf_counter()
        path = self.path = _index_dir(corpus, self.backend, cache_dir)

        def build(tmp: Path) -> None:
            # In shards merged on disk (evidence/bm25_shards.py): bm25s's own `index` holds the whole
            # tokenized corpus in memory (7 GB at 1M passages); a killed build resumes from its shards.
            build_sharded_bm25s(corpus, tmp, path.with_name(path.name + ".shards"), tokenize,
                                what=f"bm25s index of corpus {corpus.name!r}")

        self.from_cache = not cache_entry(path, build, f"the bm25s index of corpus {corpus.name!r}")
        # Memory-mapped: the index's arrays stay in the page cache, shared by every process on the machine
        # that maps the same files (bm25s's own figure: ~4.4 GB in RAM for 2.7M passages without it).
        self.model = bm25s.BM25.load(str(path), mmap=True, show_progress=False)
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
        self.path = None

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out = []
        for q in queries:
            toks = _query_tokens(q)
            if not toks or k <= 0:
                out.append([])
                continue
            # rank-bm25 multiplies tf by (k1 + 1); bm25s does not. Dividing makes scores equal.
            scores = np.asarray(self.model.get_scores(toks)) / (self.model.k1 + 1)
            out.append(top_hits(self.corpus, scores, k))
        return out


def minilm_config(batch_size: int = 64) -> FaissConfig:
    """dense_minilm's encoder settings: dense_faiss's defaults (bundled MiniLM, unit vectors, no prefix).

    The same embeddings key as a default dense_faiss, so either backend reads the vectors the
    other encoded. On the CPU, as dense_minilm always ran (a GPU, if any, is the run's).
    """
    return FaissConfig(device="cpu", encode_batch_size=batch_size)


class DenseMiniLMRetriever:
    """Cosine similarity by numpy matmul over all-MiniLM-L6-v2 passage embeddings (the shared store)."""

    backend = "dense_minilm"

    def __init__(self, corpus: Corpus, cache_dir: Optional[str] = None, batch_size: int = 64) -> None:
        self.corpus = corpus
        self.batch_size = batch_size
        t0 = time.perf_counter()
        cfg = minilm_config(batch_size)
        self.encoder = load_encoder(cfg)
        spec = encoder_spec(self.encoder, cfg)
        self.path = embeddings_path(corpus, spec, cache_dir)
        self.embeddings, built = passage_embeddings(corpus, self.encoder, spec, batch_size, cache_dir)
        self.from_cache = not built
        self.build_s = time.perf_counter() - t0

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        live = live_queries(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        if not live or k <= 0:
            return out
        q_emb = encode(self.encoder, [queries[i] for i in live], self.batch_size, True)
        scores = q_emb @ self.embeddings.T
        for row, i in enumerate(live):
            # Cosine can be <= 0 for a real neighbour, so shift to keep every hit (ranking unchanged).
            out[i] = top_hits(self.corpus, scores[row] + 2.0, k)
            out[i] = [Hit(h.passage_id, h.score - 2.0) for h in out[i]]
        return out


def build_retriever(corpus: Corpus, backend: str | RetrievalConfig = "bm25s",
                    cache_dir: Optional[str] = None) -> Retriever:
    """Build (or load from cache) a retriever over `corpus`: the one place a backend is chosen.

    `backend` is the config block `retrieval` (every backend option) or a backend name (its
    options at their defaults); `cache_dir`, when given, overrides `retrieval.cache_dir`.
    """
    cfg = RetrievalConfig(backend=backend) if isinstance(backend, str) else backend
    cache_dir = cache_dir if cache_dir is not None else cfg.cache_dir
    if not len(corpus):
        raise ValueError(f"corpus {corpus.name!r} ({corpus.source or 'built in code'}) holds no passages to index")
    if cfg.backend == "bm25s":
        return BM25sRetriever(corpus, cache_dir)
    if cfg.backend == "rank_bm25":
        return RankBM25Retriever(corpus, cache_dir)
    if cfg.backend == "dense_minilm":
        return DenseMiniLMRetriever(corpus, cache_dir)
    if cfg.backend == "dense_faiss":
        return DenseFaissRetriever(corpus, cfg, cache_dir)
    if cfg.backend == "http":
        return HttpRetriever(corpus, cfg)
    raise ValueError(f"retrieval backend {cfg.backend!r} is not valid; expected one of {list(BACKENDS)}")


def index_cache_path(corpus: Corpus, cfg: RetrievalConfig, cache_dir: Optional[str] = None) -> Optional[Path]:
    """Where `build_retriever(corpus, cfg)` reads its index, without building it (it may not exist).

    None for the backends that keep nothing on disk: `rank_bm25` (built in memory, the slow
    reference) and `http` (a server holds the index).
    """
    cache_dir = cache_dir if cache_dir is not None else cfg.cache_dir
    if cfg.backend == "bm25s":
        return _index_dir(corpus, "bm25s", cache_dir)
    if cfg.backend == "dense_minilm":  # its index is the shared embeddings entry (the key loads the encoder)
        return embeddings_path(corpus, probe_spec(minilm_config()), cache_dir)
    if cfg.backend == "dense_faiss":
        return index_file(corpus, cfg, cache_dir)
    return None
