"""The statistics of `bench.learning`: pooled counts with intervals, the paired eval test and the in-run figures.

Every test and interval comes from scipy (`scipy.stats.binomtest`, its `proportion_ci(method="wilson")`,
`scipy.stats.fisher_exact`); the one figure scipy has no task-clustered form of, the bootstrap
interval, is numpy (a percentile bootstrap that resamples whole tasks, below). Nothing here loads a model.

Blocks of `learning.json` built here (bench/learning.py's docstring shows where they sit):

    POOLED = {"right": k, "scored": n, "share": k / n | null, "wilson_95": [lo, hi] | null}

- Eval (`pooled` of each eval summary, and the arms of `paired`): a question is right when its
  prediction record's `em` is 1 (the exact match coevo.eval scores); scored = questions evaluated.
- `paired.<no_ranker | own_ranker | heldout>` = {"ranker_mode", "questions", "trained": POOLED,
  "control": POOLED, "both_right", "trained_only", "control_only", "neither", "mcnemar_p", "error"}:
  the two arms' evals in that ranker mode paired question by question (key: dataset and question
  id, from the result files' `predictions`). `mcnemar_p` is the exact McNemar test: the two-sided
  `binomtest(trained_only, trained_only + control_only, 0.5)` p-value, null when no pair is
  discordant. Evals over different question sets are not paired: `error` says why and the counts are absent.
- `in_run` = {"trained": RUN, "control": RUN, "fisher_p", "quarters": [QUARTER × 4], "bootstrap":
  {"resamples", "seed", "confidence"}, "error"}, pooled over the sampled rollouts (guided replays
  left out) of the accepted tasks of each arm's finished steps (those with a metrics.jsonl line).
  A rollout is right by the run's own count: a task's right rollouts are its dumped `accuracy`
  (the EM share of its sampled rollouts, echo guard as configured) times its sampled rollouts.
  RUN = POOLED with "sampled" for "scored", plus "tasks" (accepted tasks with sampled rollouts)
  and "bootstrap_95": the task-clustered percentile interval of the right share (resample the
  tasks with replacement, each with all its rollouts; `BOOTSTRAP_RESAMPLES` resamples, seeded with
  the bench's `--seed`); `wilson_95` treats rollouts as independent, `bootstrap_95` does not.
  `fisher_p`: two-sided `fisher_exact` of [[right, wrong] trained, [right, wrong] control], null
  when an arm sampled nothing.
  With `solver.extraction_mix`, `in_run.extraction` holds the same figures (less its own
  `extraction`) over the mixed corpus clozes' sampled rollouts: right by their dumped `accuracy`.
  `in_run.reading` holds them (less `extraction`) over the accepted tasks' sampled rollouts with right =
  those whose searches showed a gold alias (`read_answer`): how often the solver's own searches find
  the answer, whatever it then answers.
  `in_run.first_seen` holds them (less `extraction`) over each accepted task's first occurrence only (`task_key`:
  the normalized question and target; the earliest step, then dump order): a task accepted again (a reference
  question drawn again) after the solver trained on it may be answered from memory; the first time it cannot.
  `in_run.acceptance` = {"trained": POOLED + "steps", "control": …, "fisher_p", "quarters": [QUARTER × 4]}:
  the proposer's candidates that became tasks, right = accepted and scored = candidates summed over the
  finished steps' metrics lines ("steps": how many), Fisher as above (extraction clozes are no candidates).
- QUARTER = {"steps": [step indices], "trained": POOLED, "control": POOLED, "fisher_p"} over the
  tasks of those steps (POOLED's `scored` there counts sampled rollouts). The
  quarters are fixed by `--steps` alone, never by what a run did: `numpy.array_split` of the step
  indices 0 … steps-1 into 4 contiguous blocks, the first `steps % 4` of them one step longer
  (10 steps: 0–2, 3–5, 6–7, 8–9); with fewer than 4 steps the last blocks are empty.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence

import numpy as np
from scipy.stats import binomtest, fisher_exact

from coevo.core.io import iter_jsonl, step_of
from coevo.core.scoring import normalize_answer
from coevo.evaluate.report import load_run, number
from coevo.evaluate.series import step_key

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
QUARTERS = 4

TaskCount = tuple[int, int, int]  # (step, right, sampled) of one accepted task


# ---- pooled counts and tests ----------------------------------------------------------------

def wilson(right: int, scored: int, confidence: float = CONFIDENCE) -> Optional[list[float]]:
    """Wilson score interval of right / scored (None when nothing was scored)."""
    if scored == 0:
        return None
    ci = binomtest(right, scored).proportion_ci(confidence_level=confidence, method="wilson")
    return [float(ci.low), float(ci.high)]


def pooled(right: int, scored: int) -> dict[str, Any]:
    """POOLED (module docstring): the count, its share and its Wilson interval."""
    return {"right": right, "scored": scored, "share": right / scored if scored else None,
            "wilson_95": wilson(right, scored)}


def mcnemar_exact(trained_only: int, control_only: int) -> Optional[float]:
    """Exact McNemar p: two-sided binomial test of the discordant pairs at 1/2 (None when there are none)."""
    discordant = trained_only + control_only
    return float(binomtest(trained_only, discordant, 0.5).pvalue) if discordant else None


def fisher_p(right_a: int, n_a: int, right_b: int, n_b: int) -> Optional[float]:
    """Two-sided Fisher exact p of right / n in arm a against arm b (None when an arm scored nothing)."""
    if n_a == 0 or n_b == 0:
        return None
    return float(fisher_exact([[right_a, n_a - right_a], [right_b, n_b - right_b]]).pvalue)


# ---- paired evals ---------------------------------------------------------------------------

def question_results(result: Mapping[str, Any], source: str) -> dict[tuple[str, str], bool]:
    """{(dataset, question id): right} of a coevo.eval result (its `predictions`); `source` names it in errors."""
    predictions = result.get("predictions")
    if not isinstance(predictions, list):
        raise ValueError(f"{source}: no `predictions` list (not a coevo.eval result file)")
    out: dict[tuple[str, str], bool] = {}
    for i, rec in enumerate(predictions):
        if not isinstance(rec, dict) or "id" not in rec:
            raise ValueError(f"{source}: predictions[{i}] has no question `id`")
        key = (str(rec.get("dataset")), str(rec["id"]))
        if key in out:
            raise ValueError(f"{source}: question {key[1]!r} of dataset {key[0]!r} appears twice")
        out[key] = (number(rec.get("em")) or 0.0) >= 1.0
    return out


def eval_pooled(result: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """POOLED of one eval result (right: EM of 1); None when the result holds no predictions."""
    if not isinstance(result.get("predictions"), list):
        return None
    right = question_results(result, "eval result")
    return pooled(sum(right.values()), len(right))


def paired_report(trained: Mapping[tuple[str, str], bool], control: Mapping[tuple[str, str], bool],
                  sources: tuple[str, str] = ("trained", "control")) -> dict[str, Any]:
    """Pooled counts of both arms and the exact McNemar test over the same questions.

    ValueError when the two evals did not score the same questions (pairing needs one set):
    the message names both sources, the counts and a few keys only one of them has.
    """
    if set(trained) != set(control):
        only_t, only_c = sorted(set(trained) - set(control)), sorted(set(control) - set(trained))
        raise ValueError(f"cannot pair {sources[0]} ({len(trained)} questions) with {sources[1]} "
                         f"({len(control)} questions): different question sets; only in {sources[0]}: "
                         f"{only_t[:3]}, only in {sources[1]}: {only_c[:3]}")
    both = sum(1 for k in trained if trained[k] and control[k])
    trained_only = sum(1 for k in trained if trained[k] and not control[k])
    control_only = sum(1 for k in trained if control[k] and not trained[k])
    n = len(trained)
    return {"questions": n, "trained": pooled(both + trained_only, n), "control": pooled(both + control_only, n),
            "both_right": both, "trained_only": trained_only, "control_only": control_only,
            "neither": n - both - trained_only - control_only, "mcnemar_p": mcnemar_exact(trained_only, control_only)}


# ---- in-run figures -------------------------------------------------------------------------

def task_key(question: Any, target: Any) -> tuple[str, str]:
    """The identity of a task across steps: its question and target after `normalize_answer`."""
    return normalize_answer(str(question or "")), normalize_answer(str(target or ""))


def first_occurrences(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The accepted records whose `task_key` no earlier accepted record had (step order, then the given order)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in sorted((r for r in records if r.get("accepted")), key=lambda r: int(r.get("step") or 0)):
        key = task_key(r.get("question"), r.get("target"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def task_counts(records: Iterable[Mapping[str, Any]], steps: Optional[Iterable[int]] = None,
                clozes: bool = False, read: bool = False) -> list[TaskCount]:
    """(step, right, sampled) of each accepted task (`clozes`: each mixed corpus cloze) with sampled
    rollouts and a numeric `accuracy`.

    `records` are dump records with their `step` (as `load_run` gives them); `steps`, when given,
    keeps those steps only (the finished ones). right = round(accuracy × sampled); with `read`, the
    sampled rollouts whose searches showed a gold alias (`read_answer`) instead.
    """
    kept = None if steps is None else set(steps)
    out = []
    for r in records:
        wanted = r.get("kind") == "extraction" if clozes else r.get("accepted")
        if not wanted or (kept is not None and r.get("step") not in kept):
            continue
        rollouts = [ro for ro in r.get("rollouts") or [] if isinstance(ro, dict) and not ro.get("guided")]
        accuracy = number(r.get("accuracy"))
        if rollouts and accuracy is not None:
            right = sum(ro.get("read_answer") is True for ro in rollouts) if read else round(accuracy * len(rollouts))
            out.append((int(r["step"]), right, len(rollouts)))
    return out


class RunCounts(NamedTuple):
    """What `in_run` pools from one arm's finished steps (module docstring)."""

    tasks: list[TaskCount]  # accepted tasks: (step, right, sampled)
    clozes: list[TaskCount]  # mixed corpus clozes: (step, right, sampled)
    acceptance: list[TaskCount]  # steps: (step, accepted, candidates)
    reading: list[TaskCount]  # accepted tasks: (step, sampled rollouts that read the answer, sampled)
    first_seen: list[TaskCount]  # accepted tasks at their first occurrence: (step, right, sampled)


