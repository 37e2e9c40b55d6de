"""`python -m coevo.eval`: hand-checked aggregation, answer extraction, config errors, stamps,
every mode end to end with tiny random models, result round trip and --compare."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.core.config import compose
from coevo.core.inputs import load_labelled_questions
from coevo.core.types import Completion
from coevo.eval import main
from coevo.evaluate.harness import (
    EvalStack,
    _observed,
    run_eval,
    select_questions,
    single_turn_messages,
    to_eval_object,
)
from coevo.evaluate.metrics import (
    aggregate,
    extract_answer,
    format_table,
    load_result,
    prediction_record,
    search_record,
)
from evidence.corpus import Corpus, Passage
from evidence.retrieval import Hit
from solver.ranker import Ranker, RankerCall
from solver.search_tool import SearchTool

REPO = Path(__file__).resolve().parents[3]


# ---- aggregation by hand ---------------------------------------------------------------------

def compose_eval(overrides=()):
    """`configs/eval.yaml` + overrides, typed and validated."""
    return to_eval_object(compose(list(overrides), config_name="eval"))


def _search(shown, observed=True, format_ok=True):
    call = RankerCall(q0="q0", sub_query="q", task_id="t", rollout_idx=0, turn=0, mode="frozen",
                      candidate_ids=shown + ["c9"], chosen_ids=shown, format_ok=format_ok, reason="ok", i_ans=False,
                      relevant=[False] * (len(shown) + 1))
    return search_record(call, observed)


def toy_records():
    """6 questions, 2 datasets; comments give each question's EM / F1 / cover-EM."""
    alpha = [
        # EM 1, F1 1, cover 1; 1 search showing the gold passage first: recall 1, hit@1 1, hit@3 1
        ("a1", ["Paris"], "Paris", True, [_search(["g1", "x", "y"])], ["g1"]),
        # EM 0, F1 2/3 (P 1, R 1/2), cover 0; 2 searches, the 2nd never read (token budget):
        # recall 1/2 (g2 of g2,g3); hit@1 0 then 1, hit@3 1 and 1
        ("a2", ["Barack Obama"], "Obama", True, [_search(["x", "g2", "y"]), _search(["g3", "z", "w"], False)],
         ["g2", "g3"]),
        # EM 0, F1 1/2 (P 1/3, R 1), cover 1 ("beatles" in "beatles were band"); no search: recall 0
        ("a3", ["the Beatles"], "Beatles were a band", True, [], ["g4"]),
        # format failure: 0 / 0 / 0; 3 searches, no gold among their candidates (no say in hit@k), one malformed
        ("a4", ["42"], "", False, [_search(["x", "y", "z"]), _search(["x", "y", "z"], format_ok=False),
                                   _search(["x", "y", "z"])], ["g5"]),
    ]
    beta = [  # no gold ids: no retrieval metrics
        ("b1", ["1984"], "1984", True, [_search(["p"])], None),  # 1 / 1 / 1
        ("b2", ["George Orwell", "Eric Blair"], "Orwell, George", True, [_search(["p"])], None),  # 0 / 1 / 0
    ]
    rows = [("alpha", *a) for a in alpha] + [("beta", *b) for b in beta]
    return [prediction_record(qid, ds, f"question {qid}?", answers, pred, ok, "answer" if ok else "no_action",
                              pred, searches, gold)
            for ds, qid, answers, pred, ok, searches, gold in rows]


def test_aggregation_by_hand():
    m = aggregate(toy_records(), top_k=3, mode="agent")
    assert list(m) == ["alpha", "beta", "average"]
    a, b, avg = m["alpha"], m["beta"], m["average"]
    assert a == {"n": 4, "em": 0.25, "f1": round((1 + 2 / 3 + 1 / 2 + 0) / 4, 4), "cover_em": 0.5,
                 "format_failure": 0.25, "mean_searches": 1.5, "search_hist": {"0": 1, "1": 1, "2": 1, "3": 1},
                 "recall@3": 0.375, "ranker_calls": 6, "hit@1": round(2 / 3, 4), "hit@3": 1.0,
                 "ranker_format_failure": round(1 / 6, 4)}
    assert b == {"n": 2, "em": 0.5, "f1": 1.0, "cover_em": 0.5, "format_failure": 0.0, "mean_searches": 1.0,
                 "search_hist": {"1": 2}}
    # macro average: each dataset weighs 1/2; retrieval numbers come from alpha alone
    assert avg["n"] == 6 and avg["datasets"] == 2
    assert avg["em"] == 0.375 and avg["cover_em"] == 0.5 and avg["format_failure"] == 0.125
    assert avg["f1"] == round(((1 + 2 / 3 + 1 / 2) / 4 + 1.0) / 2, 4) == 0.7708
    assert avg["mean_searches"] == 1.25 and avg["search_hist"] == {"0": 1, "1": 3, "2": 1, "3": 1}
    assert (avg["recall@3"], avg["hit@1"], avg["hit@3"], avg["ranker_calls"]) == (0.375, 0.6667, 1.0, 6)


