"""Task-dump records and per-step metrics (SPEC §6) built from one step's results."""
from __future__ import annotations

from collections import Counter
from statistics import mean
from typing import Any, Callable, Optional, Sequence

from solver.reward import hit_at_k


def ranker_call_record(call: Any) -> dict:
    return {"sub_query": call.sub_query, "turn": call.turn, "mode": call.mode, "candidates": call.candidate_ids,
            "chosen": call.chosen_ids, "format_ok": call.format_ok, "reason": call.reason, "i_ans": call.i_ans,
            "r_rel": call.r_rel, "reward": call.reward, "group_id": call.group_id, "output": call.text}


def rollout_record(ep: Any, decode: Optional[Callable[[list[int]], str]] = None) -> dict:
    transcript = decode(ep.token_ids[ep.prompt_len:]) if decode else None
    return {"rollout": ep.rollout_idx, "transcript": transcript, "answer": ep.answer, "format_ok": ep.format_ok, "end_reason": ep.end_reason,
            "correct": ep.correctness, "searches": ep.n_searches, "sub_queries": ep.sub_queries,
            "reward": ep.reward, "generated_tokens": ep.n_generated,
            "ranker_calls": [ranker_call_record(c) for c in ep.ranker_calls]}


def candidate_record(cand: Any, task_id: Optional[str], episodes: Sequence[Any], timings: dict,
                     decode: Optional[Callable[[list[int]], str]] = None) -> dict:
    """One line of tasks/step_<n>.jsonl: everything about one proposed candidate."""
    return {
        "task_id": task_id, "reference_question": cand.reference, "reference_index": cand.ref_index,
        "candidate": cand.index, "target_output": "<target>" + cand.target_completion.text, "target": cand.target,
        "target_verdict": cand.target_verdict, "paths_found": cand.paths_found, "evidence_path": cand.path,
        "question_output": "<question>" + cand.question_completion.text if cand.question_completion else None,
        "question": cand.question, "question_verdict": cand.question_verdict,
        "stage": cand.stage, "reason": cand.reason, "accepted": cand.accepted,
        "accuracy": cand.accuracy, "proposer_reward": cand.reward,
        "rollouts": [rollout_record(ep, decode) for ep in episodes], "timings_s": timings,
    }


def _rate(n: int, d: int) -> Optional[float]:
    return n / d if d else None


def _mean(xs: Sequence[float]) -> Optional[float]:
    return mean(xs) if xs else None


def step_metrics(cands: Sequence[Any], episodes: Sequence[Any], groups: Sequence[Sequence[Any]],
                 top_k: int) -> dict[str, Any]:
    """Acceptance by stage, difficulty histogram, searches, rewards, ranker Hit@k, group sizes."""
    n = len(cands)
    target_ok = sum(1 for c in cands if c.target_verdict.get("ok"))
    with_path = sum(1 for c in cands if c.path is not None)
    accepted = [c for c in cands if c.accepted]
    calls = [call for ep in episodes for call in ep.ranker_calls]
    hits = {f"hit@{k}": _mean([hit_at_k(c.ranked_relevant(), k) for c in calls if c.i_ans])
            for k in sorted({min(k, top_k) for k in (1, 3, 5)})}
    return {
        "candidates": n, "accepted": len(accepted),
        "acceptance": {"target": _rate(target_ok, n), "path": _rate(with_path, n), "task": _rate(len(accepted), n)},
        "reasons": dict(Counter(c.reason for c in cands if not c.accepted)),
        "accuracy_hist": dict(Counter(f"{c.accuracy:.2f}" for c in accepted if c.accuracy is not None)),
        "solver": {"mean_searches": _mean([ep.n_searches for ep in episodes]),
                   "format_valid": _mean([float(ep.format_ok) for ep in episodes]),
                   "accuracy": _mean([c.accuracy for c in accepted if c.accuracy is not None])},
        "reward": {"proposer": _mean([c.reward for c in cands if c.reward is not None]),
                   "solver": _mean([ep.reward for ep in episodes]),
                   "ranker": _mean([c.reward for c in calls if c.reward is not None])},
        "ranker": {"calls": len(calls), "format_valid": _mean([float(c.format_ok) for c in calls]),
                   "i_ans": _mean([float(c.i_ans) for c in calls]), **hits,
                   "group_sizes": dict(Counter(len(g) for g in groups))},
    }
