"""The HTML pages of `coevo.inspect --html`: one run, or several runs compared (`--compare`).

Self-contained: inline CSS and inline SVG charts, no script and no external resource (a
report is read offline and may be mailed around). Per-step series come from
`coevo.evaluate.series`. Pages are built from the `Markup` templates below (markupsafe): their
`.format` and `join` (`Markup.join`) escape every argument that is not `Markup`, so dump values,
run labels and paths are escaped wherever they appear; only the templates, the charts of
`coevo.evaluate.svg` and the tables of `coevo.evaluate.taskview` are `Markup`.

One run: the acceptance funnel (totals and per step, from the task dumps), rejection reason
codes per step, charts of rewards, format validity, Hit@k, accuracy and solver groups (from
metrics.jsonl), a per-step table, the difficulty histogram and hop distribution of accepted
tasks (overall and per step), a view of each accepted task, and the candidate table.
Compare: a table of last-quarter means, the funnel of each run, and one chart per series
with every run overlaid.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from markupsafe import Markup

from coevo.core.io import atomic_write_text
from coevo.evaluate.report import number
from coevo.evaluate.series import FUNNEL, RunData, accuracy_bins, histogram, last_quarter
from coevo.evaluate.svg import bar_chart, fmt, line_chart
from coevo.evaluate.taskview import candidate_table, join, table, task_view

SHARE = (0.0, 1.0)
# Charts of one run: (title, [(series key, line label)], y range kept in view)
RUN_CHARTS: list[tuple[str, list[tuple[str, str]], Optional[tuple[float, float]]]] = [
    ("acceptance by stage (share of candidates)", [("target_acceptance", "valid target"),
                                                   ("path_acceptance", "evidence path"),
                                                   ("task_acceptance", "accepted")], SHARE),
    ("mean reward", [("proposer_reward", "proposer"), ("solver_reward", "solver"), ("ranker_reward", "ranker")],
     None),
    ("format validity", [("solver_format_valid", "solver"), ("ranker_format_valid", "ranker")], SHARE),
    ("ranker Hit@k", [("hit@1", "Hit@1"), ("hit@K", "Hit@K")], SHARE),
    ("solver accuracy on accepted tasks", [("accuracy", "accuracy")], SHARE),
    ("searches per rollout", [("mean_searches", "searches")], None),
    ("solver groups (share)", [("mixed_groups", "mixed"), ("all_correct_groups", "all correct"),
                               ("all_wrong_groups", "all wrong")], SHARE),
    ("solve rate of accepted tasks (share)", [("solve_rate_zero", "p = 0"), ("solve_rate_between", "0 < p < 1"),
                                              ("solve_rate_one", "p = 1")], SHARE),
    ("what the solver saw and said", [("answer_in_observation", "answer in observation"),
                                      ("echo_rate", "echoed answers")], SHARE),
    ("solver accuracy by hop count", [(f"accuracy_{k}hop", f"{k} hop") for k in range(1, 5)], SHARE),
    ("hop curriculum level", [("curriculum_level", "level")], None),
]
# Series of the compare page and of the last-quarter table: (key, title, y range)
COMPARE_SERIES: list[tuple[str, str, Optional[tuple[float, float]]]] = [
    ("task_acceptance", "task acceptance", SHARE), ("target_acceptance", "valid-target share", SHARE),
    ("path_acceptance", "evidence-path share", SHARE), ("proposer_reward", "proposer reward", None),
    ("solver_reward", "solver reward", None), ("ranker_reward", "ranker reward", None),
    ("solver_format_valid", "solver format-valid", SHARE), ("ranker_format_valid", "ranker format-valid", SHARE),
    ("hit@1", "ranker Hit@1", SHARE), ("hit@K", "ranker Hit@K", SHARE),
    ("accuracy", "solver accuracy on accepted tasks", SHARE), ("mean_searches", "searches per rollout", None),
    ("mixed_groups", "mixed solver groups (share)", SHARE), ("ranker_update_seqs", "sequences in ranker update", None),
    ("solve_rate_between", "accepted tasks with 0 < p < 1", SHARE),
    ("answer_in_observation", "rollouts shown an answer passage", SHARE), ("echo_rate", "echoed answers", SHARE),
]
PER_STEP = [("proposer_reward", "proposer reward"), ("solver_reward", "solver reward"),
            ("ranker_reward", "ranker reward"), ("solver_format_valid", "solver fmt"),
            ("ranker_format_valid", "ranker fmt"), ("hit@1", "Hit@1"), ("hit@K", "Hit@K"),
            ("accuracy", "accuracy"), ("mean_searches", "searches"), ("mixed_groups", "mixed groups")]
CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}h2{border-bottom:1px solid #ccc;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;
vertical-align:top;text-align:left}th{background:#f3f3f3}pre{white-space:pre-wrap;margin:0;max-width:70em}
.charts{display:flex;flex-wrap:wrap;gap:8px}.chart{border:1px solid #eee}.ttl{font:bold 13px sans-serif}
.lg,.xl,.yl,.bv,.na{font:11px sans-serif}.xl,.bv,.na{text-anchor:middle}.yl{text-anchor:end}
.ax{stroke:#333}.grid{stroke:#e5e5e5}dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}
dt{font-weight:bold}dd{margin:0}.task{border:1px solid #ddd;padding:.5em 1em;margin:1em 0}
.transcript{background:#f8f8f8;padding:4px}details{margin:.3em 0}"""
# Page templates: `.format` escapes every argument that is not Markup (charts, tables, templates).
PAGE = Markup('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
              "<style>{css}</style></head><body><h1>{title}</h1>{body}</body></html>")