def test_direct_mode_has_no_retrieval_metrics_and_table_shows_average():
    m = aggregate(toy_records(), top_k=None, mode="direct")
    assert "recall@3" not in m["alpha"] and "hit@1" not in m["average"]
    table = format_table(aggregate(toy_records(), 3, "agent"), "title")
    lines = table.splitlines()
    assert lines[0] == "title" and lines[-1].split()[:4] == ["average", "6", "37.5", "77.1"]
    assert "recall@3" in lines[1] and "hit@3" in lines[1]


# ---- untrusted model output -------------------------------------------------------------------

@pytest.mark.parametrize("text,empty,raw", [
    ("<answer>Paris</answer>", ("Paris", "answer"), ("Paris", "answer")),
    ("<think>hm</think> <answer> New  York </answer>\n", ("New York", "answer"), ("New York", "answer")),
    ("Paris is the capital.", ("", "no_action"), ("Paris is the capital.", "no_action")),
    ("<search>capital</search>", ("", "search_without_tool"), ("capital", "search_without_tool")),
    ("<answer>a</answer> and more", ("", "text_after_answer"), ("a and more", "text_after_answer")),
    ("<answer>Paris", ("", "unclosed_tag"), ("Paris", "unclosed_tag")),
    ("<answer></answer>", ("", "empty_answer"), ("", "empty_answer")),
])
def test_extract_answer(text, empty, raw):
    assert extract_answer(text) == empty
    assert extract_answer(text, "raw") == raw


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_extract_answer_survives_any_text(text):
    for untagged in ("empty", "raw"):
        prediction, reason = extract_answer(text, untagged)
        assert isinstance(prediction, str) and isinstance(reason, str)


def test_prompts_ask_for_the_answer_tag():
    direct = single_turn_messages("Who?")
    assert "<answer>" in direct[0]["content"] and "Documents" not in direct[1]["content"]
    rag = single_turn_messages("Who?", [Passage("p", "T", "some text")])
    assert rag[1]["content"].startswith("Documents:\nDoc 1 (Title: T) some text")


# ---- questions and config ---------------------------------------------------------------------

def load_questions(path, limit=None):
    """What `run_eval` reads: the shared loader, then the first `limit` of each dataset."""
    return select_questions(load_labelled_questions(path)[0], limit)


def test_load_questions_limit_per_dataset_and_errors(tmp_path):
    path = tmp_path / "qs.jsonl"
    recs = [{"id": f"x{i}", "dataset": "x", "question": f"q{i}?", "answers": ["a"]} for i in range(3)]
    recs += [{"question": "untagged?", "answer": "b", "gold_ids": ["p1"]}]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    qs = load_questions(path, limit=2)
    assert [(q.task.id, q.dataset) for q in qs] == [("x0", "x"), ("x1", "x"), ("qs-4", "qs")]
    assert qs[-1].task.answers == ["b"] and qs[-1].task.evidence_ids == ["p1"]
    path.write_text(json.dumps(recs[0]) + "\n" + json.dumps(recs[0]) + "\n")
    with pytest.raises(ValueError, match=r"qs.jsonl:2: duplicate question id 'x0'"):
        load_questions(path)
    path.write_text(json.dumps({"question": "q", "answers": []}) + "\n")
    with pytest.raises(ValueError, match=r"qs.jsonl:1: 'answers'"):
        load_questions(path)


