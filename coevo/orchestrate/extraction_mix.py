"""Corpus clozes in co-evolution's solver batch: `solver.extraction_mix` (docs/method.md §4.8).

With `solver.extraction_mix` = N > 0, every `coevo.run` step adds N one-hop clozes of
`solver.extraction_data` (evidence/extraction.py's tasks, training page split) to the proposer's
accepted tasks. They are solved in the same `solve_tasks` call, G rollouts each, the last a guided
replay of the cloze's guide (`solver.guided_rollouts` must be on: coevo/core/role_config.py
`check_extraction_mix`), and trained in the same update (solver and ranker batches alike). Their
figures are kept apart: `ClozeBatch.apart` takes their episodes and ranker groups out of the step's,
so every co-evolution figure (`solver/...`, `ranker/...`, the proposer's rewards, the hop curriculum's
accuracy) describes the proposer's tasks alone, and `ClozeBatch.metrics` writes theirs under
`extraction/...` with the one builder, `step_metrics.rollout_figures`. Their task-dump records carry
`"kind": "extraction"` (coevo.evaluate's readers leave them out of the task figures).

Cursor: step s takes positions s·N … s·N + N − 1 of a permutation of the file seeded by `seed`,
cycling. It is a function of the step, as `loop.step_seed` is: a resumed step takes exactly the clozes
the original would have, with nothing to keep in the checkpoint (a resume keeps `solver.extraction_mix`
and `seed`: coevo/core/rundir.py refuses a changed experiment key).

Refused (`ExtractionDataError`, naming `solver.extraction_data`, at start-up and at each step's read):
a missing or invalid file, a record without a guide, and a record not marked `"split": "train"`
(held-out clozes score the solver, they must never train it; a file from before the split names none).
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

from coevo.core.config import CoevoConfig
from coevo.core.inputs import InputError, load_labelled_questions
from coevo.core.io import iter_jsonl
from coevo.core.stats import mean
from coevo.orchestrate.step_metrics import rollout_figures
from coevo.train.preflight import PreflightError
from solver.agent import Episode, Task
from solver.ranker import RankerCall

KEY = "solver.extraction_data"
TRAIN_SPLIT = "train"  # evidence/extraction.py's TRAIN (evidence is a role package: not imported for one word)
KIND = "extraction"  # the dump records' `kind`; coevo/evaluate/report.py `load_run` skips it


class ExtractionDataError(PreflightError):
    """`solver.extraction_data` cannot be mixed in: a refusal at start-up (one line, exit 2)."""


class Rollouts(NamedTuple):
    """The clozes' share of a step's solve: their episodes, ranker groups and accuracy per task id."""

    episodes: list[Episode]
    groups: list[list[RankerCall]]
    accuracy: dict[str, float]


def read_clozes(path: str) -> list[Task]:
    """The tasks of a cloze file, checked as the module doc says; raises ExtractionDataError naming the key."""
    where = f"{KEY}={path}"
    if not Path(path).is_file():
        raise ExtractionDataError(f"{where}: no such file; write one with python -m evidence.extraction "
                                  "--split train --out FILE")
    try:
        questions, _ = load_labelled_questions(path)
        for line_no, rec in iter_jsonl(Path(path), error=InputError):
            split = rec.get("split")
            if split != TRAIN_SPLIT:
                raise ExtractionDataError(
                    f"{where}: line {line_no} has split {split!r}; expected every record from the training page "
                    "split ('split': 'train', python -m evidence.extraction --split train): held-out clozes "
                    "measure the solver and must not train it")
    except InputError as e:
        raise ExtractionDataError(f"{where}: {e}") from None
    unguided = next((q for q in questions if not q.guide), None)
    if unguided is not None:
        raise ExtractionDataError(f"{where}: line {unguided.line} has no 'guide'; a mixed cloze's last rollout "
                                  "replays its guide (solver.guided_rollouts)")
    return [Task(q.id, q.question, q.answers, q.gold_ids, q.guide) for q in questions]


def mixed_clozes(cfg: CoevoConfig) -> list[Task]:
    """The clozes `solver.extraction_mix` draws from ([] when it is 0); raises ExtractionDataError."""
    n = cfg.solver.extraction_mix
    if n == 0:
        return []
    if not cfg.solver.extraction_data:
        raise ExtractionDataError(f"config key solver.extraction_mix={n} needs {KEY}: a cloze JSONL of the training "
                                  "page split (python -m evidence.extraction --split train --out FILE)")
    return read_clozes(cfg.solver.extraction_data)


def check_extraction_data(cfg: CoevoConfig) -> None:
    """The start-up check of `coevo.run` (startup_checks.run_checks): the file reads as `read_clozes` wants."""
    mixed_clozes(cfg)


def cloze_positions(step: int, n: int, size: int, seed: int) -> list[int]:
    """Indices into the file of step `step`'s `n` clozes: positions step·n … step·n+n−1 of the seeded permutation."""
    order = list(range(size))
    random.Random(seed).shuffle(order)
    return [order[(step * n + j) % size] for j in range(n)]


