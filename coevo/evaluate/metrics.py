"""Scoring side of `python -m coevo.eval`: answer extraction, per-question records,
per-dataset aggregation, terminal tables, result files and their comparison.

Everything here is a pure function of the prediction records, so a result file can be
re-aggregated after loading (`aggregate(result["predictions"], K, mode)` gives back its
`metrics`). Answer scores always come from `coevo.core.scoring` (docs/method.md §5.4: the one
implementation) applied to the record's `prediction` and `answers`.

Per dataset (keys of `metrics[<dataset>]`):
- `n`, `em`, `f1`, `cover_em` (means over questions of the record's `prediction`, which
  is "" for a format failure unless the run used `untagged=raw`),
  `format_failure` (share of questions without a well-formed answer),
  `mean_searches` and `search_hist` ({"0": count, "1": count, …});
- when the questions carry `gold_ids` and the mode retrieves: `recall@K` (share of a
  question's gold passages among the passages the solver was shown, over all its
  searches, averaged over questions), `ranker_calls`, `hit@k` for k in {1, 3, 5} capped at
  K (share of the searches with a gold passage among their candidates whose top-k shown
  passages hold one: `coevo.run`'s and `coevo.solve`'s `ranker/hit@k`, gold passages as the
  relevant ones) and
  `ranker_format_failure` (share of searches whose ranker output was malformed and fell
  back to first-stage order).

`average` is the macro average over datasets (each dataset weighs the same, as in the
Search-R1 / CoSearch tables) of every number a dataset has; its `n` and `search_hist`
are pooled totals and `datasets` counts the datasets.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Sequence

from coevo.core.scoring import cover_em, exact_match, f1
from coevo.core.stats import mean
from coevo.orchestrate.step_metrics import hit_rates
from solver.agent import parse_action
from solver.ranker import RankerCall

ROUND = 4  # digits kept in metrics (predictions keep full precision)
TABLE_SCORES = ("em", "f1", "cover_em")  # shown x100 in tables
RESULT_KEYS = ("stamp", "metrics", "predictions")
_ACTION_TAG = re.compile(r"</?(?:think|search|answer|information)>")


def untagged_text(text: str) -> str:
    """An output's text with the action tags removed and whitespace collapsed (`untagged=raw`)."""
    return " ".join(_ACTION_TAG.sub(" ", text if isinstance(text, str) else "").split())


def extract_answer(text: str, untagged: str = "empty") -> tuple[str, str]:
    """(prediction, end reason) of a single-turn output; never raises (see the module docstring)."""
    action = parse_action(text)
    if action.kind == "answer":
        return action.content, "answer"
    fallback = untagged_text(text) if untagged == "raw" else ""
    return fallback, "search_without_tool" if action.kind == "search" else action.reason


def score_answer(prediction: str, answers: Sequence[str]) -> dict[str, float]:
    """EM, token F1 and cover-EM of one prediction against its gold aliases."""
    return {"em": exact_match(prediction, answers), "f1": f1(prediction, answers),
            "cover_em": cover_em(prediction, answers)}


SEARCH_KEYS = ("sub_query", "candidate_ids", "chosen_ids", "format_ok")  # of RankerCall.to_record


def search_record(call: RankerCall, observed: bool) -> dict[str, Any]:
    """One search of one question as stored in its prediction record (`retrievals`).

    A subset of the ranker call's own task-dump record, under the same key names, plus
    `observed` (whether the solver read the documents).
    """
    record = call.to_record()
    return {**{key: record[key] for key in SEARCH_KEYS}, "observed": observed}


def prediction_record(qid: str, dataset: str, question: str, answers: Sequence[str], prediction: str,
                      format_ok: bool, end_reason: str, output: str, retrievals: list[dict[str, Any]],
                      gold_ids: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """The per-question entry of `predictions`; `retrievals` holds `search_record`s.

    `n_searches` is the number of searches made: valid tool calls in agent mode, the one
    retrieval in rag mode, 0 in direct mode.
    """
    record = {"id": qid, "dataset": dataset, "question": question, "answers": list(answers),
              "prediction": prediction, **score_answer(prediction, answers), "n_searches": len(retrievals),
              "format_ok": format_ok, "end_reason": end_reason, "retrievals": retrievals, "output": output}
    if gold_ids:
        record["gold_ids"] = list(gold_ids)
    return record


def _rounded(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, ROUND) if isinstance(v, float) else v for k, v in metrics.items()}


def _retrieval_metrics(records: Sequence[dict[str, Any]], top_k: int) -> dict[str, Any]:
    """recall@K, Hit@k and ranker format failures over the questions that have gold ids.

    Hit@k is `coevo.orchestrate.step_metrics.hit_rates`, the figure `coevo.run` and `coevo.solve`
    log, over the same population: the searches with a relevant candidate, here a gold passage.
    """
    labelled = [r for r in records if r.get("gold_ids")]
    if not labelled:
        return {}
    recalls, rankings, format_ok = [], [], []
    for rec in labelled:
        gold = set(rec["gold_ids"])
        shown = {pid for s in rec["retrievals"] if s["observed"] for pid in s["chosen_ids"]}
        recalls.append(len(gold & shown) / len(gold))
        rankings += [[pid in gold for pid in s["chosen_ids"]] for s in rec["retrievals"]
                     if gold.intersection(s["candidate_ids"])]
        format_ok += [s["format_ok"] for s in rec["retrievals"]]
    return {f"recall@{top_k}": mean(recalls), "ranker_calls": len(format_ok), **hit_rates(rankings, top_k),
            "ranker_format_failure": mean([float(not ok) for ok in format_ok])}