@pytest.mark.parametrize("bad,message", [
    ({"question": "q", "answers": 123}, r"'answers' must be a non-empty list of strings"),
    ({"question": "q", "answers": ["a"], "gold_ids": "p1"}, r"'gold_ids' must be a list of passage ids, got str"),
    ({"id": None, "question": "q", "answers": ["a"]}, r"'id' must be a string or an integer, got null"),
    ({"id": "x0", "question": "q", "answers": ["a"]}, r"duplicate question id 'x0' \(first at line 1\)"),
    ({"question": ["q"], "answers": ["a"]}, r"'question' must be a non-empty string"),
])
def test_solve_and_eval_read_questions_with_one_loader(tmp_path, bad, message):
    from coevo.orchestrate.solve_loop import load_tasks

    path = tmp_path / "qs.jsonl"
    good = [{"id": "x0", "question": "q0?", "answers": ["a"], "gold_ids": ["p1", 2]},
            {"question": "q1?", "answer": "b"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in good))
    tasks = load_tasks(path)
    assert [(q.task.id, q.task.question, q.task.answers, q.task.evidence_ids) for q in load_questions(path)] == \
        [(t.id, t.question, t.answers, t.evidence_ids) for t in tasks] == \
        [("x0", "q0?", ["a"], ["p1", "2"]), ("qs-2", "q1?", ["b"], [])]
    path.write_text("".join(json.dumps(r) + "\n" for r in good + [bad]))
    errors = []
    for load in (load_tasks, load_questions):
        with pytest.raises(ValueError, match=r"qs\.jsonl:3: " + message) as e:
            load(path)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_overrides_and_errors_name_the_key_and_choices(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "q?", "answers": ["a"]}) + "\n")
    cfg = compose_eval([f"data={data}", "mode=rag", f"out={tmp_path / 'r.json'}", "limit=3", "batch_size=2"])
    assert (cfg.mode, cfg.limit, cfg.batch_size, cfg.greedy, cfg.ranker.mode) == ("rag", 3, 2, True, "none")
    assert cfg.out == str(tmp_path / "r.json") and cfg.corpus.name == "wiki_mini"
    with pytest.raises(ValueError, match=r"'dat'.*expected one of \[.*'data'.*'mode'"):
        compose_eval(["dat=x"])
    with pytest.raises(ValueError, match=r"'solver.nope'.*'max_searches'"):
        compose_eval(["solver.nope=1"])
    with pytest.raises(ValueError, match=r"(?s)'agnet', expected one of \[direct, rag, agent\].*full_key: mode"):
        compose_eval([f"data={data}", "mode=agnet"])
    with pytest.raises(ValueError, match=r"(?s)'x', expected one of \[empty, raw\].*full_key: untagged"):
        compose_eval([f"data={data}", "untagged=x"])
    with pytest.raises(ValueError, match=r"ranker.checkpoint.*ranker.mode=none"):
        compose_eval([f"data={data}", "ranker.checkpoint=/x"])
    with pytest.raises(FileNotFoundError, match="data="):
        compose_eval([f"data={tmp_path / 'missing.jsonl'}"])


# ---- a scripted solver: exact retrieval metrics in agent mode ---------------------------------

class CharTokenizer:
    eos_token = "<eos>"

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


class ScriptedSolver:
    """Searches the question's first word once, then answers with Doc 1's title; `mumble` never tags."""

    tokenizer = CharTokenizer()

    def chat_prompt_ids(self, messages):
        return self.tokenizer.encode("".join(m["content"] for m in messages))

    def sampling_from_config(self, greedy=False, **overrides):
        from coevo.core.types import SamplingParams

        return SamplingParams(temperature=0.0, max_new_tokens=200, **overrides)

    def generate(self, prompts, sampling):
        out = []
        for ids in prompts:
            episode = self.tokenizer.decode(ids).rsplit("Question: ", 1)[1]  # after the system prompt
            if "mumble" in episode:
                text = "it is probably Paris"
            elif "<information>" not in episode:
                text = f"<search>{episode.split()[0]}</search>"
            else:
                text = "<answer>" + episode.rsplit("Doc 1 (Title: ", 1)[1].split(")")[0] + "</answer>"
            out.append([Completion(list(ids), self.tokenizer.encode(text), text)])
        return out


class ExactWordRetriever:
    def __init__(self, corpus):
        self.corpus = corpus

    def search(self, queries, k):
        return [[Hit(p.id, 1.0) for p in self.corpus if q.lower() in p.text.lower()][:k] for q in queries]


