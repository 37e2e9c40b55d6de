"""Benchmark (not a test): what each small-model learning lever does to the untrained policies' first step.

    .venv/bin/python -m bench.levers [--questions 12] [--ranker-questions 16] [--seed 0] [--out FILE]
        [--proposer-arms NAME...] [--ranker-arms NAME...] [--solver-questions 16] [--solver-arms NAME...]
        [-- BASE_OVERRIDES...]

Loads the stack once (every policy frozen, `ray.local` wiring), then runs the proposer's
stages (call 1 → target checks → paths → call 2 → question checks, no solving) on the first
`--questions` reference questions of the run's list, once per proposer arm, and the search
tool's ranker on the first `--ranker-questions` questions of `benchmarks/dev.jsonl` once per
ranker arm, and full solver episodes (G rollouts each, with the search tool) on the first
`--solver-questions` dev questions once per solver arm. Every arm uses the same seed, so an
arm differs from `baseline` only by its overrides (listed in the output). Nothing is trained:
this measures the levers' effect on the signal a first update would get, which is what
decides whether GRPO has groups to learn from.

Proposer arm fields: candidates; target_parsed / target_valid / path / question_parsed /
accepted: share of candidates that passed that stage; reasons: {reason: count};
rejected_groups: groups whose every candidate was rejected, and rejected_groups_with_variance:
how many of those have reward variance under the stage-graded penalty (under the flat penalty
none has, so no proposer update can come from them).
Ranker arm fields: calls, format_valid (share of well-formed rankings), hit@1 / hit@3 (answer
passage ranked 1st / in the top 3, among calls whose candidates hold one), reasons: {parser
reason: count}, malformed_examples: the first few malformed outputs as the parser read them.
Solver arm fields: episodes, format_valid (share ending in a well-formed answer), em (exact
match of those answers), mean_searches, ranker_calls, end_reasons: {reason: count}, and
mixed_format_groups: questions whose G rollouts differ in format (a GRPO group with variance),
ranker_format_valid and ranker_reasons of the episodes' ranker calls, and ranker_groups: for each
grouping in RANKER_GROUPINGS (the configured one and the alternatives, applied to the same calls
after the solver and ranker rewards are scored), {"groups", "calls", "with_variance"}: what a
first ranker update would get under that grouping.

Stdout is one JSON line (also written to --out): {"questions", "ranker_questions", "seed",
"base_overrides", "wall_s", "proposer": {arm: {...}}, "ranker": {arm: {...}}, "solver": {arm: {...}}}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from coevo.core.config import compose, to_object
from coevo.core.inputs import load_reference_questions
from coevo.core.io import atomic_write_text, read_jsonl
from coevo.orchestrate.actors import create_local_actors
from coevo.orchestrate.loop import propose_tasks, solve_tasks
from proposer.pipeline import Candidate
from proposer.reward import invalid_reward
from solver.agent import Task
from solver.grouping import group_calls, task_calls
from solver.ranker import SearchRequest, build_ranker
from solver.search_tool import SearchTool
from solver.training import episodes_by_task, score_ranker, score_solver

_ROOT = Path(__file__).resolve().parents[1]

FROZEN = ["proposer.frozen=true", "solver.frozen=true", "ranker.frozen=true", "run.memory_check=false"]
PROPOSER_ARMS: dict[str, list[str]] = {
    "baseline": [],
    "temperature_0.7": ["proposer.temperature=0.7"],
    "grounding_5": ["proposer.grounding=5"],
    "question_stop": ["proposer.question_stop=true"],
    "support_head": ["evidence.support_head=true"],
    "direct": ["proposer.generation=direct"],
    "all": ["proposer.temperature=0.7", "proposer.grounding=5", "proposer.question_stop=true",
            "evidence.support_head=true"],
    "all+direct": ["proposer.temperature=0.7", "proposer.grounding=5", "proposer.question_stop=true",
                   "evidence.support_head=true", "proposer.generation=direct"],
}
RANKER_ARMS: dict[str, list[str]] = {
    "baseline": [],
    "prime_tag": ["ranker.prime_tag=true"],
    "no_reasoning": ["ranker.reasoning=false"],
    "no_reasoning+prime_tag": ["ranker.reasoning=false", "ranker.prime_tag=true"],
    "no_reasoning+prime_tag+line_stop": ["ranker.reasoning=false", "ranker.prime_tag=true", "ranker.line_stop=true"],
    "small+top_k_2": ["ranker.reasoning=false", "ranker.prime_tag=true", "ranker.line_stop=true", "ranker.top_k=2"],
    "small+temperature_0.7": ["ranker.reasoning=false", "ranker.prime_tag=true", "ranker.line_stop=true",
                              "ranker.temperature=0.7"],
    "small+top_k_2+temperature_0.7": ["ranker.reasoning=false", "ranker.prime_tag=true", "ranker.line_stop=true",
                                      "ranker.top_k=2", "ranker.temperature=0.7"],
}
SOLVER_ARMS: dict[str, list[str]] = {
    "baseline": [],
    "prime_tag": ["solver.prime_tag=true"],
}
# (grouping, group_f1, min_group_size) variants scored on the same ranker calls of a solver arm.
RANKER_GROUPINGS = {"semantic_f1_0.8_k3": ("semantic", 0.8, 3), "semantic_f1_0.5_k2": ("semantic", 0.5, 2),
                    "by_question_k3": ("by_question", 0.8, 3), "by_question_k2": ("by_question", 0.8, 2)}
STAGES = ("target_parsed", "target_valid", "path", "question_parsed", "accepted")


def proposer_arm(actors: Any, cfg: Any, references: list[tuple[int, str]], seed: int) -> dict[str, Any]:
    """One pass of the proposer's stages; acceptance by stage and rejected-group variance."""
    actors.evidence.pipeline.cfg = cfg.evidence  # support_head is read per call
    cands = propose_tasks(references, actors, cfg, seed)
    n = len(cands)
    passed = Counter(c.stages_passed for c in cands)
    share = {name: round(sum(v for k, v in passed.items() if k > i) / n, 4) for i, name in enumerate(STAGES)}
    groups: dict[int, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(c.ref_index, []).append(c)
    rejected = [g for g in groups.values() if not any(c.accepted for c in g)]
    graded = [{invalid_reward(cfg.proposer.invalid_penalty, c.stages_passed, True) for c in g} for g in rejected]
    return {"candidates": n, **share, "reasons": dict(Counter(c.reason for c in cands).most_common()),
            "rejected_groups": len(rejected), "rejected_groups_with_variance": sum(len(r) > 1 for r in graded),
            "examples": [{"target": c.target, "question": c.question} for c in cands if c.accepted][:5],
            "rejected_examples": _rejected_examples(cands)}


def _rejected_examples(cands: list[Candidate], per_reason: int = 3) -> dict[str, list[str]]:
    """A few rejected outputs per reason: the target (or the raw call-1 text when it did not parse)."""
    out: dict[str, list[str]] = {}
    for c in cands:
        if not c.accepted and len(out.setdefault(c.reason, [])) < per_reason:
            shown = c.question if c.stage == "question" and c.question else c.target
            out[c.reason].append(shown if shown is not None else c.target_completion.text[:80])
    return out


def ranker_arm(actors: Any, cfg: Any, rows: list[dict]) -> dict[str, Any]:
    """The search tool on each dev question as its own sub-query; ranker format and Hit@k."""
    ranker = build_ranker(cfg.ranker, solver_policy=actors.solver, load_policy=lambda: actors.ranker)
    tool = SearchTool(actors.retrieval, ranker, cfg.ranker)
    reqs = [SearchRequest(r["question"], r["question"], list(r["answers"])) for r in rows]
    calls = [res.call for res in tool.search(reqs)]
    hits: dict[int, list[bool]] = {1: [], 3: []}
    for call in calls:  # `relevant`: the search tool's own pseudo-relevance label per candidate
        relevant = {pid for pid, rel in zip(call.candidate_ids, call.relevant) if rel}
        if relevant:
            for k in hits:
                hits[k].append(any(pid in relevant for pid in call.chosen_ids[:k]))
    return {"calls": len(calls), "format_valid": round(sum(c.format_ok for c in calls) / max(1, len(calls)), 4),
            **{f"hit@{k}": (round(sum(v) / len(v), 4) if v else None) for k, v in hits.items()},
            "with_answer_passage": len(hits[1]), "reasons": dict(Counter(c.reason for c in calls).most_common()),
            "malformed_examples": [c.output[:120] for c in calls if not c.format_ok][:6]}


def ranker_group_stats(episodes: list[Any], cfg: Any) -> dict[str, dict[str, int]]:
    """Ranker GRPO groups (and those with reward variance) of the same scored calls under each grouping."""
    score_solver(episodes, cfg.solver)
    score_ranker(episodes, cfg.ranker)
    out = {}
    for name, (grouping, delta, k_min) in RANKER_GROUPINGS.items():
        groups = [g for eps in episodes_by_task(episodes).values()
                  for g in group_calls(task_calls(eps), eps[0].task_id, grouping, delta, k_min)]
        out[name] = {"groups": len(groups), "calls": sum(map(len, groups)),
                     "with_variance": sum(len({c.reward for c in g}) > 1 for g in groups)}
    for ep in episodes:  # group ids of the last variant are not this arm's result
        for call in ep.ranker_calls:
            call.group_id = None
    return out


def solver_arm(actors: Any, cfg: Any, rows: list[dict], seed: int) -> dict[str, Any]:
    """G solver episodes per dev question (search tool and ranker as configured); format and groups."""
    tasks = [Task(f"dev{i}", r["question"], list(r["answers"])) for i, r in enumerate(rows)]
    episodes, _, accuracy = solve_tasks(tasks, actors, cfg, seed)
    by_task = episodes_by_task(episodes)
    n = max(1, len(episodes))
    calls = [c for ep in episodes for c in ep.ranker_calls if c.generated]
    return {"episodes": len(episodes), "format_valid": round(sum(ep.format_ok for ep in episodes) / n, 4),
            "em": round(sum(accuracy.values()) / max(1, len(accuracy)), 4),
            "mean_searches": round(sum(ep.n_searches for ep in episodes) / n, 4),
            "ranker_calls": sum(len(ep.ranker_calls) for ep in episodes),
            "end_reasons": dict(Counter(ep.end_reason for ep in episodes).most_common()),
            "mixed_format_groups": sum(len({ep.format_ok for ep in eps}) > 1 for eps in by_task.values()),
            "ranker_format_valid": round(sum(c.format_ok for c in calls) / max(1, len(calls)), 4),
            "ranker_reasons": dict(Counter(c.reason for c in calls).most_common()),
            "ranker_groups": ranker_group_stats(episodes, cfg)}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.levers", description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--ranker-questions", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--proposer-arms", nargs="*", default=list(PROPOSER_ARMS), choices=list(PROPOSER_ARMS))
    ap.add_argument("--ranker-arms", nargs="*", default=list(RANKER_ARMS), choices=list(RANKER_ARMS))
    ap.add_argument("--solver-questions", type=int, default=16)
    ap.add_argument("--solver-arms", nargs="*", default=list(SOLVER_ARMS), choices=list(SOLVER_ARMS))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    t0 = time.perf_counter()
    base = FROZEN + list(args.overrides)
    cfg0 = to_object(compose(base))
    actors = create_local_actors(cfg0, with_proposer=True)
    refs = load_reference_questions(cfg0.run.reference_questions)[0][: args.questions]
    references = list(enumerate(refs))
    out: dict[str, Any] = {"questions": len(references), "ranker_questions": args.ranker_questions,
                           "seed": args.seed, "base_overrides": base, "proposer": {}, "ranker": {}, "solver": {}}
    for arm in args.proposer_arms:
        extra = PROPOSER_ARMS[arm]
        cfg = to_object(compose(base + extra))
        out["proposer"][arm] = {"overrides": extra, **proposer_arm(actors, cfg, references, args.seed)}
        print(f"proposer {arm}: {json.dumps(out['proposer'][arm])}", file=sys.stderr, flush=True)
    dev = Path(os.environ.get("COEVO_SHARED_DATA", _ROOT.parent / "shared" / "data")) / "benchmarks" / "dev.jsonl"
    rows = read_jsonl(dev)[: args.ranker_questions]
    for arm in args.ranker_arms:
        extra = RANKER_ARMS[arm]
        cfg = to_object(compose(base + extra))
        out["ranker"][arm] = {"overrides": extra, **ranker_arm(actors, cfg, rows)}
        print(f"ranker {arm}: {json.dumps(out['ranker'][arm])}", file=sys.stderr, flush=True)
    for arm in args.solver_arms:
        extra = SOLVER_ARMS[arm]
        cfg = to_object(compose(base + extra))
        solver_rows = read_jsonl(dev)[: args.solver_questions]
        t_arm = time.perf_counter()
        out["solver"][arm] = {"overrides": extra, **solver_arm(actors, cfg, solver_rows, args.seed),
                              "wall_s": round(time.perf_counter() - t_arm, 1)}
        print(f"solver {arm}: {json.dumps(out['solver'][arm])}", file=sys.stderr, flush=True)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    line = json.dumps(out)
    if args.out:
        atomic_write_text(args.out, line + "\n")
    print(line)


if __name__ == "__main__":
    main()
