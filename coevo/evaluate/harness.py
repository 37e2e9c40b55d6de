"""Evaluation harness behind `python -m coevo.eval`: EM / F1 / cover-EM of a solver on QA benchmarks
(docs/method.md §5.4, §6).

    python -m coevo.eval solver=smollm2-135m data=../shared/data/benchmarks/dev.jsonl mode=rag out=rag.json
    python -m coevo.eval mode=agent ranker.mode=frozen limit=25          # per-dataset limit
    python -m coevo.eval solver.checkpoint=<run>/checkpoints/step_9/solver \
        ranker.mode=trainable ranker.checkpoint=<run>/checkpoints/step_9/ranker
    python -m coevo.eval --compare a.json b.json                         # side by side, deltas B - A

Config: `configs/eval.yaml` = the `coevo` root (solver/ranker/corpus/retrieval presets) + the
top-level eval keys; schema `EvalRootConfig` in coevo/core/config.py, which also loads every
policy frozen here. `ranker.mode` defaults to `none` (retrieval only); a ranker runs only
with `frozen`/`trainable`.

Modes (generation is greedy unless `greedy=false`):
- `direct`: the question alone; the model writes `<answer>…</answer>`.
- `rag`: ONE search with the question through the solver's search tool (first-stage
  top-N, then the ranker per `ranker.mode`, K documents) placed in the prompt.
- `agent`: the solver's multi-turn search episode (`solver.agent.run_episodes`, one rollout).

Model output is untrusted. In every mode the prediction is the content of a well-formed
`<answer>` action as `solver.agent.parse_action` reads it (the same strict rule the agent's
reward uses); anything else (no tags, unclosed tags, text after the answer, a search in
direct/rag mode) is a format failure. With `untagged=empty` (default) a format failure
predicts "" and scores 0; with `untagged=raw` it predicts the text of the model's last
turn with the action tags removed (lenient, for models that ignore the tag format; the
failure still counts in `format_failure`). The raw output stays in each record's `output`
so it can be audited or re-scored.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig

from coevo.core.config import EvalRootConfig, to_object
from coevo.core.inputs import LabelledQuestion, load_labelled_questions
from coevo.core.io import atomic_write_text
from coevo.core.progress import Progress
from coevo.core.types import SamplingParams
from coevo.evaluate.metrics import (
    aggregate,
    extract_answer,
    make_stamp,
    prediction_record,
    search_record,
    untagged_text,
)
from coevo.train.policy import Policy
from evidence.corpus_store import open_corpus
from evidence.retrieval import build_retriever
from solver.agent import ANSWER_STOP, Episode, Task, run_episodes
from solver.ranker import SearchRequest, build_ranker, strip_eos
from solver.search_tool import SearchTool, format_documents

SINGLE_TURN_SYSTEM = (
    "You answer questions{context}. You may first reason inside <think> and </think>. Then write the "
    "final answer, a few words only, inside <answer> and </answer>, for example <answer>Paris</answer>. "
    "Write nothing after </answer>."
)


def validate_eval(cfg: EvalRootConfig) -> None:
    """Check the eval keys the schema types cannot (ranges, the data file), naming the key."""
    if cfg.batch_size < 1:
        raise ValueError(f"config key batch_size={cfg.batch_size} must be >= 1")
    if cfg.limit is not None and cfg.limit < 1:
        raise ValueError(f"config key limit={cfg.limit} must be >= 1 (or null for all questions)")
    if not Path(cfg.data).is_file():
        raise FileNotFoundError(f"config key data={cfg.data!r}: no such file")
    if cfg.mode != "direct" and cfg.ranker.checkpoint and not cfg.ranker.has_model:
        raise ValueError(f"ranker.checkpoint is set but ranker.mode={cfg.ranker.mode} uses no ranker model; "
                         "set ranker.mode=trainable (or frozen) to evaluate that ranker")


def to_eval_object(dcfg: DictConfig) -> EvalRootConfig:
    """Typed, validated config (interpolations resolved)."""
    obj = to_object(dcfg, EvalRootConfig)
    assert isinstance(obj, EvalRootConfig)
    validate_eval(obj)
    return obj


# ---- questions ------------------------------------------------------------------------------

@dataclass
class EvalQuestion:
    """One labelled question; `task.evidence_ids` holds its gold passage ids (may be empty)."""

    task: Task
    dataset: str


def select_questions(questions: Sequence[LabelledQuestion], limit: Optional[int] = None) -> list[EvalQuestion]:
    """The first `limit` questions of each dataset (file order; all when `limit` is None)."""
    per_dataset: dict[str, int] = {}
    out = []
    for q in questions:
        if limit is None or per_dataset.get(q.dataset, 0) < limit:
            per_dataset[q.dataset] = per_dataset.get(q.dataset, 0) + 1
            out.append(EvalQuestion(Task(q.id, q.question, q.answers, q.gold_ids), q.dataset))
    return out


# ---- the stack and the three modes ----------------------------------------------------------

@dataclass
class EvalStack:
    """What the modes run on: the solver policy and (rag/agent) its search tool."""

    solver: Any  # coevo.train.policy.Policy or anything with chat_prompt_ids / generate / tokenizer
    tool: Optional[SearchTool] = None
    corpus: Any = None  # evidence.corpus.Corpus (for the stamp)


def build_eval_stack(cfg: EvalRootConfig) -> EvalStack:
    """Load the solver (frozen by the eval config) and, unless direct, corpus + tool."""

    solver = Policy.from_config(cfg.solver, "solver")
    if cfg.mode == "direct":
        return EvalStack(solver)
    corpus = open_corpus(cfg.corpus)
    retriever = build_retriever(corpus, cfg.retrieval)
    ranker_cfg = ranker_eval_config(cfg)
    ranker = build_ranker(ranker_cfg, solver, lambda: Policy.from_config(ranker_cfg, "ranker"))
    return EvalStack(solver, SearchTool(retriever, ranker, ranker_cfg), corpus)


def ranker_eval_config(cfg: EvalRootConfig) -> Any:
    """The ranker config as evaluated: greedy when the solver is (frozen by the eval config)."""
    temperature = 0.0 if cfg.greedy else cfg.ranker.temperature
    return dataclasses.replace(cfg.ranker, temperature=temperature)


def single_turn_messages(question: str, documents: Optional[Sequence[Any]] = None) -> list[dict]:
    """Chat messages of a direct (no documents) or rag (documents in the prompt) question."""
    context = "" if documents is None else " using the documents given with the question"
    user = f"Question: {question}"
    if documents is not None:
        user = f"Documents:\n{format_documents(documents)}\n\n{user}"
    return [{"role": "system", "content": SINGLE_TURN_SYSTEM.format(context=context)},
            {"role": "user", "content": user}]


def _single_turn_prompts(questions: Sequence[EvalQuestion], stack: EvalStack, mode: str,
                         batch_size: int) -> tuple[list[list[int]], list[list[dict[str, Any]]]]:
    """Prompt ids and search records of direct (no search) or rag (one batched search per batch)."""
    documents: list[Optional[list[Any]]] = [None] * len(questions)
    searches: list[list[dict[str, Any]]] = [[] for _ in questions]
    if mode == "rag":
        assert stack.tool is not None
        for start in range(0, len(questions), batch_size):
            requests = [SearchRequest(q.task.question, q.task.question, q.task.answers, q.task.evidence_ids,
                                      q.task.id, 0, 0) for q in questions[start:start + batch_size]]
            for i, result in enumerate(stack.tool.search(requests), start):
                documents[i], searches[i] = list(result.passages), [search_record(result.call, observed=True)]
    prompts = [stack.solver.chat_prompt_ids(single_turn_messages(q.task.question, docs))
               for q, docs in zip(questions, documents)]
    return prompts, searches


def run_single_turn(questions: Sequence[EvalQuestion], stack: EvalStack, mode: str, sampling: SamplingParams,
                    batch_size: int, untagged: str = "empty") -> list[dict[str, Any]]:
    """direct / rag: prompts for all questions, then generation in batches of similar prompt length.

    Batches are cut from the length-sorted prompts because a batch is padded to its longest
    prompt, and one long rag passage would otherwise multiply the prefill cost of a whole
    batch. Greedy output does not depend on the batch, so this changes no prediction.
    """
    prompts, searches = _single_turn_prompts(questions, stack, mode, batch_size)
    params = dataclasses.replace(sampling, stop=[ANSWER_STOP], n=1)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts = [""] * len(prompts)
    with Progress(f"eval {mode}", len(order), "questions") as progress:
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            for i, completions in zip(chunk, stack.solver.generate([prompts[i] for i in chunk], params)):
                texts[i] = completions[0].text
            progress.update(len(chunk))
    records = []
    for q, text, search in zip(questions, texts, searches):
        prediction, reason = extract_answer(strip_eos(text, stack.solver.tokenizer), untagged)
        records.append(prediction_record(q.task.id, q.dataset, q.task.question, q.task.answers, prediction,
                                          reason == "answer", reason, text, search, q.task.evidence_ids))
    return records


def _observed(ep: Episode, index: int) -> bool:
    """Whether the solver read the documents of its `index`-th search.

    The agent ends an episode with `token_budget`, without appending the documents, when
    they do not fit; that can only be the search of the episode's last turn.
    """
    call = ep.ranker_calls[index]
    last = index == len(ep.ranker_calls) - 1
    return not (last and ep.end_reason == "token_budget" and call.turn == ep.n_turns - 1)


def last_turn_text(ep: Episode, tokenizer: Any) -> str:
    """Decoded text of the episode's last generated turn ("" when an observation ends it)."""
    start = len(ep.loss_mask)
    while start > ep.prompt_len and ep.loss_mask[start - 1] == 1:
        start -= 1
    return tokenizer.decode(ep.token_ids[start:], skip_special_tokens=True)


