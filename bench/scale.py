"""Benchmark (not a test): retrieval at 100k-3M passages on this machine, one JSON line per size.

    .venv/bin/python -m bench.scale [--sizes 100000,1000000,3000000] [--kinds bm25s,flat,hnsw]
        [--work runs/scale] [--queries 256] [--annotation lazy] [--stats-sample 20000] [--targets 21]
        [--paths-max 0] [--seed 0]

Corpora are synthetic, built by recombining the sentences of wiki_mini's real passages: each
passage takes 2-6 sentences drawn at random and the title of a random real passage made unique
with its number ("Paris (#123456)"); lengths follow the real passages'. They are written once to
`<work>/corpus-<n>.jsonl` and reused. Every measurement runs in a fresh child process (this
script with `--child`), so `peak_rss_gb` is that process's own peak (`wait4`'s ru_maxrss, mapped
files included; `peak_anon_gb`, sampled, is its anonymous memory alone) and
start-up times are cold-process times (the page cache stays warm, as on a machine that just
built its indexes). Caches go to `<work>/cache` ($COEVO_CACHE of the children), never ~/.cache.

Per size and index kind:
- `bm25s`: `build_s` packs the corpus store (corpus.mmap) and builds the bm25s index as
  `evidence.build_index` does; `run_start_s` is a retrieval actor's start with both prebuilt
  (`open_corpus` + `build_retriever`, mmap loads) and `start_rss_gb` its resident memory then;
  `qps` (batches of 64) and `latency_ms` p50/p99 (one query at a time) over the dev questions.
- `flat`, `hnsw` (FAISS, the `dense_faiss` backend's index types): the index is built from random
  unit vectors of the bundled encoder's size, so qps and latency are those of the search
  itself (exact for Flat, whose cost does not depend on the vectors; for HNSW random vectors
  are the hard case and recall is not measured). The encoder's cost, which dominates a real
  dense build on CPU, is measured separately (`encode_passages_per_s` on 256 synthetic
  passages) and `dense_build_s_estimate` = n / that rate + the index build.
- `path_ms`: evidence paths for `--targets` random real titles, with lazy annotation
  (`evidence.annotation=lazy`): `lazy.build` is what `evidence.build_index` adds (the entity index
  of a `--stats-sample` sample and the title table); `first_touch_p50` is a process whose shared
  annotation store starts empty (each path annotates the passages it reaches), `store_warm_p50`
  a second process on the same targets reading that store, `memo_warm_p50` the first process's
  second pass. Eager annotation (spaCy over every passage first) is measured only up to
  `--paths-max` passages (`--annotation lazy,eager`).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent

SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")  # a sentence ends before a capital after . ! ?
GB = 1024 ** 3
KINDS = ("bm25s", "flat", "hnsw")


# ---- synthetic corpora ---------------------------------------------------------------------------

def real_passages(data: Path) -> list[dict]:
    with gzip.open(data / "wiki_mini" / "corpus.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def synthetic_corpus(n: int, data: Path, out: Path, seed: int) -> Path:
    """`out`, n recombined passages (written atomically once; an existing file is reused)."""
    if out.exists():
        return out
    passages = real_passages(data)
    sentences = [s for p in passages for s in SENTENCE.split(p["text"]) if len(s) > 20]
    lengths = [max(2, min(6, len(SENTENCE.split(p["text"])))) for p in passages]
    rng = random.Random(seed)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w") as f:
        for i in range(n):
            title = f"{rng.choice(passages)['title']} (#{i})"
            text = " ".join(rng.choice(sentences) for _ in range(rng.choice(lengths)))
            f.write(json.dumps({"id": f"s{i}", "title": title, "text": text}) + "\n")
    os.replace(tmp, out)
    return out


# ---- children: each prints one JSON object on its last stdout line --------------------------------

def _cfg(corpus: Path, overrides: list[str]) -> Any:
    from coevo.core.config import compose, to_object

    return to_object(compose(["corpus=jsonl", f"corpus.path={corpus}", *overrides]))


def _rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024 ** 2, 3)
    return float("nan")


def _percentiles(values: list[float]) -> dict[str, float]:
    import numpy as np

    return {"p50": round(float(np.percentile(values, 50)), 3), "p99": round(float(np.percentile(values, 99)), 3)}


def _queries(data: Path, limit: int) -> list[str]:
    from coevo.core.inputs import load_labelled_questions

    return [q.question for q in load_labelled_questions(data / "wiki_mini" / "questions_dev.jsonl")[0]][:limit]


def _search_speed(search: Any, queries: list[Any], batch: int = 64, k: int = 50) -> dict[str, Any]:
    search(queries[:batch], k)  # warm-up: first touches of the mapped pages
    t0 = time.perf_counter()
    for start in range(0, len(queries), batch):
        search(queries[start:start + batch], k)
    qps = len(queries) / (time.perf_counter() - t0)
    times = []
    for q in queries:
        t = time.perf_counter()
        search([q], k)
        times.append((time.perf_counter() - t) * 1e3)
    return {"qps": round(qps, 1), "latency_ms": _percentiles(times)}


def child_bm25s(corpus: Path, phase: str, data: Path, queries: int) -> dict[str, Any]:
    from evidence.build_index import build_retrieval, disk_bytes
    from evidence.corpus_store import open_corpus
    from evidence.retrieval import build_retriever

    cfg = _cfg(corpus, ["retrieval.backend=bm25s"])
    t0 = time.perf_counter()
    store = open_corpus(cfg.corpus)
    if phase == "build":
        entry = build_retrieval(store, cfg)
        return {"build_s": round(time.perf_counter() - t0, 2), "index_bytes": entry["bytes"],
                "store_bytes": disk_bytes(getattr(store, "entry", None)), "cached": entry["cached"]}
    retriever = build_retriever(store, cfg.retrieval)
    out = {"run_start_s": round(time.perf_counter() - t0, 3), "start_rss_gb": _rss_gb(),
           "from_cache": retriever.from_cache}
    return {**out, **_search_speed(retriever.search, _queries(data, queries))}


def child_faiss(n: int, kind: str, queries: int, seed: int) -> dict[str, Any]:
    import faiss
    import numpy as np

    from coevo.core.config import FaissConfig
    from evidence.dense_faiss import build_index, factory_string

    dim = 384  # the bundled MiniLM's size (e5-base: 768, twice the bytes and flops)
    cfg = FaissConfig(index_type=kind)
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, dim), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    t0 = time.perf_counter()
    index = build_index(vectors, factory_string(cfg, n, dim, "synthetic"), cfg, seed)
    build_s = time.perf_counter() - t0
    del vectors
    path = Path(os.environ["COEVO_CACHE"]) / f"faiss-{kind}-{n}.index"
    faiss.write_index(index, str(path))
    q = rng.standard_normal((queries, dim), dtype=np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    speed = _search_speed(lambda rows, k: index.search(np.stack(rows), k), list(q))
    size = path.stat().st_size
    path.unlink()
    return {"build_s": round(build_s, 2), "index_bytes": size, "vectors": "random unit (search speed only)",
            **speed}


def child_encode(corpus: Path, count: int = 256) -> dict[str, Any]:
    from coevo.core.config import FaissConfig
    from evidence.dense_faiss import encode, load_encoder, passage_text

    with open(corpus) as f:
        rows = [json.loads(line) for _, line in zip(range(count), f)]
    cfg = FaissConfig()
    encoder = load_encoder(cfg)
    texts = [passage_text(r["title"], r["text"]) for r in rows]
    encode(encoder, texts[:16], 16, True)  # warm-up
    t0 = time.perf_counter()
    encode(encoder, texts, 32, True)
    return {"encode_passages_per_s": round(count / (time.perf_counter() - t0), 1)}


def _evidence_cfg(corpus: Path, annotation: str, stats_sample: int) -> Any:
    return _cfg(corpus, ["retrieval.backend=bm25s", f"evidence.annotation={annotation}",
                         f"evidence.stats_sample={stats_sample}"])


def _targets(store: Any, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)  # real titles without their "(#i)": entities retrieval finds several passages about
    return [store.passages[i].title.rsplit(" (#", 1)[0] for i in rng.sample(range(len(store)), count)]


def child_lazy_build(corpus: Path, stats_sample: int) -> dict[str, Any]:
    """What `evidence.build_index evidence.annotation=lazy` adds to the retrieval build: sample + titles."""
    from evidence.build_index import build_entities
    from evidence.corpus_store import open_corpus

    cfg = _evidence_cfg(corpus, "lazy", stats_sample)
    t0 = time.perf_counter()
    got = build_entities(open_corpus(cfg.corpus), cfg)
    return {"build_s": round(time.perf_counter() - t0, 2), "sample_passages": got["passages"],
            "sample_s": got["seconds"], "sample_bytes": got["bytes"], "titles_s": got["titles"]["seconds"],
            "titles_bytes": got["titles"]["bytes"], "cached": got["cached"] and got["titles"]["cached"]}


def child_paths(corpus: Path, annotation: str, stats_sample: int, targets: int, seed: int) -> dict[str, Any]:
    """Paths for `targets` random titles: twice in this process (the second pass is memo-warm)."""
    from evidence.corpus_store import open_corpus
    from evidence.pipeline import EvidencePipeline
    from evidence.retrieval import build_retriever

    cfg = _evidence_cfg(corpus, annotation, stats_sample)
    t0 = time.perf_counter()
    store = open_corpus(cfg.corpus)
    pipeline = EvidencePipeline.from_config(store, build_retriever(store, cfg.retrieval), cfg.evidence)
    ready_s, ready_rss = time.perf_counter() - t0, _rss_gb()
    names = _targets(store, targets, seed)
    passes = []
    for _ in range(2):
        times = []
        for name in names:
            t = time.perf_counter()
            pipeline.build_paths([name], seed)
            times.append((time.perf_counter() - t) * 1e3)
        passes.append(times)
    first, again = passes
    path_ms = {"first": round(first[0], 2), **_percentiles(first), "memo_warm_p50": _percentiles(again)["p50"]}
    out = {"evidence_ready_s": round(ready_s, 2), "ready_rss_gb": ready_rss, "rss_after_gb": _rss_gb(),
           "targets": targets, "path_ms": path_ms}
    annotated = getattr(pipeline.index, "annotated", None)
    if annotated is not None:  # lazy: spaCy runs of this process, and what the shared store holds now
        out.update(annotated=annotated, stored=pipeline.index.store.count())
    return out


CHILDREN = {"bm25s-build": lambda a: child_bm25s(a.corpus, "build", a.data, a.queries),
            "bm25s-start": lambda a: child_bm25s(a.corpus, "start", a.data, a.queries),
            "flat": lambda a: child_faiss(a.n, "flat", a.queries, a.seed),
            "hnsw": lambda a: child_faiss(a.n, "hnsw", a.queries, a.seed),
            "encode": lambda a: child_encode(a.corpus),
            "lazy-build": lambda a: child_lazy_build(a.corpus, a.stats_sample),
            "paths-eager": lambda a: child_paths(a.corpus, "eager", a.stats_sample, a.targets, a.seed),
            "paths-lazy": lambda a: child_paths(a.corpus, "lazy", a.stats_sample, a.targets, a.seed)}


# ---- parent --------------------------------------------------------------------------------------

def run_child(what: str, n: int, corpus: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One child measurement: its JSON plus `peak_rss_gb`, `peak_anon_gb` (the child's own peaks) and `wall_s`."""
    # The child runs from the repo root (`-m bench.scale`): its paths are absolute.
    cmd = [sys.executable, "-m", "bench.scale", "--child", what, "--n", str(n), "--corpus", os.path.abspath(corpus),
           "--data", os.path.abspath(args.data), "--queries", str(args.queries), "--seed", str(args.seed),
           "--stats-sample", str(args.stats_sample), "--targets", str(args.targets)]
    env = {**os.environ, "COEVO_CACHE": os.path.abspath(args.work / "cache"), "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    anon = [0]
    sampler = threading.Thread(target=_sample_anon, args=(proc.pid, anon), daemon=True)
    sampler.start()
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = round(time.perf_counter() - t0, 2)
    print(f"[scale] n={n} {what}: {wall}s, exit {proc.returncode}", file=sys.stderr, flush=True)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "wall_s": wall}
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_gb": round(usage.ru_maxrss / 1024 ** 2, 3),
            "peak_anon_gb": round(anon[0] / 1024 ** 2, 3), "wall_s": wall}