def test_agent_mode_records_with_a_scripted_solver(tmp_path):
    corpus = Corpus([Passage("p1", "Paris", "Paris is in France."), Passage("p2", "Lyon", "Lyon is in France."),
                     Passage("p3", "Rome", "Rome is in Italy.")], name="toy")
    data = tmp_path / "q.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"id": "f", "dataset": "geo", "question": "France capital?", "answers": ["Paris"], "gold_ids": ["p1"]},
        {"id": "i", "dataset": "geo", "question": "Italy capital?", "answers": ["Rome"], "gold_ids": ["p3", "p9"]},
        {"id": "m", "dataset": "geo", "question": "mumble capital?", "answers": ["Paris"], "gold_ids": ["p1"]},
    ]) + "\n")
    cfg = compose_eval([f"data={data}", "mode=agent", f"out={tmp_path / 'r.json'}", "ranker.mode=none",
                        "ranker.n_candidates=2", "ranker.top_k=2", "untagged=raw"])
    tool = SearchTool(ExactWordRetriever(corpus), Ranker(cfg.ranker), cfg.ranker)
    result = run_eval(cfg, EvalStack(ScriptedSolver(), tool, corpus))
    f, i, m = result["predictions"]
    assert (f["prediction"], f["em"], f["n_searches"]) == ("Paris", 1.0, 1)
    assert f["retrievals"][0]["chosen_ids"] == ["p1", "p2"]
    assert set(f["retrievals"][0]) == {"sub_query", "candidate_ids", "chosen_ids", "format_ok", "observed"}
    assert (i["prediction"], i["em"]) == ("Rome", 1.0)
    # untagged=raw: the mumbled turn is the prediction, still a format failure
    assert (m["prediction"], m["format_ok"], m["cover_em"], m["n_searches"]) == ("it is probably Paris", False, 1.0, 0)
    geo = result["metrics"]["geo"]
    assert geo["recall@2"] == round((1 + 0.5 + 0) / 3, 4) and geo["hit@1"] == 1.0 and geo["ranker_calls"] == 2
    assert geo["format_failure"] == round(1 / 3, 4) and geo["em"] == round(2 / 3, 4)


def test_documents_cut_by_the_token_budget_are_not_observed():
    class Call:
        def __init__(self, turn):
            self.turn = turn

    class Ep:
        ranker_calls = [Call(0), Call(1)]
        end_reason, n_turns = "token_budget", 2

    assert [_observed(Ep, 0), _observed(Ep, 1)] == [True, False]
    Ep.n_turns = 3  # the budget ran out while generating turn 2: both searches were read
    assert [_observed(Ep, 0), _observed(Ep, 1)] == [True, True]


# ---- every mode end to end with tiny random models -------------------------------------------