def run_task_counts(run_dir: Path) -> RunCounts:
    """The `RunCounts` of a run directory's finished steps (those with a metrics.jsonl line). `load_run` leaves
    the clozes (`solver.extraction_mix`) out of its task records, so the dumps are read once more for them."""
    records, metrics = load_run(run_dir)
    acceptance = [(s, int(number(m.get("accepted")) or 0), int(number(m.get("candidates")) or 0))
                  for m in metrics if (s := step_key(m)) is not None]
    finished = [a[0] for a in acceptance]
    dumps = [(step_of(f.name, ".jsonl"), f) for f in sorted((Path(run_dir) / "tasks").glob("step_*.jsonl"))]
    clozes = [{**r, "step": n} for n, f in dumps if n is not None
              for _, r in iter_jsonl(f, objects=True, skip_torn_last=True) if r.get("kind") == "extraction"]
    return RunCounts(task_counts(records, finished), task_counts(clozes, finished, clozes=True), acceptance,
                     task_counts(records, finished, read=True), task_counts(first_occurrences(records), finished))


def quarter_blocks(steps: int) -> list[list[int]]:
    """The bench's quarters of a `steps`-step run (module docstring): 4 contiguous blocks of step indices."""
    return [[int(s) for s in block] for block in np.array_split(np.arange(steps), QUARTERS)]