class ClozeBatch:
    """One step's clozes (none when the mix is off): their tasks, then their share of the step's results."""

    def __init__(self, step: int, tasks: Sequence[Task], sources: Sequence[Task], cursor: int) -> None:
        self.step, self.tasks, self.sources, self.cursor = step, list(tasks), list(sources), cursor

    def apart(self, episodes: Sequence[Episode], groups: Sequence[list[RankerCall]],
              accuracy: dict[str, float]) -> tuple[list[Episode], list[list[RankerCall]], Rollouts]:
        """(the proposer tasks' episodes, their ranker groups, the clozes' `Rollouts`), each in the step's order.

        A ranker group holds calls of one task (solver.training.score_ranker), so it goes with its task.
        """
        if not self.tasks:  # the mix off: the step's results as they came
            return list(episodes), list(groups), Rollouts([], [], {})
        ids = {t.id for t in self.tasks}
        theirs = Rollouts([ep for ep in episodes if ep.task_id in ids], [g for g in groups if g[0].task_id in ids],
                          {t.id: accuracy[t.id] for t in self.tasks if t.id in accuracy})
        return ([ep for ep in episodes if ep.task_id not in ids], [g for g in groups if g[0].task_id not in ids],
                theirs)

    def metrics(self, rollouts: Rollouts, top_k: int) -> dict[str, Any]:
        """The `extraction` block of the step's metrics ({} when off): `tasks`, `cursor` (clozes taken before
        this step), `accuracy` (mean p over the clozes) and the `solver`, `reward`, `ranker` figures of
        `rollout_figures` over the clozes' episodes (each key's population stated there)."""
        if not self.tasks:
            return {}
        return {"extraction": {"tasks": len(self.tasks), "cursor": self.cursor,
                               "accuracy": mean(list(rollouts.accuracy.values())),
                               **rollout_figures(rollouts.episodes, rollouts.groups, top_k)}}

    def records(self, rollouts: Rollouts,
                decode: Optional[Callable[[list[int]], str]] = None) -> list[dict[str, Any]]:
        """One task-dump record per cloze, marked `"kind": "extraction"`, with its rollouts."""
        return [{"kind": KIND, "task_id": t.id, "source_id": src.id, "question": t.question, "answers": t.answers,
                 "guide": t.guide, "gold_ids": t.evidence_ids, "accuracy": rollouts.accuracy.get(t.id),
                 "rollouts": [ep.to_record(decode) for ep in rollouts.episodes if ep.task_id == t.id]}
                for t, src in zip(self.tasks, self.sources)]


def step_clozes(cfg: CoevoConfig, step: int) -> ClozeBatch:
    """Step `step`'s clozes (`solver.extraction_mix` of them; an empty batch when it is 0), ids `s<step>-x<k>`."""
    n, pool = cfg.solver.extraction_mix, mixed_clozes(cfg)
    if not pool:
        return ClozeBatch(step, [], [], 0)
    sources = [pool[i] for i in cloze_positions(step, n, len(pool), cfg.seed)]
    tasks = [Task(f"s{step}-x{k}", t.question, t.answers, t.evidence_ids, t.guide) for k, t in enumerate(sources)]
    return ClozeBatch(step, tasks, sources, step * n)