def run_agent(batch: Sequence[EvalQuestion], stack: EvalStack, solver_cfg: Any, sampling: SamplingParams,
              untagged: str = "empty") -> list[dict[str, Any]]:
    """One multi-turn episode per question (lockstep over the batch); records."""
    assert stack.tool is not None
    episodes = run_episodes(stack.solver, [q.task for q in batch], stack.tool, solver_cfg, sampling=sampling,
                            group_size=1)
    records = []
    for q, ep in zip(batch, episodes):
        searches = [search_record(call, _observed(ep, i)) for i, call in enumerate(ep.ranker_calls)]
        transcript = stack.solver.tokenizer.decode(ep.token_ids[ep.prompt_len:])
        prediction = ep.answer if ep.format_ok and ep.answer else ""
        if not ep.format_ok and untagged == "raw":
            prediction = untagged_text(last_turn_text(ep, stack.solver.tokenizer))
        records.append(prediction_record(q.task.id, q.dataset, q.task.question, q.task.answers, prediction,
                                          ep.format_ok, ep.end_reason, transcript, searches, q.task.evidence_ids))
    return records


def predict(questions: Sequence[EvalQuestion], stack: EvalStack, cfg: EvalRootConfig) -> list[dict[str, Any]]:
    """Prediction records of all questions in `cfg.mode`, in file order (with a progress bar and 10% lines)."""
    sampling = stack.solver.sampling_from_config(greedy=cfg.greedy, seed=cfg.seed)
    if cfg.mode != "agent":
        return run_single_turn(questions, stack, cfg.mode, sampling, cfg.batch_size, cfg.untagged)
    records: list[dict[str, Any]] = []
    with Progress(f"eval {cfg.mode}", len(questions), "questions") as progress:
        for start in range(0, len(questions), cfg.batch_size):
            batch = questions[start:start + cfg.batch_size]
            records += run_agent(batch, stack, cfg.solver, sampling, cfg.untagged)
            progress.update(len(batch))
    return records


# ---- stamp, result file, entry points -------------------------------------------------------

def run_eval(cfg: EvalRootConfig, stack: Optional[EvalStack] = None) -> dict[str, Any]:
    """Load (unless given a stack), predict, aggregate, stamp, write `cfg.out`; the result dict."""
    t0 = time.perf_counter()
    labelled, report = load_labelled_questions(cfg.data)
    questions = select_questions(labelled, cfg.limit)
    stack = stack or build_eval_stack(cfg)
    records = predict(questions, stack, cfg)
    stamp = make_stamp(cfg, stack.corpus, len(records), time.perf_counter() - t0)
    # Inputs cut or skipped on loading change what was evaluated: the stamp says how many.
    stamp["questions_truncated"] = report.truncated
    corpus_report = getattr(stack.corpus, "report", None)
    stamp["corpus_truncated"] = corpus_report.truncated if corpus_report else None
    stamp["corpus_skipped_empty"] = corpus_report.skipped_empty if corpus_report else None
    result = {"stamp": stamp, "metrics": aggregate(records, stamp["K"], cfg.mode), "predictions": records}
    atomic_write_text(cfg.out, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return result