RUN_BODY = Markup(
    "<p>run directory {run_dir}: {n_steps} dumped steps, {n_metrics} metrics lines, {n_records} candidates</p>"
    '<h2>Acceptance funnel</h2><div class="charts">{funnel_chart}{step_funnel_chart}</div>'
    "{funnel}<h3>per step</h3>{step_funnel}"
    "<h2>Rejection reasons per step</h2>{reasons}"
    '<h2>Rewards, format validity, Hit@k</h2><div class="charts">{charts}</div>'
    "<h2>Per step</h2>{per_step}"
    '<h2>Difficulty (solver accuracy per accepted task)</h2><div class="charts">{acc_chart}</div>{acc_table}'
    '<h2>Hop distribution of accepted tasks</h2><div class="charts">{hop_chart}</div>{hop_table}'
    "<h2>Accepted tasks ({n_accepted})</h2><ol>{index}</ol>{more}{views}"
    "<h2>Candidates</h2>{candidates}")
INDEX_ITEM = Markup('<li><a href="#{anchor}">step {step}: {question}</a></li>')
MORE_TASKS = Markup("<p>{} more accepted tasks not shown (see --max-tasks, --step)</p>")
COMPARE_BODY = Markup(
    "{listing}<h2>Last quarter</h2>{quarter}"
    '<h2>Acceptance funnel</h2><div class="charts">{funnel_chart}</div>{funnels}'
    '<h2>Per-step series</h2><div class="charts">{charts}</div>'
    '<h2>Difficulty and hops of accepted tasks</h2><div class="charts">{acc_chart}{hop_chart}</div>'
    "<h2>Rejection reasons, difficulty and hops per step</h2>{per_run}")
RUN_FUNNEL = Markup("<h3>{label}</h3>{funnel}<details><summary>per step</summary>{step_funnel}</details>")
RUN_COUNTS = Markup("<h3>{label}</h3>{reasons}<details><summary>difficulty per step</summary>{acc}</details>"
                    "<details><summary>hops per step</summary>{hops}</details>")


def page(title: str, body: Markup) -> Markup:
    """A whole HTML page: `title` is escaped, `body` (Markup from this module's templates) kept as is."""
    return PAGE.format(title=title, css=Markup(CSS), body=body)


def write_page(out: Path, html_text: str) -> None:
    atomic_write_text(out, html_text)


def series_of(run: RunData, key: str) -> list[Any]:
    """A per-step series by key; `<role>_update_seqs` derives from `updates`."""
    if key.endswith("_update_seqs"):
        role = key[: -len("_update_seqs")]
        return [u.get(role, 0) for u in run.series["updates"]]
    return run.series.get(key, [])


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "-"


def funnel_table(run: RunData) -> Markup:
    """Totals of each stage, as a share of the candidates and of the stage before."""
    total = run.total_funnel
    rows, prev = [], None
    for key, name, _ in FUNNEL:
        rows.append([name, total[key], _pct(total[key], total["candidates"]),
                     _pct(total[key], total[prev]) if prev else "-"])
        prev = key
    return table(["stage", "count", "of candidates", "of previous stage"], rows, "funnel")


