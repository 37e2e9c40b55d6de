"""dense_faiss on wiki_mini (not a test): prints one JSON line.

Gold-passage recall@10 on the dev questions of the numpy dense path (dense_minilm) and of
dense_faiss over a Flat index written from the same vectors and loaded through
`retrieval.faiss.index_path` with the corpus file unchanged (ids = line order), the share of
questions whose top-10 ids agree in order, and recall / build seconds of HNSW and IVF-PQ
indexes built from those vectors. The MiniLM encoding of wiki_mini is the cost (≈ 30 min on 2
cores, once; then from the cache).
Usage: .venv/bin/python -m bench.dense_faiss [--cache DIR] [--limit N]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import faiss
import numpy as np

from coevo.core.config import FaissConfig, RetrievalConfig
from coevo.core.inputs import load_labelled_questions
from evidence.corpus import load_corpus, shared_data_dir
from evidence.dense_faiss import build_index, encode, factory_string
from evidence.retrieval import build_retriever


def recall_at_10(rows: list[list[str]], gold: list[list[str]]) -> float:
    return round(float(np.mean([len(set(g) & set(r[:10])) / len(g) for r, g in zip(rows, gold)])), 4)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.dense_faiss")
    ap.add_argument("--cache", default=None, help="index cache dir (default: $COEVO_CACHE/indexes)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N dev questions")
    args = ap.parse_args()
    data = shared_data_dir() / "wiki_mini"
    corpus = load_corpus("wiki_mini")
    questions, _ = load_labelled_questions(data / "questions_dev.jsonl")
    questions = [q for q in questions if q.gold_ids][:args.limit]
    texts, gold = [q.question for q in questions], [list(q.gold_ids) for q in questions]
    numpy_r = build_retriever(corpus, "dense_minilm", cache_dir=args.cache)
    with tempfile.TemporaryDirectory() as tmp:
        flat = faiss.IndexFlatIP(numpy_r.embeddings.shape[1])
        flat.add(numpy_r.embeddings)
        faiss.write_index(flat, f"{tmp}/flat.index")
        prebuilt = RetrievalConfig(backend="dense_faiss", faiss=FaissConfig(index_path=f"{tmp}/flat.index"))
        faiss_r = build_retriever(load_corpus(data / "corpus.jsonl.gz"), prebuilt)
        a = [[h.passage_id for h in row] for row in faiss_r.search(texts, 10)]
    b = [[h.passage_id for h in row] for row in numpy_r.search(texts, 10)]
    report = {"n_questions": len(texts), "n_passages": len(corpus), "recall@10": {
        "dense_minilm": recall_at_10(b, gold), "dense_faiss_flat": recall_at_10(a, gold)},
        "same_ids_in_order": round(float(np.mean([x == y for x, y in zip(a, b)])), 4), "build_s": {}}
    q = encode(faiss_r.encoder, texts, 64, True)
    for cfg in (FaissConfig(index_type="hnsw"), FaissConfig(index_type="ivf_pq")):
        factory = factory_string(cfg, len(corpus), q.shape[1], corpus.name)
        t0 = time.perf_counter()
        index = build_index(numpy_r.embeddings, factory, cfg)
        report["build_s"][factory] = round(time.perf_counter() - t0, 1)
        if cfg.index_type == "hnsw":
            index.hnsw.efSearch = cfg.hnsw_ef_search
        else:
            faiss.extract_index_ivf(index).nprobe = cfg.ivf_nprobe
        rows = index.search(q, 10)[1]
        report["recall@10"][factory] = recall_at_10([[corpus.passages[j].id for j in r if j >= 0] for r in rows], gold)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
