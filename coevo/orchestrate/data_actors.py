"""The retrieval and evidence actors' bodies: corpus, index, spaCy; no policy, no torch import of their own.

Ray starts each actor by importing the module its class lives in, so these live apart from the
policy actors (coevo/orchestrate/policy_actors.py, which import torch, transformers and the
engines: measured 8.5 s of import CPU and 356 MB, against 1.3 s and 99 MB here). A retrieval actor over bm25s then never
loads torch at all; a dense retriever or spaCy (through thinc) loads it when it needs it.
coevo/orchestrate/actors.py starts them and wraps them in driver-side proxies.
"""
from __future__ import annotations

import random
from typing import Any

from coevo.core.config import CoevoConfig
from coevo.core.types import EvidencePath, Verdict
from coevo.orchestrate.hostpaths import check_host_paths, needs
from coevo.orchestrate.remote import limit_threads, where
from evidence.corpus_store import open_corpus
from evidence.pipeline import EvidencePipeline
from evidence.retrieval import build_retriever


class RetrievalWorker:
    """Actor body holding the corpus and the first-stage index."""

    def __init__(self, cfg: CoevoConfig) -> None:
        check_host_paths("retrieval", needs(cfg, "retrieval"))  # it only runs as an actor
        limit_threads(1)
        self.corpus = open_corpus(cfg.corpus)
        self.retriever = build_retriever(self.corpus, cfg.retrieval)

    def ready(self) -> dict:
        return where()

    def info(self) -> dict:
        return {"corpus": self.corpus.name, "passages": len(self.corpus), "hash": self.corpus.content_hash,
                "backend": self.retriever.backend, "build_s": self.retriever.build_s,
                "from_cache": self.retriever.from_cache}

    def search_with_passages(self, queries: list[str], k: int) -> tuple[list[list[Any]], dict[str, Any]]:
        """Hits per query plus the passages they point to (one round trip per batch)."""
        hits = self.retriever.search(queries, k)
        passages = {h.passage_id: self.corpus[h.passage_id] for row in hits for h in row}
        return hits, passages


class EvidenceWorker:
    """Actor body holding spaCy, the entity index and its own retriever (loaded from cache)."""

    def __init__(self, cfg: CoevoConfig, own_process: bool = True) -> None:
        if own_process:  # in the driver (`ray.local=true`) the policies need every thread
            check_host_paths("evidence", needs(cfg, "evidence"))
            limit_threads(1)
        corpus = open_corpus(cfg.corpus)
        retriever = build_retriever(corpus, cfg.retrieval)
        self.pipeline = EvidencePipeline.from_config(corpus, retriever, cfg.evidence,
                                                     max_target_chars=cfg.proposer.max_target_chars,
                                                     first_search_k=cfg.ranker.n_candidates)

    def ready(self) -> dict:
        return where()

    # Verdicts and paths cross the Ray boundary as the dataclasses themselves (Ray pickles
    # them), so the driver never reads them back by key.
    def validate_targets(self, targets: list[str], references: list[str]) -> list[Verdict]:
        return self.pipeline.validate_targets(targets, references)

    def build_paths(self, targets: list[str], seed: int) -> list[list[EvidencePath]]:
        return self.pipeline.build_paths(targets, random.Random(seed))

    def direct_paths(self, targets: list[str], support_ids: list[list[str]]) -> list[list[EvidencePath]]:
        return self.pipeline.direct_paths(targets, support_ids)

    def validate_questions(self, questions: list[str], targets: list[str],
                           paths: list[EvidencePath]) -> list[Verdict]:
        return self.pipeline.validate_questions(questions, targets, paths)