def dataset_metrics(records: Sequence[dict[str, Any]], top_k: int, retrieves: bool) -> dict[str, Any]:
    """Metrics of one dataset's records (see the module docstring for the keys)."""
    scores = [score_answer(r["prediction"], r["answers"]) for r in records]
    hist: dict[str, int] = {}
    for r in records:
        hist[str(r["n_searches"])] = hist.get(str(r["n_searches"]), 0) + 1
    out: dict[str, Any] = {"n": len(records)}
    for key in TABLE_SCORES:
        out[key] = mean([s[key] for s in scores])
    out["format_failure"] = mean([float(not r["format_ok"]) for r in records])
    out["mean_searches"] = mean([float(r["n_searches"]) for r in records])
    out["search_hist"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    if retrieves:
        out.update(_retrieval_metrics(records, top_k))
    return out


def macro_average(per_dataset: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Unweighted mean over datasets of every number; pooled `n` and `search_hist`."""
    hist: dict[str, int] = {}
    keys: list[str] = []
    for m in per_dataset.values():
        keys += [k for k in m if k not in keys]
        for s, c in m["search_hist"].items():
            hist[s] = hist.get(s, 0) + c
    out: dict[str, Any] = {"n": sum(m["n"] for m in per_dataset.values()), "datasets": len(per_dataset)}
    for key in keys:
        if key in ("n", "search_hist", "ranker_calls"):
            continue
        # A dataset without a number (e.g. no gold ids) is left out of that number's mean; the
        # dataset numbers are unrounded here, so the average is not one of rounded numbers.
        out[key] = mean([m[key] for m in per_dataset.values() if m.get(key) is not None])
    if any("ranker_calls" in m for m in per_dataset.values()):
        out["ranker_calls"] = sum(m.get("ranker_calls", 0) for m in per_dataset.values())
    out["search_hist"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    return out


def aggregate(records: Sequence[dict[str, Any]], top_k: Optional[int], mode: str) -> dict[str, Any]:
    """`metrics` of a result: one entry per dataset (first-appearance order) plus `average`.

    `top_k` is K (the stamp's `K`; None in direct mode, which retrieves nothing).
    """
    retrieves = mode != "direct" and top_k is not None
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_dataset.setdefault(r["dataset"], []).append(r)
    per_dataset = {name: dataset_metrics(recs, top_k or 0, retrieves) for name, recs in by_dataset.items()}
    if not per_dataset:
        return {"average": {"n": 0, "datasets": 0}}
    average = macro_average(per_dataset)
    return {**{name: _rounded(m) for name, m in per_dataset.items()}, "average": _rounded(average)}


# ---- terminal tables ------------------------------------------------------------------------

def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key in TABLE_SCORES:
        return f"{100 * value:.1f}"
    if isinstance(value, float):
        return f"{value:.2f}" if key == "mean_searches" else f"{value:.3f}"
    return str(value)


def _columns(metrics: dict[str, Any]) -> list[str]:
    cols = ["n", *TABLE_SCORES, "mean_searches", "format_failure"]
    extra = [k for k in metrics.get("average", {}) if k.startswith(("recall@", "hit@"))]
    return cols + extra


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths)))
    rule = "-" * len(fmt(header))
    return "\n".join([fmt(header), rule, *[fmt(r) for r in rows[:-1]], rule, fmt(rows[-1])])


def format_table(metrics: dict[str, Any], title: str = "") -> str:
    """One row per dataset and a final `average` row; EM/F1/cover-EM shown x100."""
    cols = _columns(metrics)
    names = [d for d in metrics if d != "average"] + ["average"]
    rows = [[name] + [_cell(c, metrics[name].get(c)) for c in cols] for name in names]
    head = ["dataset", *[c.replace("mean_searches", "searches").replace("format_failure", "fmt_fail")
                         for c in cols]]
    table = _render(head, rows)
    return f"{title}\n{table}" if title else table


def _delta(key: str, a: Any, b: Any) -> str:
    if a is None or b is None:
        return "-"
    d = (b - a) * (100 if key in TABLE_SCORES else 1)
    return f"{d:+.1f}" if key in TABLE_SCORES else f"{d:+.2f}"


def format_compare(a: dict[str, Any], b: dict[str, Any], keys: Sequence[str] = ("em", "f1", "cover_em",
                                                                                "mean_searches")) -> str:
    """Two results side by side: per dataset and metric, A, B and the delta B - A."""
    ma, mb = a["metrics"], b["metrics"]
    names = [d for d in ma if d != "average"] + [d for d in mb if d != "average" and d not in ma] + ["average"]
    rows = []
    for name in names:
        da, db = ma.get(name, {}), mb.get(name, {})
        row = [name, f"{da.get('n', '-')}/{db.get('n', '-')}"]
        for key in keys:
            row += [_cell(key, da.get(key)), _cell(key, db.get(key)), _delta(key, da.get(key), db.get(key))]
        rows.append(row)
    head = ["dataset", "n A/B"]
    for key in keys:
        short = key.replace("mean_searches", "searches")
        head += [f"{short} A", f"{short} B", "delta"]
    return _render(head, rows)


# ---- result files ----------------------------------------------------------------------------

def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (the data-file stamp)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _git(*args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def make_stamp(cfg: Any, corpus: Any, n_questions: int, duration_s: float) -> dict[str, Any]:
    """Everything a number depends on: models, corpus, retriever, N, K, data hash, code, decoding.

    `cfg` is a coevo.eval.EvalRootConfig; `corpus` the searched Corpus (None in direct mode).
    """
    retrieves = cfg.mode != "direct"
    ranker_model = retrieves and cfg.ranker.has_model
    shared = ranker_model and cfg.ranker.share_backbone
    searched = corpus if retrieves else None
    commit, status = _git("rev-parse", "HEAD"), _git("status", "--porcelain", "--untracked-files=no")
    return {
        "mode": cfg.mode, "ranker_mode": cfg.ranker.mode if retrieves else None,
        "solver_preset": cfg.solver.preset, "solver_model": cfg.solver.model,
        "solver_checkpoint": cfg.solver.checkpoint,
        "ranker_preset": cfg.ranker.preset if ranker_model else None,
        "ranker_model": ("shared with solver" if shared else cfg.ranker.model) if ranker_model else None,
        "ranker_checkpoint": cfg.ranker.checkpoint if ranker_model and not shared else None,
        "corpus": searched.name if searched is not None else None,
        "corpus_hash": searched.content_hash if searched is not None else None,
        "corpus_source": str(Path(searched.source).resolve()) if searched is not None and searched.source else None,
        "corpus_passages": len(searched) if searched is not None else None,
        "retriever": cfg.retrieval.backend if retrieves else None,
        "N": cfg.ranker.n_candidates if retrieves else None, "K": cfg.ranker.top_k if retrieves else None,
        "data": str(Path(cfg.data).resolve()), "data_sha256": file_sha256(cfg.data),
        "questions": n_questions, "limit": cfg.limit, "batch_size": cfg.batch_size,
        "untagged": cfg.untagged, "greedy": cfg.greedy,
        "temperature": 0.0 if cfg.greedy else cfg.solver.temperature,
        "max_new_tokens": cfg.solver.max_new_tokens, "seed": cfg.seed,
        "max_searches": cfg.solver.max_searches if cfg.mode == "agent" else None,
        "max_turns": cfg.solver.max_turns if cfg.mode == "agent" else None,
        "git_commit": commit, "git_dirty": None if commit is None or status is None else bool(status),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 1),
    }


def load_result(path: str | Path) -> dict[str, Any]:
    """A result file written by `run_eval`; fails naming the file when it is not one."""
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    missing = [k for k in RESULT_KEYS if not isinstance(result, dict) or k not in result]
    if missing:
        raise ValueError(f"{path} is not a coevo.eval result: missing keys {missing}")
    return result


def result_title(result: dict[str, Any], label: str = "") -> str:
    """One line naming what a result measured (mode, models, corpus, data)."""
    s = result["stamp"]
    ranker = f" ranker={s['ranker_mode']}" + (f"({s['ranker_model']})" if s.get("ranker_model") else "")
    ckpt = f" ckpt={s['solver_checkpoint']}" if s.get("solver_checkpoint") else ""
    corpus = f" corpus={s['corpus']} N={s['N']} K={s['K']}" if s.get("corpus") else ""
    lenient = " untagged=raw" if s.get("untagged") == "raw" else ""
    return (f"{label}mode={s['mode']} solver={s['solver_model']}{ckpt}{ranker if s['mode'] != 'direct' else ''}"
            f"{corpus} data={Path(s['data']).name}@{s['data_sha256'][:12]}{lenient} (scores x100)")


def compare_files(path_a: str | Path, path_b: str | Path) -> str:
    """`--compare`: both stamps, the stamp keys that differ, per-dataset metrics and deltas B - A."""
    a, b = load_result(path_a), load_result(path_b)
    lines = [result_title(a, f"A {path_a}: "), result_title(b, f"B {path_b}: ")]
    skip = {"timestamp", "duration_s"}
    diffs = [f"{k}: {a['stamp'].get(k)} -> {b['stamp'].get(k)}" for k in dict.fromkeys([*a["stamp"], *b["stamp"]])
             if k not in skip and a["stamp"].get(k) != b["stamp"].get(k)]
    if diffs:
        lines.append("stamps differ in " + "; ".join(diffs))
    if a["stamp"]["data_sha256"] != b["stamp"]["data_sha256"]:
        lines.append("WARNING: different data files, so the questions (and n) may differ")
    return "\n".join(lines + [format_compare(a, b)])
