"""`python -m coevo.inspect <run_dir>`: audit a run's curriculum from its dumps (docs/method.md §6).

Terminal summary: acceptance per stage with reason-code counts, accuracy (difficulty) and
hop histograms, searches per solved task, reward trends, example tasks. Filters: --step,
--verdict, --reason, --hops. `--html out.html` writes a self-contained report (inline SVG
charts, no script, no external resource): per step the acceptance funnel, reason codes,
rewards, format validity, Hit@k, difficulty and hops, and a view of each accepted task with
its evidence path, rollouts and ranker calls. The filters choose the tasks listed; the
funnel and charts count every candidate of the steps read (--step reads one).
`--compare RUN_A RUN_B [...]` puts several runs on one page (trained vs control, two
ablations): last-quarter means, each run's funnel, every per-step series overlaid.
Reads runs that are still going or were killed (torn last lines are skipped). Ends with
`done: <run_dir>` and what the run holds (on stderr with --json, so stdout stays JSON).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from coevo.evaluate.report import filter_records, format_summary, summarize
from coevo.evaluate.report_page import compare_page, format_compare, last_quarter_rows, run_page, write_page
from coevo.evaluate.series import run_data
from coevo.orchestrate.persist import done_report, run_contents


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m coevo.inspect", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, nargs="?", help="the run directory (not with --compare)")
    ap.add_argument("--compare", type=Path, nargs="+", metavar="RUN_DIR", help="two or more run directories")
    ap.add_argument("--label", action="append", help="name of each compared run, in order (default: dir name)")
    ap.add_argument("--step", type=int, help="only this step")
    ap.add_argument("--verdict", choices=["accepted", "rejected"])
    ap.add_argument("--reason", help="only candidates with this reason code")
    ap.add_argument("--hops", type=int, help="only evidence paths with this many hops")
    ap.add_argument("--examples", type=int, default=5, help="example tasks to print")
    ap.add_argument("--max-tasks", type=int, default=200, help="accepted tasks shown in the HTML task view")
    ap.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    return ap


def _compare(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if len(args.compare) < 2:
        ap.error("--compare needs two or more run directories")
    if args.label and len(args.label) != len(args.compare):
        ap.error(f"--label given {len(args.label)} times for {len(args.compare)} compared runs")
    labels = args.label or [p.name or str(p) for p in args.compare]
    if len(set(labels)) < len(labels):  # same dir names (runs/a/trained, runs/b/trained): the paths tell apart
        labels = [str(p) for p in args.compare]
    runs = [run_data(p, name, args.step) for p, name in zip(args.compare, labels)]
    if args.json:
        rows = last_quarter_rows(runs)
        print(json.dumps({run.label: {"last_quarter": {row[0]: row[i + 1] for row in rows},
                                      "funnel": run.total_funnel} for i, run in enumerate(runs)}))
    else:
        print(format_compare(runs))
    rows = []
    if args.html:
        write_page(args.html, compare_page(runs))
        rows.append(("report", f"{args.html} (self-contained HTML)"))
    rows += [(run.label, f"python -m coevo.inspect {path}") for run, path in zip(runs, args.compare)]
    print(done_report(f"compared {len(runs)} runs", rows=rows), file=sys.stderr if args.json else sys.stdout)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if (args.run_dir is None) == (args.compare is None):
        ap.error("give one run directory, or --compare with two or more")
    if args.compare:
        return _compare(ap, args)
    run = run_data(args.run_dir, step=args.step)
    records = filter_records(run.records, args.verdict, args.reason, args.hops)
    summary = summarize(records)
    examples = [r for r in records if r.get("accepted")][: args.examples] or records[: args.examples]
    text = format_summary(summary, run.metrics, examples)
    print(json.dumps(summary) if args.json else text)
    rows = [row for row in run_contents(args.run_dir) if row[0] != "inspect"]
    if args.html:
        write_page(args.html, run_page(run, records, args.max_tasks))
        rows.append(("report", f"{args.html} (self-contained HTML)"))
    print(done_report(args.run_dir, rows=rows), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
