"""HTML of single task-dump records: the view of an accepted task and the candidate table.

Every dump value is model output or hand-made, so every value is escaped; layout is plain
HTML (`<details>` folds the rollouts without a script).
"""
from __future__ import annotations

from typing import Any, Sequence

from coevo.evaluate.report import hop_count
from coevo.evaluate.svg import esc, fmt


class Raw(str):
    """Markup built here (already escaped), as opposed to a dump value."""


def cell(v: Any) -> str:
    """A table cell's content: markup as is, numbers formatted, anything else escaped text."""
    if isinstance(v, Raw):
        return v
    if isinstance(v, float):
        return fmt(v)
    return esc("-" if v is None else v)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _dict(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def _ids(x: Any) -> str:
    return ", ".join(map(str, x)) if isinstance(x, list) else ("-" if x is None else str(x))


def _verdict(v: Any) -> str:
    v = _dict(v)
    if not v:
        return "-"
    ev = f" evidence: {_ids(v.get('evidence'))}" if v.get("evidence") else ""
    detail = f" ({v.get('detail')})" if v.get("detail") else ""
    return f"{v.get('reason')}{detail}{ev}"


def _evidence_path(rec: dict) -> str:
    path = _dict(rec.get("evidence_path"))
    if not path:
        return "<p>no evidence path</p>"
    rows = []
    for i, hop in enumerate(path.get("hops") or []):
        hop = _dict(hop)
        entities = f"{hop.get('head')} \u2192 {hop.get('tail')}"
        mentions = f"{hop.get('head_mention')} / {hop.get('tail_mention')}" if "head_mention" in hop else None
        rows.append([i + 1, entities, mentions, hop.get("sentence"), hop.get("title"), hop.get("passage_id"),
                     hop.get("cue"), hop.get("score")])
    return (f"<p>target entity <b>{esc(path.get('target'))}</b>; evidence passages "
            f"{esc(_ids(path.get('evidence_ids')))}</p>"
            + table(["hop", "entities", "mentions", "sentence", "title", "passage", "cue", "score"], rows, "path"))


def _ranker_calls(calls: Sequence[dict]) -> str:
    if not calls:
        return "<p>no search, so no ranker call</p>"
    rows = [[c.get("turn"), c.get("sub_query"), _ids(c.get("candidate_ids")), _ids(c.get("chosen_ids")),
             c.get("format_ok"), c.get("reason"), c.get("i_ans"), c.get("r_rel"), c.get("reward"),
             Raw(f"<pre>{esc(c.get('output') or '')}</pre>")] for c in calls]
    return table(["turn", "sub-query", "candidate ids", "chosen ids", "format ok", "reason", "I_ans", "r_rel",
                  "reward", "output"], rows, "calls")


def _rollout(ro: dict) -> str:
    summary = (f"rollout {esc(ro.get('rollout_idx'))}: answer {esc(ro.get('answer'))} · correctness "
               f"{cell(ro.get('correctness'))} · reward {cell(ro.get('reward'))} · searches "
               f"{esc(ro.get('n_searches'))} · format ok {esc(ro.get('format_ok'))} · end {esc(ro.get('end_reason'))}")
    return (f'<details class="rollout"><summary>{summary}</summary>'
            f"<pre class=\"transcript\">{esc(ro.get('transcript') or '')}</pre>"
            f"<h5>ranker calls</h5>{_ranker_calls(ro.get('ranker_calls') or [])}</details>")


def task_view(anchor: str, rec: dict) -> str:
    """One accepted task: reference, target, evidence path, question, verdicts, rollouts with ranker calls."""
    facts = [("step", rec.get("step")), ("task id", rec.get("task_id")),
             ("reference question", rec.get("reference_question")),
             *([("grounding titles", _ids(rec["grounding_titles"]))] if rec.get("grounding_titles") else []),
             ("target", rec.get("target")),
             ("target verdict", _verdict(rec.get("target_verdict"))), ("paths found", rec.get("paths_found")),
             ("question", rec.get("question")), ("question verdict", _verdict(rec.get("question_verdict"))),
             ("solver accuracy", rec.get("accuracy")), ("proposer reward", rec.get("proposer_reward"))]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{cell(v)}</dd>" for k, v in facts)
    rollouts = [_dict(ro) for ro in rec.get("rollouts") or []]
    return (f'<section class="task" id="{esc(anchor)}"><h3>{esc(rec.get("question"))}</h3><dl>{dl}</dl>'
            f"<h4>evidence path ({esc(hop_count(rec))} hops)</h4>{_evidence_path(rec)}"
            f"<h4>{len(rollouts)} rollouts</h4>{''.join(_rollout(ro) for ro in rollouts) or '<p>none</p>'}"
            "</section>")


def candidate_table(records: Sequence[dict], limit: int) -> str:
    """A row per candidate (the first `limit`): step, reference, target, question, reason, accuracy, hops."""
    rows = [[r.get("step"), r.get("reference_question"), r.get("target"), r.get("question"), r.get("reason"),
             r.get("accuracy"), hop_count(r)] for r in records[:limit]]
    more = f"<p>{len(records) - limit} more candidates not shown</p>" if len(records) > limit else ""
    return table(["step", "reference", "target", "question", "reason", "accuracy", "hops"], rows, "cands") + more
