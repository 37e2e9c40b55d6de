"""`python -m coevo.inspect <run_dir>`: audit a run's curriculum from its dumps (SPEC §6).

Terminal summary: acceptance per stage with reason-code counts, accuracy (difficulty) and
hop histograms, searches per solved task, reward trends, example tasks. Filters: --step,
--verdict, --reason, --hops. `--html out.html` writes a self-contained report with plots.
Reads runs that are still going or were killed (torn last lines are skipped). Ends with
`done: <run_dir>` and what the run holds (on stderr with --json, so stdout stays JSON).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from coevo.evaluate.report import filter_records, format_summary, load_run, summarize, write_html
from coevo.orchestrate.persist import done_report, run_contents


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m coevo.inspect", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--step", type=int, help="only this step")
    ap.add_argument("--verdict", choices=["accepted", "rejected"])
    ap.add_argument("--reason", help="only candidates with this reason code")
    ap.add_argument("--hops", type=int, help="only evidence paths with this many hops")
    ap.add_argument("--examples", type=int, default=5, help="example tasks to print")
    ap.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    records, metrics = load_run(args.run_dir, args.step)
    records = filter_records(records, args.verdict, args.reason, args.hops)
    summary = summarize(records)
    examples = [r for r in records if r.get("accepted")][: args.examples] or records[: args.examples]
    text = format_summary(summary, metrics, examples)
    print(json.dumps(summary) if args.json else text)
    rows = [row for row in run_contents(args.run_dir) if row[0] != "inspect"]
    if args.html:
        write_html(args.html, args.run_dir, text, metrics, records)
        rows.append(("report", f"{args.html} (self-contained HTML)"))
    print(done_report(args.run_dir, rows=rows), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