def step_funnel_table(run: RunData) -> Markup:
    rows = [[step, *(f[key] for key, _, _ in FUNNEL)] for step, f in run.funnels.items()]
    return table(["step", *(name for _, name, _ in FUNNEL)], rows, "step-funnel")


def _heat(count: int, top: int) -> Markup:
    alpha = 0.0 if not top else 0.6 * count / top
    return Markup('<span style="background:rgba(31,119,180,{alpha:.2f});padding:0 4px">{count}</span>').format(
        alpha=alpha, count=count)


def _count_table(first: str, per_step: dict[int, dict[str, int]], columns: Sequence[str], cls: str) -> Markup:
    """Rows = steps, columns = labels (reason codes, accuracy bins, hops); cells shaded by count."""
    top = max([c for counts in per_step.values() for c in counts.values()] or [0])
    rows = [[step, *(_heat(counts.get(c, 0), top) for c in columns), sum(counts.values())]
            for step, counts in per_step.items()]
    return table([first, *columns, "total"], rows, cls)


def reasons_table(run: RunData) -> Markup:
    totals: dict[str, int] = {}
    for counts in run.reasons.values():
        for reason, n in counts.items():
            totals[reason] = totals.get(reason, 0) + n
    columns = sorted(totals, key=lambda r: (-totals[r], r))
    return _count_table("step", run.reasons, columns, "reasons") if columns else Markup("<p>no rejected candidate</p>")


def difficulty(runs: Sequence[RunData]) -> tuple[list[str], Markup, list[Markup]]:
    """(accuracy bins, overall chart, per-run per-step tables) of the accepted tasks' solver accuracy."""
    values = [a for run in runs for accs in run.accuracies.values() for a in accs]
    bins = accuracy_bins(values)
    groups = [(run.label, histogram([a for accs in run.accuracies.values() for a in accs], bins)) for run in runs]
    chart = bar_chart("solver accuracy per accepted task (tasks)", bins, groups)
    tables = [_count_table("step", {s: dict(zip(bins, histogram(accs, bins))) for s, accs in run.accuracies.items()},
                           bins, "difficulty") for run in runs]
    return bins, chart, tables


def hop_distribution(runs: Sequence[RunData]) -> tuple[Markup, list[Markup]]:
    """(overall chart, per-run per-step tables) of the accepted tasks' evidence-path hop counts."""
    cols = sorted({h for run in runs for hs in run.hops.values() for h in hs})
    labels = [str(h) for h in cols]

    def counts(hs: Sequence[int]) -> list[int]:
        return [sum(1 for h in hs if h == c) for c in cols]

    groups = [(run.label, counts([h for hs in run.hops.values() for h in hs])) for run in runs]
    chart = bar_chart("evidence-path hops per accepted task (tasks)", labels, groups)
    tables = [_count_table("step", {s: dict(zip(labels, counts(hs))) for s, hs in run.hops.items()}, labels, "hops")
              for run in runs]
    return chart, tables


def _funnel_chart(runs: Sequence[RunData]) -> Markup:
    groups = [(run.label, [run.total_funnel[key] / max(run.total_funnel["candidates"], 1) for key, _, _ in FUNNEL])
              for run in runs]
    return bar_chart("acceptance funnel (share of candidates)", [name for _, name, _ in FUNNEL], groups)


def _step_funnel_chart(run: RunData) -> Markup:
    steps = list(run.funnels)
    lines = [(name, steps, [f[key] / f["candidates"] if f["candidates"] else None for f in run.funnels.values()])
             for key, name, _ in FUNNEL[1:]]
    return line_chart("funnel per step (share of candidates)", lines, SHARE)


def per_step_table(run: RunData) -> Markup:
    """Funnel counts (dumps) and the main metrics (metrics.jsonl) of every step either knows."""
    at = {s: i for i, s in enumerate(run.series["steps"])}
    rows = []
    for step in sorted(set(at) | set(run.funnels)):
        f = run.funnels.get(step, {})
        metrics = [series_of(run, key)[at[step]] if step in at else None for key, _ in PER_STEP]
        rows.append([step, *(f.get(key, "-") for key, _, _ in FUNNEL),
                     *(number(v) if number(v) is not None else v for v in metrics)])
    return table(["step", *(name for _, name, _ in FUNNEL), *(name for _, name in PER_STEP)], rows, "per-step")