@pytest.fixture(scope="module")
def small_eval_data(shared_data, tmp_path_factory):
    """Five shared dev questions (3 popqa, 2 hotpotqa) and a corpus of their gold passages + fillers."""
    root = tmp_path_factory.mktemp("eval_data")
    picked, per = [], {}
    with open(shared_data / "wiki_mini" / "questions_dev.jsonl", encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if per.get(rec["dataset"], 0) < {"popqa": 3, "hotpotqa": 2}.get(rec["dataset"], 0):
                per[rec["dataset"]] = per.get(rec["dataset"], 0) + 1
                picked.append(rec)
    gold = {g for r in picked for g in r["gold_ids"]}
    questions, corpus = root / "questions.jsonl", root / "corpus.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in picked))
    with gzip.open(shared_data / "wiki_mini" / "corpus.jsonl.gz", "rt", encoding="utf-8") as f, \
            open(corpus, "w", encoding="utf-8") as out:
        for n, line in enumerate(f):
            if json.loads(line)["id"] in gold or n % 1000 == 0:
                out.write(line)
    return {"questions": questions, "corpus": corpus, "index": root / "index"}


def _tiny_overrides(data, out, mode, *extra):
    return ["solver=tiny-random", "ranker=tiny-random", f"data={data['questions']}", f"mode={mode}", f"out={out}",
            "corpus=jsonl", f"corpus.path={data['corpus']}", f"retrieval.cache_dir={data['index']}",
            "batch_size=3", *extra]


@pytest.mark.parametrize("mode,ranker_mode", [("direct", "none"), ("rag", "frozen"), ("agent", "none"),
                                              ("agent", "oracle")])
def test_mode_end_to_end_with_stamps_and_round_trip(small_eval_data, tmp_path, mode, ranker_mode):
    out = tmp_path / f"{mode}.json"
    cfg = compose_eval(_tiny_overrides(small_eval_data, out, mode, f"ranker.mode={ranker_mode}"))
    result = run_eval(cfg)
    loaded = load_result(out)
    assert loaded == json.loads(json.dumps(result))
    stamp = loaded["stamp"]
    assert stamp["data_sha256"] == hashlib.sha256(small_eval_data["questions"].read_bytes()).hexdigest()
    assert (stamp["mode"], stamp["solver_model"], stamp["questions"], stamp["greedy"]) == (mode, "tiny-random", 5, True)
    for key in ("solver_checkpoint", "git_commit", "timestamp", "corpus", "corpus_hash", "retriever", "N", "K"):
        assert key in stamp
    if mode == "direct":
        assert stamp["corpus"] is None and stamp["ranker_mode"] is None
    else:
        assert (stamp["corpus"], stamp["retriever"], stamp["N"], stamp["K"]) == ("corpus", "bm25s", 10, 3)
        assert stamp["ranker_mode"] == ranker_mode and len(stamp["corpus_hash"]) == 64
        assert (stamp["ranker_model"] == "tiny-random") == (ranker_mode == "frozen")
    metrics = loaded["metrics"]
    assert list(metrics) == ["popqa", "hotpotqa", "average"] and metrics["average"]["n"] == 5
    for key in ("em", "f1", "cover_em", "mean_searches", "format_failure", "search_hist"):
        assert key in metrics["average"]
    assert ("recall@3" in metrics["average"]) == (mode != "direct")
    assert aggregate(loaded["predictions"], stamp["K"], stamp["mode"]) == metrics  # round trip
    file_ids = [json.loads(line)["id"] for line in small_eval_data["questions"].read_text().splitlines()]
    assert [p["id"] for p in loaded["predictions"]] == file_ids  # file order despite length-sorted batches
    for p in loaded["predictions"]:
        assert {"id", "dataset", "question", "answers", "prediction", "em", "f1", "cover_em", "n_searches"} <= set(p)
        assert p["n_searches"] == {"direct": 0, "rag": 1}.get(mode, p["n_searches"])
    if mode == "rag":  # the frozen tiny ranker ran (and, being random, fell back to first-stage order)
        assert all(p["retrievals"][0]["sub_query"] == p["question"] for p in loaded["predictions"])


def test_compare_prints_both_results_and_deltas(tmp_path, capsys):
    a = {"stamp": {"mode": "direct", "solver_model": "m", "data": "/d/dev.jsonl", "data_sha256": "ab" * 32,
                   "ranker_mode": None}, "predictions": [],
         "metrics": {"nq": {"n": 2, "em": 0.25, "f1": 0.5, "cover_em": 0.5, "mean_searches": 0.0},
                     "average": {"n": 2, "em": 0.25, "f1": 0.5, "cover_em": 0.5, "mean_searches": 0.0}}}
    b = json.loads(json.dumps(a))
    b["stamp"].update(mode="agent", ranker_mode="none", corpus="wiki_mini", N=10, K=3)
    b["metrics"]["nq"].update(em=0.5, mean_searches=1.5)
    b["metrics"]["average"].update(em=0.5, mean_searches=1.5)
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    out = capsys.readouterr().out
    assert "mode: direct -> agent" in out and "WARNING" not in out
    nq = next(line for line in out.splitlines() if line.startswith("nq"))
    assert nq.split()[:5] == ["nq", "2/2", "25.0", "50.0", "+25.0"] and nq.split()[-3:] == ["0.00", "1.50", "+1.50"]


def test_compare_of_a_missing_or_foreign_file_is_one_error_line(tmp_path, capsys):
    (tmp_path / "x.json").write_text("{}")
    for name, why in (("nope.json", "No such file or directory"), ("x.json", "x.json is not a coevo.eval result")):
        with pytest.raises(SystemExit) as stop:
            main(["--compare", str(tmp_path / name), str(tmp_path / name)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith("coevo.eval: error: --compare: ") and why in err
        assert len(err.splitlines()) == 1


def test_cli_runs_and_rejects_unknown_keys(small_eval_data, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    bad = subprocess.run([sys.executable, "-m", "coevo.eval", "dat=x"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "'dat'" in bad.stderr and "'data'" in bad.stderr
    out = tmp_path / "cli.json"
    ok = subprocess.run([sys.executable, "-m", "coevo.eval", *_tiny_overrides(small_eval_data, out, "direct"),
                         "limit=1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "average" in ok.stdout
    assert ok.stdout.splitlines()[-3:] == [
        f"done: {out}", "  results      2 questions (popqa 1, hotpotqa 1), mode direct, ranker none",
        f"  compare with python -m coevo.eval --compare {out} <other result>.json"]
    assert load_result(out)["metrics"]["average"]["n"] == 2  # limit=1 per dataset, 2 datasets
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli.json"]  # no Hydra outputs/ or logs
