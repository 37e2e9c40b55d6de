"""Task-dump records as `coevo.inspect` reads them: current keys, older dumps, README tables."""
import json
import re
from pathlib import Path

import pytest

from coevo.core.types import Completion, EvidencePath, Hop, Verdict
from coevo.evaluate.report import format_summary, load_run, summarize
from coevo.evaluate.report_page import run_page, write_page
from coevo.evaluate.series import run_data
from coevo.orchestrate.records import candidate_record
from proposer.pipeline import Candidate
from solver.agent import Episode, Task
from solver.ranker import RankerCall

README = Path(__file__).resolve().parents[3] / "README.md"
HOP = Hop("France", "Paris", "Paris is the capital of France.", "p0", "Paris", 1.5, "relation", "france", "paris",
          "France", "Paris")
TIMINGS = {"target": 0.5, "path": 0.25, "question": 0.5, "solve": 2.0, "update": 1.0}


def _call() -> RankerCall:
    return RankerCall(q0="Which city is the capital of France?", sub_query="capital of France", task_id="s0-q3-c0",
                      rollout_idx=0, turn=0, mode="trainable", candidate_ids=["p0", "p2", "p3"],
                      chosen_ids=["p0", "p3"], format_ok=True, reason="ok", i_ans=True, relevant=[True, False, True],
                      output="<rerank>[1] > [3]</rerank>", group_id="s0-q3-c0/ans1/0", r_rel=1.0, reward=2.0)


def _episode(i: int, answer: str, correctness: float, n_searches: int, calls: list) -> Episode:
    task = Task("s0-q3-c0", "Which city is the capital of France?", ["Paris"], ["p0"])
    ids = [ord(c) for c in f"PROMPT<answer>{answer}</answer>"]
    return Episode(task, i, ids, [0] * 6 + [1] * (len(ids) - 6), None, prompt_len=6, answer=answer,
                   end_reason="answer", n_searches=n_searches, sub_queries=["capital of France"] * n_searches,
                   ranker_calls=calls, n_generated=len(ids) - 6, n_turns=n_searches + 1, correctness=correctness,
                   reward=correctness)


def new_records() -> list[dict]:
    """An accepted task with two rollouts and a target that failed to parse, written by today's code."""
    accepted = Candidate(3, "who wrote hamlet", 0, Completion([1], [2], "Paris</target>", None, "stop"),
                         target="Paris", target_verdict=Verdict(True, "ok", ("p0",), "GPE"), paths_found=2,
                         path=EvidencePath("Paris", (HOP,)),
                         question_completion=Completion([1], [2], "Which city is the capital of France?</question>"),
                         question="Which city is the capital of France?", question_verdict=Verdict(True, "ok", ("p0",)),
                         stage="accepted", reason="accepted", accuracy=0.5, reward=1.0)
    rejected = Candidate(3, "who wrote hamlet", 1, Completion([1], [2], "''</target>", None, "stop"),
                         target_verdict=Verdict(False, "parse:empty"), reason="parse:empty", reward=-0.5)
    episodes = [_episode(0, "Paris", 1.0, 1, [_call()]), _episode(1, "Lyon", 0.0, 0, [])]
    decode = lambda ids: "".join(chr(i) for i in ids)  # noqa: E731
    return [json.loads(json.dumps(candidate_record(accepted, "s0-q3-c0", episodes, TIMINGS, decode))),
            json.loads(json.dumps(candidate_record(rejected, None, [], TIMINGS, decode)))]


