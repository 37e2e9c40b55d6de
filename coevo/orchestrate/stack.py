"""Resolve and load the configured stack (models, corpus, index) and summarize it.

`dry_run=true` (coevo.run, coevo.solve, coevo.eval) prints this summary of the roles the
command uses and exits, writing nothing but the shared model and index caches.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from coevo.core.config import CoevoConfig
from coevo.train.models import describe_model, timed_load
from evidence.corpus_store import open_corpus
from evidence.retrieval import build_retriever


def model_roles(cfg: CoevoConfig, proposer: bool = True, ranker: bool = True) -> tuple[str, ...]:
    """The roles whose models a command loads: the ranker's only in modes trainable and frozen."""
    ranked = ranker and cfg.ranker.has_model
    return ("proposer",) * proposer + ("solver",) + ("ranker",) * ranked


def load_stack_summary(cfg: CoevoConfig, roles: Sequence[str] = ("proposer", "solver", "ranker")) -> dict[str, Any]:
    """Load each role's model and tokenizer and build/load the index; return what was loaded."""
    summary: dict[str, Any] = {"policies": {}}
    for role in roles:
        pol = getattr(cfg, role)
        model, tok, secs = timed_load(pol.model, pol.dtype, pol.checkpoint)
        summary["policies"][role] = {
            "preset": pol.preset, "model": pol.model, **describe_model(model), "vocab": len(tok),
            "engine": pol.engine, "frozen": pol.frozen, "load_s": round(secs, 2),
        }
        del model
    t0 = time.perf_counter()
    corpus = open_corpus(cfg.corpus)
    summary["corpus"] = {"name": corpus.name, "passages": len(corpus), "hash": corpus.content_hash[:12],
                         "load_s": round(time.perf_counter() - t0, 2)}
    retriever = build_retriever(corpus, cfg.retrieval)
    summary["retrieval"] = {"backend": retriever.backend, "from_cache": retriever.from_cache,
                            "build_s": round(retriever.build_s, 2),
                            "N": cfg.ranker.n_candidates, "K": cfg.ranker.top_k, "ranker_mode": cfg.ranker.mode}
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """Human-readable multi-line rendering of `load_stack_summary`."""
    lines = ["coevo stack"]
    for role, p in summary["policies"].items():
        lines.append(f"  {role:<9} {p['preset']:<16} {p['arch']} {p['params_m']}M params {p['dtype']} "
                     f"engine={p['engine']}{' frozen' if p['frozen'] else ''} (loaded in {p['load_s']}s)")
    c, r = summary["corpus"], summary["retrieval"]
    lines.append(f"  corpus    {c['name']}: {c['passages']} passages (hash {c['hash']}, {c['load_s']}s)")
    src = "loaded from cache" if r["from_cache"] else "built"
    lines.append(f"  retrieval {r['backend']} index {src} in {r['build_s']}s; N={r['N']} K={r['K']} "
                 f"ranker={r['ranker_mode']}")
    return "\n".join(lines)
