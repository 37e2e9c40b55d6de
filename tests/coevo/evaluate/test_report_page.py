"""`coevo.inspect --html` and `--compare`: the pages parsed back, numbers against hand counts.

Hand-made run dirs (two steps, candidates stopping at every stage, accepted tasks with
rollouts and ranker calls): the funnel, reason codes, difficulty and hop tables must equal
the counts worked out by hand below; charts must hold each run's series; dump text must
come back as text (escaped), and nothing on a page may reference an external resource.
"""
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markupsafe import escape

from coevo.evaluate.report_page import compare_page, run_page
from coevo.evaluate.series import (
    RunData,
    accuracy_bins,
    extract_series,
    funnel,
    histogram,
    last_quarter,
    run_data,
    step_accuracies,
    step_funnels,
    step_hops,
    step_reasons,
)
from coevo.evaluate.svg import bar_chart, line_chart
from coevo.inspect import main

HOSTILE = '<script>alert("x")</script><img src=http://evil.example/x.png>'
VOID = {"meta", "br", "hr", "img", "input", "link", "source", "wbr", "col", "area", "base", "embed", "track"}


class Page(HTMLParser):
    """What the tests read of a page: tables by class (rows of cell texts), the titles of each
    chart's points and bars, every attribute, all text; and that every element is closed in order."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str, str]] = []
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.charts: dict[str, list[str]] = {}
        self.text: list[str] = []
        self._table = self._row = self._cell = self._chart = self._title = None
        self.feed(text)
        self.close()
        assert self.stack == [], f"unclosed elements {self.stack}"

    def table(self, cls: str, i: int = 0) -> list[list[str]]:
        return self.tables[cls][i]

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        a = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "table":
            assert self._table is None, "tables are not nested on these pages"
            self._table = []
            self.tables.setdefault(a.get("class") or "", []).append(self._table)
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "svg":
            self._chart = a.get("aria-label")
            self.charts.setdefault(self._chart, [])
        elif tag == "title" and self._chart is not None:
            self._title = []

    def handle_startendtag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()
        if tag in ("td", "th"):
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._table.append(self._row)
        elif tag == "table":
            self._table = None
        elif tag == "svg":
            self._chart = None
        elif tag == "title" and self._title is not None:
            self.charts[self._chart].append("".join(self._title))
            self._title = None

    def handle_data(self, data):
        self.text.append(data)
        for part in (self._cell, self._title):
            if part is not None:
                part.append(data)


def _hop(i: int) -> dict:
    return {"head": f"E{i}", "tail": f"E{i + 1}", "sentence": f"E{i} borders E{i + 1}.", "passage_id": f"p{i}",
            "title": f"Title {i}", "score": 1.0, "cue": "relation", "head_key": f"e{i}", "tail_key": f"e{i + 1}",
            "head_mention": f"E{i}", "tail_mention": f"E{i + 1}"}


def _path(hops: int) -> dict:
    return {"target": f"E{hops}", "hops": [_hop(i) for i in range(hops)],
            "evidence_ids": [f"p{i}" for i in range(hops)]}


def _ok(reason: str = "ok") -> dict:
    return {"ok": reason == "ok", "reason": reason, "evidence": [], "detail": ""}


def _call(turn: int, fmt_ok: bool) -> dict:
    return {"sub_query": f"query {turn}", "turn": turn, "mode": "trainable", "candidate_ids": ["p0", "p7", "p9"],
            "chosen_ids": ["p9", "p0"], "format_ok": fmt_ok, "reason": "ok" if fmt_ok else "parse:no_rerank_tag",
            "i_ans": True, "r_rel": 1.0, "reward": 2.0 if fmt_ok else -1.0, "group_id": "g", "output": "[3] > [1]"}


def _rollout(i: int, correct: float, calls: list) -> dict:
    return {"rollout_idx": i, "transcript": f"<search>query</search> rollout {i}", "answer": "E2",
            "format_ok": True, "end_reason": "answer", "correctness": correct, "n_searches": len(calls),
            "sub_queries": [c["sub_query"] for c in calls], "reward": correct - 0.1 * len(calls),
            "n_generated": 30, "ranker_calls": calls}


def _cand(stage: str, reason: str, hops: int = 0, rollouts=(), question="What borders E0?", target="E2") -> dict:
    """A candidate that stopped at `stage` (target parse, target check, path, question parse, question check)."""
    reached = ["parse", "target", "path", "question", "qcheck", "accepted"].index(stage)
    rec = {"task_id": None, "reference_question": "who wrote hamlet", "reference_index": 0, "candidate": 0,
           "target_output": "x", "target": target if reached >= 1 else None,
           "target_verdict": _ok("ok" if reached >= 2 else reason), "paths_found": 1 if reached >= 3 else 0,
           "evidence_path": _path(hops) if reached >= 3 else None, "question_output": None,
           "question": question if reached >= 4 else None,
           "question_verdict": _ok("ok" if reached >= 5 else (reason if reached == 4 else "pending")),
           "stage": "accepted", "reason": "accepted" if reached == 5 else reason, "accepted": reached == 5,
           "accuracy": None, "proposer_reward": -0.5, "rollouts": list(rollouts), "timings_s": {}}
    if reached == 5:
        rec["accuracy"] = sum(r["correctness"] for r in rollouts) / len(rollouts)
        rec["task_id"] = f"task-{hops}-{rec['accuracy']}"
    return rec


DUMPS = {
    0: [_cand("parse", "parse:no_target_tag"), _cand("target", "not_entity"), _cand("path", "no_certified_path"),
        _cand("question", "parse:no_question_tag", hops=2), _cand("qcheck", "leaks_target", hops=1),
        _cand("accepted", "", hops=2, rollouts=[_rollout(0, 1.0, [_call(0, True)]),
                                                 _rollout(1, 0.0, [_call(0, False), _call(1, True)])])],
    1: [_cand("accepted", "", hops=1, rollouts=[_rollout(0, 1.0, []), _rollout(1, 1.0, [])]),
        _cand("accepted", "", hops=3, rollouts=[_rollout(0, 0.0, []), _rollout(1, 0.0, [])]),
        _cand("target", "not_entity")],
}
# Worked out by hand from DUMPS: candidates, parsed target, valid target, path, parsed question, accepted.
FUNNEL_0, FUNNEL_1 = [6, 5, 4, 3, 2, 1], [3, 3, 2, 2, 2, 2]


def _metrics(step: int, acc: float, fmt: float, proposer: float) -> dict:
    return {"step": step, "candidates": 4, "accepted": 1, "acceptance": {"target": 0.5, "path": 0.5, "task": acc},
            "reasons": {}, "solver": {"mean_searches": 1.0, "format_valid": fmt, "accuracy": 0.5},
            "reward": {"proposer": proposer, "solver": 0.25, "ranker": 1.0},
            "ranker": {"calls": 3, "format_valid": 0.5, "i_ans": 1.0, "hit@1": 0.25, "hit@3": 0.75},
            "update": {"ranker": {"n_seqs": 3}}, "time_s": {"solve": 1.0}}


def write_run(run_dir: Path, dumps: dict, metrics: list[dict]) -> Path:
    (run_dir / "tasks").mkdir(parents=True)
    for step, records in dumps.items():
        (run_dir / "tasks" / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run_dir


@pytest.fixture
def trained(tmp_path) -> Path:
    return write_run(tmp_path / "trained", DUMPS, [_metrics(0, 0.125, 0.5, -0.25), _metrics(1, 0.625, 0.875, 0.5)])


@pytest.fixture
def control(tmp_path) -> Path:
    dumps = {0: DUMPS[0][:3], 1: DUMPS[1][2:]}
    return write_run(tmp_path / "control", dumps, [_metrics(0, 0.0, 0.25, -0.5), _metrics(1, 0.0, 0.125, -0.5)])


def _self_contained(page: Page, raw: str) -> None:
    """No script, no element that loads anything, no link leaving the page, no URL anywhere."""
    assert not {"script", "img", "link", "iframe", "object", "embed", "image", "use", "base"} & page.tags
    assert not [(t, k) for t, k, _ in page.attrs if k in ("src", "srcset", "action", "data") or k.startswith("on")]
    assert all(v.startswith("#") for _, k, v in page.attrs if k in ("href", "xlink:href"))
    assert "://" not in raw and "url(" not in raw and "@import" not in raw


def test_funnel_by_hand():
    assert [*funnel(DUMPS[0]).values()] == FUNNEL_0
    assert [*funnel(DUMPS[1]).values()] == FUNNEL_1


def test_last_quarter_means_the_last_ceil_n_over_4_steps():
    assert last_quarter([0, 0, 0, 0, 0, 0, 1.0, None]) == 1.0  # 2 steps, one without a number
    assert last_quarter([1, 2, 3, 4, 5]) == 4.5  # ceil(5 / 4) = 2 steps
    assert last_quarter([0.25]) == 0.25
    assert last_quarter([]) is None and last_quarter([1.0, None]) is None and last_quarter(["x"]) is None


def test_difficulty_bins_are_exact_for_em_and_tenths_for_f1():
    assert accuracy_bins([0.5, 0.5, 1 / 3]) == ["0.33", "0.50"]
    assert histogram([0.5, 0.5, 1 / 3], ["0.33", "0.50"]) == [1, 2]
    f1 = [0.05, 0.15, 0.31, 0.33, 0.37, 0.41, 0.52, 0.63, 0.71, 0.84, 0.95, 1.0]  # 12 distinct values
    bins = accuracy_bins(f1)
    assert bins[0] == "0.0\u20130.1" and bins[-1] == "0.9\u20131.0" and len(bins) == 10
    assert histogram(f1, bins) == [1, 1, 0, 3, 1, 1, 1, 1, 1, 2]


def test_charts_leave_gaps_and_say_when_empty():
    svg = line_chart("t", [("a", [0, 1, 2, 3], [1.0, None, 2.0, 3.0])])
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 3  # step 0 alone, then steps 2-3 joined
    chart = Page(svg).charts["t"]
    assert chart == ["a step 0: 1", "a step 2: 2", "a step 3: 3"]
    assert "no data (null every step)" in line_chart("t", [("a", [0, 1], [None, "x"])])
    bars = Page(bar_chart("b", ["x", "y"], [("r1", [2, 0]), ("r2", [1, None])])).charts["b"]
    assert bars == ["r1 x: 2", "r2 x: 1", "r1 y: 0", "r2 y: -"]


def _render(argv: list[str], out: Path) -> tuple[Page, str]:
    assert main([*argv, "--html", str(out)]) == 0
    raw = out.read_text(encoding="utf-8")
    return Page(raw), raw


def test_run_page_numbers_equal_hand_counts(trained, tmp_path):
    page, raw = _render([str(trained)], tmp_path / "run.html")
    _self_contained(page, raw)
    assert [row[1] for row in page.table("funnel")[1:]] == ["9", "8", "6", "5", "4", "3"]
    assert page.table("funnel")[6][2:] == ["33.3%", "75.0%"]  # accepted: 3/9 of candidates, 3/4 parsed questions
    assert page.table("step-funnel")[1:] == [["0", *map(str, FUNNEL_0)], ["1", *map(str, FUNNEL_1)]]
    assert page.table("reasons") == [
        ["step", "not_entity", "leaks_target", "no_certified_path", "parse:no_question_tag", "parse:no_target_tag",
         "total"], ["0", "1", "1", "1", "1", "1", "5"], ["1", "1", "0", "0", "0", "0", "1"]]
    # accepted tasks: step 0 accuracy 1/2 with 2 hops; step 1 accuracy 1 (1 hop) and 0 (3 hops)
    assert page.table("difficulty") == [["step", "0.00", "0.50", "1.00", "total"], ["0", "0", "1", "0", "1"],
                                        ["1", "1", "0", "1", "2"]]
    assert page.table("hops") == [["step", "1", "2", "3", "total"], ["0", "0", "1", "0", "1"],
                                  ["1", "1", "0", "1", "2"]]
    assert sorted(page.charts["solver accuracy per accepted task (tasks)"]) == \
        ["trained 0.00: 1", "trained 0.50: 1", "trained 1.00: 1"]
    assert {"proposer step 0: -0.250", "proposer step 1: 0.500", "ranker step 1: 1"} <= \
        set(page.charts["mean reward"])
    assert {"solver step 1: 0.875", "ranker step 0: 0.500"} <= set(page.charts["format validity"])
    assert {"Hit@1 step 0: 0.250", "Hit@K step 1: 0.750"} <= set(page.charts["ranker Hit@k"])
    per_step = page.table("per-step")
    assert per_step[0][:8] == ["step", "candidates", "parsed target", "valid target", "evidence path",
                               "parsed question", "accepted", "proposer reward"]
    assert per_step[2][:8] == ["1", *map(str, FUNNEL_1), "0.500"]


def test_run_page_task_view_shows_path_rollouts_and_ranker_calls(trained, tmp_path):
    page, raw = _render([str(trained)], tmp_path / "run.html")
    paths = page.tables["path"]
    assert [len(t) - 1 for t in paths] == [2, 1, 3]  # hops of the three accepted tasks, in dump order
    assert paths[0][1] == ["1", "E0 \u2192 E1", "E0 / E1", "E0 borders E1.", "Title 0", "p0", "relation", "1"]
    calls = page.tables["calls"]  # only the first task's rollouts searched: one call, then two
    assert [len(t) - 1 for t in calls] == [1, 2]
    assert calls[1][1][:6] == ["0", "query 0", "p0, p7, p9", "p9, p0", "False", "parse:no_rerank_tag"]
    assert calls[1][2][8] == "2"  # reward of a well-formed call
    text = "".join(page.text)
    assert "<search>query</search> rollout 1" in text and "&lt;search&gt;query" in raw
    assert "rollout 1: answer E2 · correctness 0 · reward -0.200 · searches 2" in text
    assert text.count("ranker calls") == 6  # every rollout of the three tasks


def test_compare_page_holds_every_run(trained, control, tmp_path, capsys):
    page, raw = _render(["--compare", str(trained), str(control)], tmp_path / "cmp.html")
    _self_contained(page, raw)
    assert {"trained step 0: 0.125", "trained step 1: 0.625", "control step 0: 0", "control step 1: 0"} <= \
        set(page.charts["task acceptance"])
    assert {"trained step 1: 0.875", "control step 1: 0.125"} <= set(page.charts["solver format-valid"])
    quarter = {row[0]: row[1:] for row in page.table("quarter")}
    assert quarter["series (mean over the last quarter of steps)"] == ["trained", "control"]
    assert quarter["steps"] == ["2", "2"]
    assert quarter["task acceptance"] == ["0.625", "0"]  # 2 steps: the last quarter is the last step
    assert quarter["proposer reward"] == ["0.500", "-0.500"]
    assert quarter["sequences in ranker update"] == ["3", "3"]
    # control dumps: step 0 = the first three candidates of DUMPS[0], step 1 = one rejected target
    assert [row[1] for row in page.tables["funnel"][0][1:]] == ["9", "8", "6", "5", "4", "3"]
    assert [row[1] for row in page.tables["funnel"][1][1:]] == ["4", "3", "1", "0", "0", "0"]
    assert sorted(page.charts["acceptance funnel (share of candidates)"])[:2] == \
        ["control accepted: 0", "control candidates: 1"]
    out = capsys.readouterr().out
    assert "task acceptance" in out and "0.625" in out
    assert main(["--compare", str(trained), str(control), "--json", "--label", "T", "--label", "C"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[0])
    assert summary["T"]["last_quarter"]["solver format-valid"] == 0.875
    assert summary["C"]["funnel"] == {"candidates": 4, "parsed_target": 3, "valid_target": 1, "path": 0,
                                      "parsed_question": 0, "accepted": 0}


def _hostile_dumps() -> dict:
    call = {**_call(0, True), "sub_query": HOSTILE, "output": HOSTILE, "chosen_ids": [HOSTILE]}
    task = _cand("accepted", "", hops=1, rollouts=[{**_rollout(0, 1.0, [call]), "transcript": HOSTILE}],
                 question=HOSTILE, target=HOSTILE)
    task["evidence_path"]["hops"][0].update(sentence=HOSTILE, title=HOSTILE)
    return {0: [task, _cand("target", HOSTILE)]}


def test_hostile_strings_come_back_as_text(tmp_path):
    runs = [write_run(tmp_path / f"{HOSTILE[:8]}{i}", _hostile_dumps(), [_metrics(0, 0.5, 0.5, 0.0)])
            for i in range(2)]
    for argv in ([str(runs[0])], ["--compare", *map(str, runs), "--label", HOSTILE, "--label", "b"]):
        page, raw = _render(argv, tmp_path / "h.html")
        assert not {"script", "img"} & page.tags and "<script" not in raw
        assert not [a for a in page.attrs if a[1] in ("src", "onerror")]
        assert HOSTILE in "".join(page.text)
    assert "".join(Page(run_page(run_data(runs[0]), run_data(runs[0]).records)).text).count(HOSTILE) >= 8


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(max_size=20), min_size=4, max_size=4), st.lists(st.none() | st.booleans() | st.integers()
       | st.floats(allow_nan=True) | st.text(max_size=5), min_size=3, max_size=3))
def test_any_dump_text_renders_as_well_formed_text(texts, leaves):
    """Property: whatever text or leaf value a dump holds, both pages parse and show the text."""
    target, question, transcript, reason = texts
    task = _cand("accepted", "", hops=1, rollouts=[{**_rollout(0, 1.0, []), "transcript": transcript}],
                 question=question, target=target)
    task.update(accuracy=leaves[0], accepted=True)
    task["rollouts"][0].update(correctness=leaves[1], reward=leaves[2])
    bad = {**_cand("target", reason), "accuracy": leaves[0]}
    records = [{**task, "step": 0}, {**bad, "step": 1}]
    run = RunData("r", Path("r"), records, [], extract_series([], records), step_funnels(records),
                  step_reasons(records), step_accuracies(records), step_hops(records))
    text = "".join(Page(run_page(run, records)).text)
    assert all(t in text for t in texts if t.strip())
    Page(compare_page([run, run]))


FIELDS = ("reference_question", "target", "question", "answer", "transcript", "sub_query", "output", "sentence",
          "reason", "label")
MARKUP = ["<script>alert(1)</script>", "</pre></td>", "\"><b x='", "&amp;", "<!--"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=30), st.sampled_from(MARKUP))
def test_text_in_any_report_field_reaches_the_page_escaped(text, markup):
    """Property: text put into a report field (question, answer, model output, label, ...) shows up on
    both pages only escaped. Each field's value opens with its own `<probeN>` element: none of them
    may parse as an element, the escaped value must be in the HTML, and the value must read back as text."""
    value = {field: f"<probe{i}>{markup}{text}" for i, field in enumerate(FIELDS)}
    call = {**_call(0, True), "sub_query": value["sub_query"], "output": value["output"]}
    rollout = {**_rollout(0, 1.0, [call]), "answer": value["answer"], "transcript": value["transcript"]}
    task = _cand("accepted", "", hops=1, rollouts=[rollout], question=value["question"], target=value["target"])
    task["evidence_path"]["hops"][0]["sentence"] = value["sentence"]
    rejected = _cand("target", value["reason"])
    records = [{**r, "reference_question": value["reference_question"], "step": 0} for r in (task, rejected)]
    run = RunData(value["label"], Path("r"), records, [], extract_series([], records), step_funnels(records),
                  step_reasons(records), step_accuracies(records), step_hops(records))
    for html_text, fields in ((run_page(run, records), FIELDS), (compare_page([run, run]), ("reason", "label"))):
        raw = str(html_text)
        page = Page(raw)
        assert not [t for t in page.tags if t.startswith("probe")] and "script" not in page.tags
        assert "<probe" not in raw and "<script" not in raw
        for field in fields:
            assert str(escape(value[field])) in raw, field
            assert value[field] in "".join(page.text), field


def test_cli_needs_one_run_or_a_comparison(trained, control, capsys):
    cases = [([], "give one run directory"), (["--compare", str(trained)], "needs two or more"),
             ([str(trained), "--compare", str(trained), str(control)], "give one run directory"),
             (["--compare", str(trained), str(control), "--label", "x"], "--label given 1 times for 2")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
