"""HTML of single task-dump records: the view of an accepted task and the candidate table.

Every dump value is model output or hand-made, so it reaches the page only through markupsafe:
markup is built from the `Markup` templates below, whose `.format` escapes every argument that
is not itself `Markup`, and `join` (`Markup.join`) escapes every item that is not `Markup`.
So a value is escaped unless code here wrapped it in a template; layout is plain HTML
(`<details>` folds the rollouts without a script).
"""
from __future__ import annotations

from typing import Any, Sequence

from markupsafe import Markup, escape

from coevo.evaluate.report import hop_count
from coevo.evaluate.svg import fmt

join = Markup("").join  # concatenation that escapes every item that is not Markup
TABLE = Markup('<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')
TH, TD, TR = Markup("<th>{}</th>"), Markup("<td>{}</td>"), Markup("<tr>{}</tr>")
EVIDENCE_PATH = Markup("<p>target entity <b>{target}</b>; evidence passages {ids}</p>{hops}")
ROLLOUT = Markup(
    '<details class="rollout"><summary>rollout {idx}: answer {answer} · correctness {correctness} · reward {reward}'
    " · searches {searches} · format ok {format_ok} · end {end}</summary>"
    '<pre class="transcript">{transcript}</pre><h5>ranker calls</h5>{calls}</details>')
TASK = Markup(
    '<section class="task" id="{anchor}"><h3>{question}</h3><dl>{facts}</dl>'
    "<h4>evidence path ({hops} hops)</h4>{path}"
    "<h4>{n} rollouts</h4>{rollouts}</section>")
FACT = Markup("<dt>{}</dt><dd>{}</dd>")


def cell(v: Any) -> Markup:
    """A table cell's content: Markup as is, floats formatted, None as "-", anything else escaped text."""
    if isinstance(v, Markup):
        return v
    if isinstance(v, float):
        return escape(fmt(v))
    return escape("-" if v is None else v)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> Markup:
    """A table of class `cls`: the header cells escaped text, the body cells as `cell` renders them."""
    head = join(TH.format(h) for h in header)
    body = join(TR.format(join(TD.format(cell(v)) for v in row)) for row in rows)
    return TABLE.format(cls=cls, head=head, body=body)


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


def _evidence_path(rec: dict) -> Markup:
    path = _dict(rec.get("evidence_path"))
    if not path:
        return Markup("<p>no evidence path</p>")
    rows = []
    for i, hop in enumerate(path.get("hops") or []):
        hop = _dict(hop)
        entities = f"{hop.get('head')} \u2192 {hop.get('tail')}"
        mentions = f"{hop.get('head_mention')} / {hop.get('tail_mention')}" if "head_mention" in hop else None
        rows.append([i + 1, entities, mentions, hop.get("sentence"), hop.get("title"), hop.get("passage_id"),
                     hop.get("cue"), hop.get("score")])
    hops = table(["hop", "entities", "mentions", "sentence", "title", "passage", "cue", "score"], rows, "path")
    return EVIDENCE_PATH.format(target=path.get("target"), ids=_ids(path.get("evidence_ids")), hops=hops)


def _ranker_calls(calls: Sequence[dict]) -> Markup:
    if not calls:
        return Markup("<p>no search, so no ranker call</p>")
    rows = [[c.get("turn"), c.get("sub_query"), _ids(c.get("candidate_ids")), _ids(c.get("chosen_ids")),
             c.get("format_ok"), c.get("reason"), c.get("i_ans"), c.get("r_rel"), c.get("reward"),
             Markup("<pre>{}</pre>").format(c.get("output") or "")] for c in calls]
    return table(["turn", "sub-query", "candidate ids", "chosen ids", "format ok", "reason", "I_ans", "r_rel",
                  "reward", "output"], rows, "calls")


def _rollout(ro: dict) -> Markup:
    return ROLLOUT.format(idx=ro.get("rollout_idx"), answer=ro.get("answer"), correctness=cell(ro.get("correctness")),
                          reward=cell(ro.get("reward")), searches=ro.get("n_searches"), format_ok=ro.get("format_ok"),
                          end=ro.get("end_reason"), transcript=ro.get("transcript") or "",
                          calls=_ranker_calls(ro.get("ranker_calls") or []))


def task_view(anchor: str, rec: dict) -> Markup:
    """One accepted task: reference, target, evidence path, question, verdicts, rollouts with ranker calls.

    `anchor` (the section's id) and every value of `rec` are escaped.
    """
    facts = [("step", rec.get("step")), ("task id", rec.get("task_id")),
             ("reference question", rec.get("reference_question")),
             *([("grounding titles", _ids(rec["grounding_titles"]))] if rec.get("grounding_titles") else []),
             ("target", rec.get("target")),
             ("target verdict", _verdict(rec.get("target_verdict"))), ("paths found", rec.get("paths_found")),
             ("question", rec.get("question")), ("question verdict", _verdict(rec.get("question_verdict"))),
             ("solver accuracy", rec.get("accuracy")), ("proposer reward", rec.get("proposer_reward"))]
    rollouts = [_dict(ro) for ro in rec.get("rollouts") or []]
    return TASK.format(anchor=anchor, question=rec.get("question"), hops=hop_count(rec), path=_evidence_path(rec),
                       facts=join(FACT.format(k, cell(v)) for k, v in facts), n=len(rollouts),
                       rollouts=join(_rollout(ro) for ro in rollouts) or Markup("<p>none</p>"))


def candidate_table(records: Sequence[dict], limit: int) -> Markup:
    """A row per candidate (the first `limit`): step, reference, target, question, reason, accuracy, hops."""
    rows = [[r.get("step"), r.get("reference_question"), r.get("target"), r.get("question"), r.get("reason"),
             r.get("accuracy"), hop_count(r)] for r in records[:limit]]
    more = Markup("<p>{} more candidates not shown</p>").format(len(records) - limit) if len(records) > limit else ""
    return table(["step", "reference", "target", "question", "reason", "accuracy", "hops"], rows, "cands") + more