def run_page(run: RunData, shown: Sequence[dict], max_tasks: int = 200, max_rows: int = 500) -> Markup:
    """The one-run report; `shown` are the records (after --verdict/--reason/--hops) listed as tasks.

    Every dump value, the label and the run directory are escaped on the page.
    """
    steps = run.series["steps"]
    charts = [line_chart(title, [(name, steps, run.series.get(key, [])) for key, name in lines], y)
              for title, lines, y in RUN_CHARTS]
    _, acc_chart, acc_tables = difficulty([run])
    hop_chart, hop_tables = hop_distribution([run])
    accepted = [r for r in shown if r.get("accepted")]
    listed = [(f"task-{i}", r) for i, r in enumerate(accepted[:max_tasks])]
    body = RUN_BODY.format(
        run_dir=run.run_dir, n_steps=len(run.funnels), n_metrics=len(run.metrics), n_records=len(run.records),
        funnel_chart=_funnel_chart([run]), step_funnel_chart=_step_funnel_chart(run),
        funnel=funnel_table(run), step_funnel=step_funnel_table(run), reasons=reasons_table(run),
        charts=join(charts), per_step=per_step_table(run), acc_chart=acc_chart, acc_table=acc_tables[0],
        hop_chart=hop_chart, hop_table=hop_tables[0], n_accepted=len(accepted),
        index=join(INDEX_ITEM.format(anchor=a, step=r.get("step"), question=r.get("question")) for a, r in listed),
        more=MORE_TASKS.format(len(accepted) - max_tasks) if len(accepted) > max_tasks else "",
        views=join(task_view(a, r) for a, r in listed), candidates=candidate_table(list(shown), max_rows))
    return page(f"coevo run {run.label}", body)


def last_quarter_rows(runs: Sequence[RunData]) -> list[list[Any]]:
    """Per compared series: its title and each run's last-quarter mean (None when it has no number)."""
    rows: list[list[Any]] = [["steps", *(len(run.series["steps"]) for run in runs)]]
    rows += [[title, *(last_quarter(series_of(run, key)) for run in runs)] for key, title, _ in COMPARE_SERIES]
    return rows


def compare_page(runs: Sequence[RunData]) -> Markup:
    """Every run on one page: last-quarter means, funnels, overlaid per-step series, distributions.

    Run labels and directories are escaped on the page.
    """
    labels = [run.label for run in runs]
    listing = table(["run", "directory", "dumped steps", "metrics lines", "candidates"],
                    [[run.label, str(run.run_dir), len(run.funnels), len(run.metrics), len(run.records)]
                     for run in runs])
    quarter = table(["series (mean over the last quarter of steps)", *labels], last_quarter_rows(runs), "quarter")
    funnels = join(RUN_FUNNEL.format(label=run.label, funnel=funnel_table(run), step_funnel=step_funnel_table(run))
                   for run in runs)
    charts = [line_chart(title, [(run.label, run.series["steps"], series_of(run, key)) for run in runs], y)
              for key, title, y in COMPARE_SERIES]
    _, acc_chart, acc_tables = difficulty(runs)
    hop_chart, hop_tables = hop_distribution(runs)
    per_run = join(RUN_COUNTS.format(label=run.label, reasons=reasons_table(run), acc=a, hops=h)
                   for run, a, h in zip(runs, acc_tables, hop_tables))
    body = COMPARE_BODY.format(listing=listing, quarter=quarter, funnel_chart=_funnel_chart(runs), funnels=funnels,
                               charts=join(charts), acc_chart=acc_chart, hop_chart=hop_chart, per_run=per_run)
    return page("coevo runs compared: " + " vs ".join(labels), body)


def format_compare(runs: Sequence[RunData]) -> str:
    """The last-quarter table and each run's funnel totals, for the terminal."""
    rows = last_quarter_rows(runs)
    width = max(len(str(row[0])) for row in rows)
    cols = [max(12, len(run.label)) for run in runs]
    line = lambda name, cells: f"  {name:<{width}}  " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, cols))  # noqa: E731
    lines = ["== last-quarter means ==", line("", [run.label for run in runs])]
    lines += [line(row[0], [fmt(number(v)) for v in row[1:]]) for row in rows]
    lines.append("== acceptance funnel (all steps) ==")
    lines += [line(name, [str(run.total_funnel[key]) for run in runs]) for key, name, _ in FUNNEL]
    return "\n".join(lines)