def cluster_bootstrap(counts: Sequence[tuple[int, int]], seed: int, resamples: int = BOOTSTRAP_RESAMPLES,
                      confidence: float = CONFIDENCE) -> Optional[list[float]]:
    """Percentile interval of sum(right) / sum(sampled) with whole tasks resampled (None without tasks).

    `counts` = (right, sampled) per task, every sampled > 0. Each resample draws as many tasks as
    there are, with replacement, from `numpy.random.default_rng(seed)`; written in numpy because
    scipy.stats.bootstrap resamples observations, not clusters of them.
    """
    if not counts:
        return None
    right = np.array([c[0] for c in counts], dtype=float)
    sampled = np.array([c[1] for c in counts], dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(counts), size=(resamples, len(counts)))
    shares = right[picks].sum(axis=1) / sampled[picks].sum(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    lo, hi = np.percentile(shares, [tail, 100 - tail])
    return [float(lo), float(hi)]


def _sums(counts: Sequence[TaskCount], steps: Optional[set[int]] = None) -> tuple[int, int]:
    kept = [c for c in counts if steps is None or c[0] in steps]
    return sum(c[1] for c in kept), sum(c[2] for c in kept)


def quarter_rows(trained: Sequence[TaskCount], control: Sequence[TaskCount], steps: int) -> list[dict[str, Any]]:
    """QUARTER (module docstring) of each of the bench's quarters, from (step, right, scored) counts of both arms."""
    rows = []
    for block_steps in quarter_blocks(steps):
        (rt, st), (rc, sc) = _sums(trained, set(block_steps)), _sums(control, set(block_steps))
        rows.append({"steps": block_steps, "trained": pooled(rt, st), "control": pooled(rc, sc),
                     "fisher_p": fisher_p(rt, st, rc, sc)})
    return rows


def in_run_report(trained: Sequence[TaskCount], control: Sequence[TaskCount], steps: int,
                  seed: int) -> dict[str, Any]:
    """`in_run` (module docstring) from each arm's `task_counts`; `steps` is the bench's `--steps`."""
    arms: dict[str, Any] = {}
    for arm, counts in (("trained", trained), ("control", control)):
        right, sampled = _sums(counts)
        block = pooled(right, sampled)
        arms[arm] = {"right": right, "sampled": sampled, "tasks": len(counts), "share": block["share"],
                     "wilson_95": block["wilson_95"],
                     "bootstrap_95": cluster_bootstrap([(c[1], c[2]) for c in counts], seed)}
    return {**arms, "fisher_p": fisher_p(arms["trained"]["right"], arms["trained"]["sampled"],
                                         arms["control"]["right"], arms["control"]["sampled"]),
            "quarters": quarter_rows(trained, control, steps),
            "bootstrap": {"resamples": BOOTSTRAP_RESAMPLES, "seed": seed, "confidence": CONFIDENCE}, "error": None}


def acceptance_report(trained: Sequence[TaskCount], control: Sequence[TaskCount], steps: int) -> dict[str, Any]:
    """`in_run.acceptance` (module docstring) from each arm's (step, accepted, candidates) per finished step."""
    arms = {arm: {**pooled(*_sums(counts)), "steps": len(counts)} for arm, counts in
            (("trained", trained), ("control", control))}
    return {**arms, "fisher_p": fisher_p(arms["trained"]["right"], arms["trained"]["scored"],
                                         arms["control"]["right"], arms["control"]["scored"]),
            "quarters": quarter_rows(trained, control, steps)}


# ---- the blocks of learning.json ------------------------------------------------------------

def _eval_results(arms: Mapping[str, Any], key: str) -> dict[str, dict[tuple[str, str], bool]]:
    """{arm: question_results} of each arm's `key` eval; ValueError naming what is missing or failed."""
    out = {}
    for arm in ("trained", "control"):
        summary = (arms.get(arm) or {}).get(key)
        if not summary or summary.get("error") or not summary.get("file"):
            reason = (summary or {}).get("error") or "no eval"
            raise ValueError(f"the {arm} arm's `{key}` has no result to pair ({reason})")
        path = Path(summary["file"])
        out[arm] = question_results(json.loads(path.read_text(encoding="utf-8")), str(path))
    return out


def paired_blocks(arms: Mapping[str, Any], mode: str, own_ranker: bool = True,
                  heldout: bool = False) -> dict[str, Any]:
    """`paired`: the no-ranker and (`own_ranker`) own-ranker evals of both arms and (`heldout`) their
    held-out cloze evals, paired (PAIRED, module docstring)."""
    blocks = {}
    evals = [("no_ranker", "eval_no_ranker", "none")] + [("own_ranker", "eval", mode)] * own_ranker \
        + [("heldout", "eval_heldout", "none")] * heldout
    for name, key, ranker_mode in evals:
        try:
            results = _eval_results(arms, key)
            blocks[name] = {"ranker_mode": ranker_mode, **paired_report(
                results["trained"], results["control"],
                (arms["trained"][key]["file"], arms["control"][key]["file"])), "error": None}
        except (OSError, ValueError) as e:  # one block's failure leaves the other figures standing
            blocks[name] = {"ranker_mode": ranker_mode, "error": str(e)}
    return blocks


def in_run_block(arms: Mapping[str, Any], steps: int, seed: int) -> dict[str, Any]:
    """`in_run` from the arms' run directories (an unreadable one: `error`, no figures)."""
    try:
        trained, control = (run_task_counts(Path((arms.get(arm) or {})["run_dir"])) for arm in ("trained", "control"))
    except (KeyError, OSError, ValueError) as e:
        return {"error": f"reading the arms' task dumps: {type(e).__name__}: {e}"}
    report = in_run_report(trained.tasks, control.tasks, steps, seed)
    report["acceptance"] = acceptance_report(trained.acceptance, control.acceptance, steps)
    report["reading"] = in_run_report(trained.reading, control.reading, steps, seed)
    report["first_seen"] = in_run_report(trained.first_seen, control.first_seen, steps, seed)
    if trained.clozes or control.clozes:
        report["extraction"] = in_run_report(trained.clozes, control.clozes, steps, seed)
    return report