def _write_run(run_dir: Path, records: list[dict]) -> Path:
    (run_dir / "tasks").mkdir(parents=True)
    (run_dir / "tasks" / "step_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_new_records_use_one_vocabulary():
    accepted, rejected = new_records()
    rollout = accepted["rollouts"][0]
    assert (rollout["rollout_idx"], rollout["correctness"], rollout["n_searches"], rollout["n_generated"]) == \
        (0, 1.0, 1, 22)
    call = rollout["ranker_calls"][0]
    assert (call["candidate_ids"], call["chosen_ids"], call["output"]) == \
        (["p0", "p2", "p3"], ["p0", "p3"], "<rerank>[1] > [3]</rerank>")
    # proposer-side rejections are verdicts like any other
    assert rejected["target_verdict"] == {"ok": False, "reason": "parse:empty", "evidence": [], "detail": ""}
    assert rejected["question_verdict"] == {"ok": False, "reason": "pending", "evidence": [], "detail": ""}


def _readme_tables() -> list[list[str]]:
    """First-column keys of each table under README "Task dump records", in order."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Task dump records", 1)[1].split("\n## ", 1)[0]
    tables, current = [], None
    for line in section.splitlines():
        key = re.match(r"\| `([a-z_]+)` \|", line)
        if key and current is not None:
            current.append(key.group(1))
        elif line.startswith("| key |"):
            current = []
            tables.append(current)
        elif not line.startswith("|"):
            current = None
    return tables


def test_readme_documents_every_dump_key():
    accepted, _ = new_records()
    rollout = accepted["rollouts"][0]
    written = [accepted, accepted["target_verdict"], accepted["evidence_path"], rollout, rollout["ranker_calls"][0]]
    assert _readme_tables() == [list(r) for r in written]


# ---- hostile and hand-made dumps --------------------------------------------------------------

HOSTILE = '<script>alert("x")</script>'


def _hostile_records() -> list[dict]:
    base = {"reference_question": f"ref {HOSTILE} & 'quotes'", "target": HOSTILE, "question": 'say "hi" <b>',
            "stage": "accepted", "reason": "accepted", "accepted": True, "rollouts": []}
    return [
        {**base, "accuracy": 0.5},
        {**base, "accuracy": HOSTILE},  # non-numeric accuracy: shown escaped, not binned
        {**base, "accuracy": True},
        {**base, "accuracy": [1, 2]},
        {"stage": ["odd"], "reason": {"x": 1}, "accepted": False},  # missing most keys, odd types
        {},
    ]


def test_non_numeric_accuracy_is_counted_not_a_crash(tmp_path):
    records, _ = load_run(_write_run(tmp_path / "run", _hostile_records()))
    summary = summarize(records)
    assert summary["accuracy_hist"] == {0.5: 1}
    assert summary["accuracy_invalid"] == 3
    assert summary["accepted"] == 4 and summary["candidates"] == 6
    assert summary["reason_counts"] == {'{"x": 1}': 1, "?": 1}
    assert summary["stage_counts"] == {"accepted": 4, '["odd"]': 1, "?": 1}
    text = format_summary(summary, [{"step": None, "reward": "oops", "acceptance": {"task": "NaN"}}], records)
    assert "(3 accepted tasks with a non-numeric accuracy)" in text
    assert "  None         -         -         -         -" in text


def test_html_report_escapes_every_cell_and_shows_the_reference(tmp_path):
    run = _write_run(tmp_path / "run", _hostile_records())
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward": {"solver": "bad"}}) + "\n"
                                       + json.dumps({"step": "x", "reward": {"solver": 0.5}}) + "\n")
    out = tmp_path / "r.html"
    data = run_data(run)
    write_page(out, run_page(data, data.records))
    page = out.read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page  # markupsafe's spelling of the quotes
    # The reference column holds each record's reference question (not None).
    assert "<td>ref &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#39;quotes&#39;</td>" in page
    candidates = page.split('<table class="cands">')[1].split("</table>")[0]
    rows = candidates.split("<tr>")[2:]  # after the header row
    assert len(rows) == 6
    assert rows[1].split("<td>")[6] == "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;</td>"  # accuracy cell
    assert rows[4].split("<td>")[2] == "-</td>"  # a record without reference_question


def test_bad_dump_structure_names_file_and_line(tmp_path):
    run = _write_run(tmp_path / "run", [_hostile_records()[0]])
    dump = run / "tasks" / "step_0.jsonl"
    with dump.open("a") as f:
        f.write(json.dumps({"rollouts": "not a list"}) + "\n" + json.dumps({"ok": 1}) + "\n")
    with pytest.raises(ValueError, match=r"step_0\.jsonl:2: 'rollouts' must be a list of objects"):
        load_run(run)
    dump.write_text(json.dumps([1, 2]) + "\n" + json.dumps({}) + "\n")
    with pytest.raises(ValueError, match=r"step_0\.jsonl:1: expected a JSON object, got list"):
        load_run(run)
    dump.write_text(json.dumps({"evidence_path": "p0"}) + "\n" + json.dumps({}) + "\n")
    with pytest.raises(ValueError, match=r"step_0\.jsonl:1: 'evidence_path' must be an object or null, got str"):
        load_run(run)
    dump.write_text(json.dumps({"rollouts": [{"ranker_calls": [3]}]}) + "\n" + json.dumps({}) + "\n")
    with pytest.raises(ValueError, match=r"step_0\.jsonl:1: 'rollouts\[0\]\.ranker_calls' must be a list of objects"):
        load_run(run)


def test_inspect_ends_with_the_done_report(tmp_path, capsys):
    from coevo.inspect import main

    run = _write_run(tmp_path / "run", new_records())
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    assert main([str(run), "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-5:] == [f"done: {run}", f"  tasks        1 step dumps in {run / 'tasks'} (step_0..step_0.jsonl)",
                        f"  metrics      1 steps in {run / 'metrics.jsonl'}", "  checkpoints  none",
                        f"  report       {tmp_path / 'r.html'} (self-contained HTML)"]
    assert main([str(run), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["candidates"] == 2  # stdout stays JSON; the report goes to stderr
    assert captured.err.startswith(f"done: {run}\n")


def test_a_dump_loads_as_written_with_its_step(tmp_path):
    loaded, _ = load_run(_write_run(tmp_path / "run", new_records()))
    assert loaded == [{**r, "step": 0} for r in new_records()]
    assert summarize(loaded)["mean_searches_solved"] == 1.0


def test_solver_group_shares_leave_guided_rollouts_out():
    from coevo.evaluate.series import group_shares

    rec = {"accepted": True, "rollouts": [{"correctness": 0.0}, {"correctness": 0.0},
                                          {"correctness": 1.0, "guided": True}]}  # correct by construction
    assert group_shares([rec]) == {"solver_groups": 1, "mixed_groups": 0.0, "all_correct_groups": 0.0,
                                   "all_wrong_groups": 1.0}
