"""Benchmark (not a test): how often a guided rollout's searches can reach the answer, per `solver.guide_query`.

    .venv/bin/python -m bench.guide_reach RUN_DIR [--k 2 5] -- experiment=small_learning [overrides]

For every accepted task of RUN_DIR's dumps (tasks/step_<n>.jsonl), the first-stage retriever of the
config composed from the overrides (give the run's: its corpus and `retrieval` backend) runs the searches
each `solver.guide_query` replays (solver/agent.py `guide_turn`): `path`, the last hop heads that fit
min(solver.max_searches, solver.max_turns - 1), a head holding a gold alias left out as the proposer
leaves it out; `question`, the task's question once. A task reaches the answer at k when a top-k passage
of one of its searches holds a gold alias (`solver.reward.answer_relevant`, the rule a rollout's
`read_answer` uses). k = the ranker's N (`ranker.n_candidates`) is what the ranker can show; k = its K
(`ranker.top_k`) is what `ranker.mode=none` shows. No model runs: the ranker is left out. Prints ONE line:

    {"run_dir", "tasks": n, "k": [...], "reach": {"path": {"<k>": tasks}, "question": {"<k>": tasks}},
     "run_guided": the run's guided rollouts on those tasks, "run_guided_read": those that read the answer}
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from bench import split_overrides
from bench.task_labels import accepted_records
from coevo.core.config import compose
from coevo.core.scoring import echoes
from evidence.corpus_store import open_corpus
from evidence.retrieval import build_retriever
from solver.reward import answer_relevant


def accepted_tasks(run_dir: Path) -> list[dict[str, Any]]:
    """The accepted task records of the run's dumps, in step order."""
    return [rec for _, rec in accepted_records(run_dir)]


def path_queries(rec: dict[str, Any], room: int) -> list[str]:
    """The searches a `guide_query=path` replay makes: the hop heads that hold no gold alias, the last `room`."""
    answers = rec.get("answers") or []
    heads = [h.get("head", "") for h in ((rec.get("evidence_path") or {}).get("hops") or [])]
    heads = [h for h in heads if not any(echoes(a, [h]) for a in answers)]
    return heads[-room:] if room else []


def reach(tasks: Sequence[dict[str, Any]], queries: Sequence[list[str]], retriever: Any, corpus: Any,
          ks: Sequence[int]) -> dict[str, int]:
    """{str(k): tasks one of whose `queries` has a gold-alias passage among its top k}."""
    flat = [(i, q) for i, qs in enumerate(queries) for q in qs]
    hits = retriever.search([q for _, q in flat], max(ks)) if flat else []
    best: dict[int, int] = {}  # task -> the best (smallest) rank of a gold-alias passage over its searches
    for (i, _), row in zip(flat, hits):
        answers = tasks[i].get("answers") or []
        ranks = [r for r, h in enumerate(row, 1) if answer_relevant(corpus[h.passage_id], answers)]
        if ranks:
            best[i] = min(best.get(i, ranks[0]), ranks[0])
    return {str(k): sum(rank <= k for rank in best.values()) for k in ks}


def guide_reach(run_dir: Path, overrides: Sequence[str], ks: Sequence[int]) -> dict[str, Any]:
    """The figures the module prints, for the run's accepted tasks."""
    tasks = accepted_tasks(run_dir)  # a run dir without dumps fails before the corpus loads
    cfg = compose(list(overrides))
    corpus = open_corpus(cfg.corpus)
    retriever = build_retriever(corpus, cfg.retrieval)
    room = max(0, min(cfg.solver.max_searches, cfg.solver.max_turns - 1))
    guided = [ro for rec in tasks for ro in rec.get("rollouts") or [] if ro.get("guided")]
    return {"run_dir": str(run_dir), "tasks": len(tasks), "k": list(ks),
            "reach": {"path": reach(tasks, [path_queries(t, room) for t in tasks], retriever, corpus, ks),
                      "question": reach(tasks, [[t["question"]] if room else [] for t in tasks],
                                        retriever, corpus, ks)},
            "run_guided": len(guided), "run_guided_read": sum(bool(ro.get("read_answer")) for ro in guided)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    options, overrides = split_overrides(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m bench.guide_reach", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 5], help="top-k cutoffs (positive)")
    args = parser.parse_args(options)
    if min(args.k) < 1:
        parser.error(f"--k must be positive, got {args.k}")
    try:
        print(json.dumps(guide_reach(args.run_dir, overrides, sorted(set(args.k)))))
    except (OSError, ValueError) as e:
        print(f"bench.guide_reach: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
