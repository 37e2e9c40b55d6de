"""Benchmark (not a test): lazy against eager annotation on the whole of wiki_mini, one JSON line.

    .venv/bin/python -m bench.lazy_paths [--targets 200] [--work runs/lazy-paths]

Builds (or loads from `--work`/cache) the eager entity index of wiki_mini's 14,308 passages, then
builds evidence paths for the answers of the dev questions with both indexes: the lazy one takes
its statistics from a sample as large as the corpus (so they are exact) and annotates passages only
as paths reach them, into a store it starts empty. Prints how many targets got identical paths,
how many paths there were, how many passages the lazy index annotated, and both indexes' times.
tests/evidence/test_lazy_entities.py checks the same on a 200-passage part of wiki_mini.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.lazy_paths", description=__doc__.split("\n")[0])
    ap.add_argument("--targets", type=int, default=200, help="dev answers used as path targets")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "lazy-paths", help="caches (reused)")
    args = ap.parse_args(argv)
    os.environ["COEVO_CACHE"] = str(args.work / "cache")

    from coevo.core.inputs import load_labelled_questions
    from evidence.corpus import load_corpus, shared_data_dir
    from evidence.entities import build_entity_index
    from evidence.lazy_entities import lazy_store_path, open_lazy_index
    from evidence.paths import build_evidence_paths
    from evidence.retrieval import build_retriever

    corpus = load_corpus("wiki_mini")
    questions, _ = load_labelled_questions(shared_data_dir() / "wiki_mini" / "questions_dev.jsonl")
    targets = list(dict.fromkeys(q.answers[0] for q in questions if q.answers))[:args.targets]
    t0 = time.perf_counter()
    eager = build_entity_index(corpus)
    eager_ready = time.perf_counter() - t0
    retriever = build_retriever(corpus, "bm25s")
    shutil.rmtree(lazy_store_path(corpus), ignore_errors=True)  # every passage annotated by this run's paths
    t0 = time.perf_counter()
    lazy = open_lazy_index(corpus, stats_sample=len(corpus))
    lazy_ready = time.perf_counter() - t0
    timings, same, n_paths = {"eager": 0.0, "lazy": 0.0}, 0, 0
    for i, target in enumerate(targets):
        got = {}
        for name, index in (("eager", eager), ("lazy", lazy)):
            t = time.perf_counter()
            got[name] = build_evidence_paths(target, retriever, index, rng=i)
            timings[name] += time.perf_counter() - t
        same += got["eager"] == got["lazy"]
        n_paths += len(got["eager"])
    print(json.dumps({"passages": len(corpus), "targets": len(targets), "identical": same, "paths": n_paths,
                      "lazy_annotated": lazy.annotated, "eager_ready_s": round(eager_ready, 2),
                      "eager_from_cache": eager.from_cache, "lazy_ready_s": round(lazy_ready, 2),
                      "path_s": {k: round(v, 2) for k, v in timings.items()}}), flush=True)


if __name__ == "__main__":
    main()
