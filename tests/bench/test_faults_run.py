"""bench/faults.py on a real run: `--runs 1 --steps 2` of the tiny stack (local mode, a small corpus).

The kill must land and the run resume: a bench that cannot see the run's readiness kills nothing
and must fail here (it once reported 20 clean runs without a single kill).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_kills_a_real_run_and_resumes_it_with_nothing_lost(tmp_path, small_corpus) -> None:
    work = tmp_path / "faults"
    proc = subprocess.run([sys.executable, "-m", "bench.faults", "--runs", "1", "--steps", "2", "--save-share", "0",
                           "--workdir", str(work), "--", "corpus=jsonl", f"corpus.path={small_corpus}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout.splitlines()[-1])
    assert proc.returncode == 0 and report["failures"] == [], (report, proc.stderr[-2000:])
    [kill] = report["kills"]
    assert kill["killed"] and kill["delay_s"] is not None and report["missed_kills"] == 0
    assert report["resumed"] == 1 and report["per_run"][0]["attempts"] == 2
    assert report["lost_steps"] == report["corrupt_files"] == report["orphan_processes"] == 0
