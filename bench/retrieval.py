"""Retrieval benchmark on wiki_mini (not a test): prints one JSON line.

qps of bm25s vs rank-bm25 on the same dev questions, index build seconds, and gold-passage
recall@{1,5,10,50} for bm25s, rank-bm25 and dense MiniLM.
Usage: .venv/bin/python -m bench.retrieval [--limit N] [--cache DIR]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

from coevo.core.inputs import LabelledQuestion, load_labelled_questions
from coevo.core.stats import mean
from evidence.corpus import load_corpus, shared_data_dir
from evidence.retrieval import Hit, Retriever, build_retriever

KS = (1, 5, 10, 50)


def load_dev_questions(limit: int | None) -> list[LabelledQuestion]:
    questions, _ = load_labelled_questions(shared_data_dir() / "wiki_mini" / "questions_dev.jsonl")
    return questions[:limit] if limit else questions


def recall_at_k(results: list[list[Hit]], questions: list[LabelledQuestion],
                any_gold: bool = False) -> dict[str, float | None]:
    """Share of a question's gold passages in the top k, averaged over questions.

    With `any_gold`, the share of questions with at least one gold passage in the top k
    (PopQA lists the answer's own page as a second gold passage, which the question's
    words rarely retrieve, so the two figures differ a lot there).
    """
    out = {}
    for k in KS:
        per_q = []
        for hits, g in zip(results, questions):
            if g.gold_ids:
                found = len(set(g.gold_ids) & {h.passage_id for h in hits[:k]})
                per_q.append(float(found > 0) if any_gold else found / len(g.gold_ids))
        m = mean(per_q)
        out[str(k)] = None if m is None else round(m, 4)
    return out


def timed_search(retriever: Retriever, queries: list[str], k: int) -> tuple[list, float]:
    t0 = time.perf_counter()
    res = retriever.search(queries, k)
    return res, len(queries) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.retrieval")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N dev questions")
    ap.add_argument("--cache", default=None, help="index cache dir (default: $COEVO_CACHE/indexes)")
    ap.add_argument("--fresh", action="store_true", help="build every index from scratch in a temp dir")
    args = ap.parse_args()
    corpus = load_corpus("wiki_mini")
    questions = load_dev_questions(args.limit)
    queries = [q.question for q in questions]
    cache = tempfile.mkdtemp(prefix="coevo-bench-") if args.fresh else args.cache
    report = {"qps": {}, "build_s": {}, "recall": {}, "hit": {}, "from_cache": {},
              "n_queries": len(queries), "n_passages": len(corpus)}
    for backend in ("bm25s", "rank_bm25", "dense_minilm"):
        r = build_retriever(corpus, backend, cache_dir=cache)
        report["build_s"][backend] = round(r.build_s, 2)
        report["from_cache"][backend] = r.from_cache
        res, qps = timed_search(r, queries, max(KS))
        report["recall"][backend] = recall_at_k(res, questions)
        report["hit"][backend] = recall_at_k(res, questions, any_gold=True)
        if backend != "dense_minilm":
            report["qps"][backend] = round(qps, 1)
        else:
            report["qps_dense_minilm"] = round(qps, 1)
    report["qps_ratio_bm25s_over_rank_bm25"] = round(report["qps"]["bm25s"] / report["qps"]["rank_bm25"], 1)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