def _sample_anon(pid: int, peak: list[int]) -> None:
    """The child's largest RssAnon (kB), sampled every 0.2 s until it exits.

    `peak_rss_gb` (ru_maxrss) also counts pages of mapped files (the corpus store, an index being
    written), which the kernel can drop under pressure; anonymous memory is what can run a
    machine out of memory.
    """
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        match = re.search(r"^RssAnon:\s+(\d+) kB", text, re.M)
        if match is None:  # a zombie: exited, not yet reaped
            return
        peak[0] = max(peak[0], int(match.group(1)))
        time.sleep(0.2)


def measure_paths(n: int, corpus: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Evidence paths with lazy annotation (`cold`: a fresh annotation store, `store_warm`: a new
    process reading what the cold one stored) and, up to --paths-max passages, eager annotation."""
    out: dict[str, Any] = {}
    if "lazy" in args.annotation:
        import shutil

        built = run_child("lazy-build", n, corpus, args)
        for store in (args.work / "cache" / "entities").glob("lazy-*"):
            shutil.rmtree(store)  # a cold start: no passage annotated yet (the sample and titles stay)
        cold, warm = run_child("paths-lazy", n, corpus, args), run_child("paths-lazy", n, corpus, args)
        out["lazy"] = {"build": built, "cold": cold, "store_warm": warm}
        out["evidence_ready_s"] = cold.get("evidence_ready_s")
        out["path_ms"] = {"first_touch_p50": cold.get("path_ms", {}).get("p50"),
                          "store_warm_p50": warm.get("path_ms", {}).get("p50"),
                          "memo_warm_p50": cold.get("path_ms", {}).get("memo_warm_p50")}
    if "eager" in args.annotation:
        out["eager"] = (run_child("paths-eager", n, corpus, args) if n <= args.paths_max else
                        {"why": f"eager annotation of {n} passages (spaCy over each) is hours here (--paths-max "
                                f"{args.paths_max})"})
    return out


def measure(n: int, args: argparse.Namespace) -> dict[str, Any]:
    corpus = synthetic_corpus(n, args.data, args.work / f"corpus-{n}.jsonl", args.seed)
    line: dict[str, Any] = {"passages": n, "corpus_bytes": corpus.stat().st_size}
    if "bm25s" in args.kinds:
        built = run_child("bm25s-build", n, corpus, args)
        start = run_child("bm25s-start", n, corpus, args)
        line["bm25s"] = {**{k: built.get(k) for k in ("build_s", "peak_rss_gb", "peak_anon_gb")},
                         "index_bytes": built.get("index_bytes"), "store_bytes": built.get("store_bytes"),
                         **{k: start.get(k) for k in ("run_start_s", "start_rss_gb", "qps", "latency_ms")},
                         **({"error": built.get("error") or start.get("error")}
                            if "error" in built or "error" in start else {})}
    dense = [k for k in ("flat", "hnsw") if k in args.kinds]
    rate = run_child("encode", n, corpus, args).get("encode_passages_per_s") if dense else None
    for kind in dense:
        got = run_child(kind, n, corpus, args)
        if rate and "build_s" in got:
            got["dense_build_s_estimate"] = round(n / rate + got["build_s"], 1)
        line[kind] = {**got, "encode_passages_per_s": rate}
    line["evidence"] = measure_paths(n, corpus, args)
    line["path_ms"] = line["evidence"].get("path_ms")
    line["run_start_s"] = {"retrieval": line.get("bm25s", {}).get("run_start_s"),
                           "evidence": line["evidence"].get("evidence_ready_s")}  # None: not measured
    return line


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000,3000000", help="passages per synthetic corpus, comma-separated")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"index kinds of {KINDS}, comma-separated")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "scale", help="corpora and caches (reused)")
    ap.add_argument("--queries", type=int, default=256, help="dev questions (random vectors for FAISS) timed")
    ap.add_argument("--annotation", default="lazy", help="evidence paths with: lazy, eager or lazy,eager (none: '')")
    ap.add_argument("--paths-max", type=int, default=0, help="eager annotation only up to this many passages")
    ap.add_argument("--stats-sample", type=int, default=20_000, help="evidence.stats_sample of the lazy runs")
    ap.add_argument("--targets", type=int, default=21, help="evidence path targets (random titles) timed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=None, help="shared data dir (default: $COEVO_SHARED_DATA)")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.data is None:
        from evidence.corpus import shared_data_dir

        args.data = shared_data_dir()
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)), flush=True)
        return
    args.kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(args.kinds) - set(KINDS))
    if unknown:
        ap.error(f"--kinds: unknown {unknown}; expected some of {list(KINDS)}")
    (args.work / "cache").mkdir(parents=True, exist_ok=True)
    for n in (int(s) for s in args.sizes.split(",") if s):
        print(json.dumps(measure(n, args)), flush=True)


if __name__ == "__main__":
    main()
