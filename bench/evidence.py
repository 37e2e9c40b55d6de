"""Evidence-path benchmark (not a test): prints one JSON line on stdout.

Per corpus (vital_articles, wiki_mini): entity-index build seconds, median / p90 ms per
target of `build_evidence_paths` (index and retriever already built; max_hops 3,
branching 2, retrieve_k 5), the share of targets with >= 1 certified path, and the
hop-length histogram of all certified paths. Targets: 500 passage titles drawn with seed
0 on vital_articles; on wiki_mini 250 drawn titles plus 250 answers (first alias) of the
shared dev questions. Bridge recall: share of the 2-hop MuSiQue dev questions whose
graph, built from their gold passages only, joins the first-hop answer and the final
answer (any alias) by an edge or a 2-edge path; answers are looked up with
`graph.reach_node` (an answer that is no entity is found by text in the gold passages).

`index_build_s` is the spaCy annotation time measured when the index was built; when the
cache already holds the index, that recorded figure is reported (and the load time goes
to stderr). `--rebuild` builds into a fresh temporary cache instead. Example paths and
diagnostics go to stderr.
Usage: .venv/bin/python -m bench.evidence [--targets 500] [--rebuild] [--examples 5]
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter

import networkx as nx

from coevo.core.inputs import load_labelled_questions
from coevo.core.io import read_jsonl
from coevo.core.types import EvidencePath
from evidence.corpus import Corpus, load_corpus, shared_data_dir
from evidence.entities import EntityIndex, build_entity_index
from evidence.graph import build_graph, reach_node
from evidence.paths import build_evidence_paths
from evidence.retrieval import build_retriever

SEED = 0


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def dev_questions() -> list[dict]:
    path = shared_data_dir() / "wiki_mini" / "questions_dev.jsonl"
    load_labelled_questions(path)  # validates every record first (errors name file and line)
    return read_jsonl(path)  # the raw records: this benchmark also reads MuSiQue's `hops` key


def pick_targets(corpus: Corpus, n: int, answers: list[str]) -> list[str]:
    """`n` targets: drawn passage titles, half of them replaced by dev answers when given."""
    rng = random.Random(SEED)
    answers = list(dict.fromkeys(a for a in answers if a.strip()))
    n_answers = min(len(answers), n // 2) if answers else 0
    titles = [p.title for p in rng.sample(corpus.passages, n - n_answers)]
    return titles + rng.sample(answers, n_answers)


def index_for(corpus: Corpus, rebuild: bool) -> tuple[EntityIndex, float]:
    cache = tempfile.mkdtemp(prefix="coevo-bench-ents-") if rebuild else None
    t0 = time.perf_counter()
    index = build_entity_index(corpus, cache_dir=cache)
    wall = time.perf_counter() - t0
    if cache:
        shutil.rmtree(cache, ignore_errors=True)  # the index stays in memory; the real cache is untouched
    log(f"{corpus.name}: entity index {'loaded' if index.from_cache else 'built'} in {wall:.2f} s "
        f"({index.meta['entities']} entities, {index.meta['mentions']} mentions)")
    return index, (float(index.meta["annotate_s"]) if index.from_cache else wall)


def run_paths(corpus: Corpus, index: EntityIndex, targets: list[str]) -> tuple[dict, list[tuple[str, EvidencePath]]]:
    retriever = build_retriever(corpus, "bm25s")
    build_evidence_paths(targets[0], retriever, index, rng=SEED)  # warm-up: imports, first search
    times, hops, found, examples = [], Counter(), 0, []
    for i, target in enumerate(targets):
        t0 = time.perf_counter()
        paths = build_evidence_paths(target, retriever, index, max_hops=3, branching=2, rng=SEED + i, retrieve_k=5)
        times.append((time.perf_counter() - t0) * 1000)
        found += bool(paths)
        hops.update(len(p) for p in paths)
        if paths:
            examples.append((target, paths[0]))
    times.sort()
    stats = {"index_build_s": None, "median_ms": round(statistics.median(times), 2),
             "p90_ms": round(times[int(0.9 * (len(times) - 1))], 2), "path_yield": round(found / len(targets), 3),
             "hops": {str(k): hops[k] for k in sorted(hops)}}
    return stats, examples


def bridge_recall(index: EntityIndex, questions: list[dict]) -> float:
    two_hop = [q for q in questions if len(q.get("hops") or []) == 2]
    joined, unresolved = 0, 0
    for q in two_hop:
        graph = build_graph(q["gold_ids"], index)
        first = reach_node(graph, q["hops"][0]["answer"], index)
        finals = {n for n in (reach_node(graph, a, index) for a in q["answers"]) if n is not None}
        if first is None or not finals:
            unresolved += 1
            continue
        joined += any(f != first and nx.has_path(graph, first, f) and nx.shortest_path_length(graph, first, f) <= 2
                      for f in finals)
    log(f"bridge recall: {joined}/{len(two_hop)} two-hop MuSiQue questions joined; "
        f"{unresolved} with an answer that is no graph node")
    return round(joined / len(two_hop), 3) if two_hop else 0.0


def show(examples: list[tuple[str, EvidencePath]], n: int) -> None:
    for target, path in examples[:n]:
        log(f"  target {target!r}: " + " -> ".join(path.entities))
        for h in path.hops:
            log(f"    [{h.cue}] {h.head} -> {h.tail}  ({h.passage_id} '{h.title}'): {h.sentence[:160]}")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.evidence", description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--rebuild", action="store_true", help="build the entity indexes into a fresh temp cache")
    ap.add_argument("--examples", type=int, default=5, help="example paths printed to stderr per corpus")
    args = ap.parse_args()
    questions = dev_questions()
    out: dict = {}
    for name in ("vital_articles", "wiki_mini"):
        corpus = load_corpus(name)
        index, build_s = index_for(corpus, args.rebuild)
        answers = [q["answers"][0] for q in questions if q.get("answers")] if name == "wiki_mini" else []
        stats, examples = run_paths(corpus, index, pick_targets(corpus, args.targets, answers))
        stats["index_build_s"] = round(build_s, 1)
        out[name] = stats
        log(f"{name}: {json.dumps(stats)}")
        show(examples, args.examples)
        if name == "wiki_mini":
            out["bridge_recall"] = bridge_recall(index, questions)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
