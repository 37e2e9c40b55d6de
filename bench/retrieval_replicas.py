"""Benchmark (not a test): search throughput of `retrieval.replicas` = 1, 2, ... Ray retrieval actors.

    .venv/bin/python -m bench.retrieval_replicas [--replicas 1 2] [--batch 64] [--k 50] [--rounds 5]
        [--corpus wiki_mini] [--backend bm25s]

Each replica count gets a fresh local Ray cluster with that many `RetrievalWorker` actors
(coevo/orchestrate/actors.py, the run's own actor body, config `corpus=<name> corpus.mmap=true
retrieval.backend=<backend>`), driven through `RemoteRetriever` as a run drives it: batches of
`--batch` dev questions (the solver's queries of one turn), `--k` hits each. The indexes are built
or loaded once before timing (a warm-up batch); then `--rounds` passes over the questions.

One JSON line: {"replicas": {N: {"qps", "seconds", "anon_mb" (each actor's private memory),
"pss_mb" (the actors' proportional share: mapped corpus and index pages split between them)}},
"speedup": {N: qps(N) / qps(1)}, "same_hits": whether every count returned the single actor's
hits, "queries", "cpus"}. On a machine with fewer cores than replicas + 1 the speedup is
bounded by the cores (the driver takes one too).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import ray

from bench.memory_trace import proc_kb
from coevo.core.config import compose, to_object
from coevo.core.inputs import load_labelled_questions
from coevo.orchestrate.actors import RemoteRetriever, RetrievalWorker
from coevo.orchestrate.hostpaths import for_workers
from evidence.corpus import shared_data_dir


def _kb(pid: int, file: str, key: str) -> int:
    """One /proc figure of a live actor."""
    found = proc_kb(pid, file, (key,))
    if not found or key not in found:
        raise RuntimeError(f"/proc/{pid}/{file} has no {key}: the retrieval actor died during the benchmark")
    return found[key]


def measure(replicas: int, cfg: Any, batches: list[list[str]], k: int, rounds: int) -> tuple[dict, list]:
    """qps and memory of `replicas` actors over `rounds` passes of `batches`; also the hits of one pass."""
    # address="local": a cluster of its own, never one already running on the machine (a run's or a test's).
    ray.init(address="local", num_cpus=replicas + 1, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    try:
        actors = [ray.remote(RetrievalWorker).options(num_cpus=1).remote(cfg) for _ in range(replicas)]
        pids = [ray.get(a.ready.remote())["pid"] for a in actors]
        retriever = RemoteRetriever(actors)
        retriever.search(batches[0], k)  # warm-up: every replica has its index loaded
        hits = [[h.passage_id for h in row] for b in batches for row in retriever.search(b, k)]
        t0 = time.perf_counter()
        for _ in range(rounds):
            for batch in batches:
                retriever.search(batch, k)
        seconds = time.perf_counter() - t0
        queries = rounds * sum(len(b) for b in batches)
        return {"qps": round(queries / seconds, 1), "seconds": round(seconds, 2),
                "anon_mb": [round(_kb(p, "status", "RssAnon") / 1024, 1) for p in pids],
                "pss_mb": round(sum(_kb(p, "smaps_rollup", "Pss") for p in pids) / 1024, 1)}, hits
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.retrieval_replicas")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=64, help="queries per search call (one solver turn)")
    ap.add_argument("--k", type=int, default=50, help="hits per query (the ranker's candidates)")
    ap.add_argument("--rounds", type=int, default=5, help="timed passes over the dev questions")
    ap.add_argument("--corpus", default="wiki_mini")
    ap.add_argument("--backend", default="bm25s")
    args = ap.parse_args()
    cfg = for_workers(to_object(compose([f"corpus={args.corpus}", "corpus.mmap=true",
                                         f"retrieval.backend={args.backend}"])))
    questions, _ = load_labelled_questions(shared_data_dir() / args.corpus / "questions_dev.jsonl")
    queries = [q.question for q in questions]
    batches = [queries[i:i + args.batch] for i in range(0, len(queries), args.batch)]
    report: dict[str, Any] = {"replicas": {}, "speedup": {}, "same_hits": True, "queries": len(queries),
                              "batch": args.batch, "k": args.k, "rounds": args.rounds, "cpus": os.cpu_count(),
                              "corpus": args.corpus, "backend": args.backend}
    first = None
    for n in args.replicas:
        report["replicas"][str(n)], hits = measure(n, cfg, batches, args.k, args.rounds)
        first = hits if first is None else first
        report["same_hits"] &= hits == first
        report["speedup"][str(n)] = round(report["replicas"][str(n)]["qps"] / report["replicas"][str(args.replicas[0])]
                                          ["qps"], 2)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
