"""One-hop extraction tasks written from the corpus itself (label-free): the solver's warm-start.

    python -m evidence.extraction --out FILE [--n 400] [--seed 0] [-- COEVO_OVERRIDES...]

A task is one hop of an evidence path, H → T, put as a cloze instead of written by the proposer:
passage P (title H) has a sentence S that names an entity T other than H (the graph's edge
between H and T, evidence/graph.py); the question shows S with T blanked, the answers are T's
aliases, the guide is [H]. The route to the answer is one search for H, then reading S in the
result and copying the blanked name: the skill the capacity probe shows the untrained 135M
solver lacks (docs/learning.md: the answer stood in its observation for a third of the
questions; EM 0.02).

A candidate becomes a task only when (else it is counted under the reason in brackets)
- P has a sentence of `MIN_WORDS`–`MAX_WORDS` words naming a reliable entity T (no date, number
  or nationality: paths.UNRELIABLE_LABELS) that is neither H nor an alias of it [no_sentence];
- no alias of T stays in the blanked question or the guide (the echo guard would score the
  answer wrong, and the question would give it away) [echo];
- the search for H returns P among its first K passages, K = `ranker.top_k` (what the solver
  reads without a ranker), so a guided replay reads the answer [not_retrievable].
Passages are visited in a seeded order and each picks its sentence and mention with its own
seeded generator, so a file is reproducible from (corpus, seed, config).

The output is labelled-questions JSONL (coevo/core/inputs.py), written atomically:
    {"id", "question", "answers", "guide": [H], "gold_ids": [P], "dataset": "extraction"}
It trains with `coevo.solve solve.data=FILE corpus=<this corpus> solver.guided_rollouts=true`
(the last rollout of each group replays the guide); the checkpoint starts a co-evolution run
with `solver.checkpoint=<checkpoint>/solver`. Stdout is one JSON line: passages read, tasks
written, rejections by reason, seconds.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from coevo.core.config import CoevoConfig, compose, to_object
from coevo.core.io import atomic_write_text
from coevo.core.scoring import answer_aliases, echoes
from evidence.corpus import Corpus
from evidence.corpus_store import open_corpus
from evidence.graph import same_entity
from evidence.mentions import Mention, PassageAnnotation, SentenceAnnotation
from evidence.paths import UNRELIABLE_LABELS
from evidence.pipeline import EvidencePipeline
from evidence.retrieval import build_retriever

BLANK = "___"
QUESTION = 'Which name fills the blank in "{sentence}"?'
MIN_WORDS, MAX_WORDS = 6, 40
BATCH_PASSAGES = 64  # passages annotated and searched per batch
DATASET = "extraction"


@dataclass(frozen=True)
class Cloze:
    """A candidate task: passage `passage_id` titled `head` blanks `answer` in its question."""

    passage_id: str
    head: str
    answer: str
    question: str

    @property
    def answers(self) -> list[str]:
        return answer_aliases([self.answer])


def blanked(ann: PassageAnnotation, sentence: SentenceAnnotation, mention: Mention) -> str:
    """The sentence with the mention's characters replaced by `BLANK`, whitespace collapsed."""
    text = ann.text[sentence.start:mention.start] + BLANK + ann.text[mention.end:sentence.end]
    return " ".join(text.split())


def _usable(ann: PassageAnnotation, sentence: SentenceAnnotation, mention: Mention) -> bool:
    words = len(ann.text[sentence.start:sentence.end].split())
    return (MIN_WORDS <= words <= MAX_WORDS and mention.label not in UNRELIABLE_LABELS
            and bool(mention.text.strip()) and not same_entity(mention.key, ann.title_key))


def cloze_of(ann: Optional[PassageAnnotation], seed: int) -> tuple[Optional[Cloze], str]:
    """One candidate of a passage (a seeded choice among its usable mentions), or None and the reason."""
    if ann is None or not ann.title.strip():
        return None, "no_sentence"
    pairs = [(s, m) for s in ann.sentences for m in s.mentions if _usable(ann, s, m)]
    if not pairs:
        return None, "no_sentence"
    sentence, mention = random.Random(f"{seed}:{ann.passage_id}").choice(pairs)
    cloze = Cloze(ann.passage_id, ann.title.strip(), mention.text.strip(),
                  QUESTION.format(sentence=blanked(ann, sentence, mention)))
    if any(echoes(a, [cloze.question, cloze.head]) for a in cloze.answers):
        return None, "echo"
    return cloze, ""


def to_record(cloze: Cloze, number: int) -> dict[str, Any]:
    """One line of the task file (labelled-questions JSONL with a guide)."""
    return {"id": f"{DATASET}-{number}", "question": cloze.question, "answers": cloze.answers,
            "guide": [cloze.head], "gold_ids": [cloze.passage_id], "dataset": DATASET}


def extraction_tasks(corpus: Corpus, retriever: Any, index: Any, n: int, k: int,
                     seed: int = 0) -> tuple[list[dict[str, Any]], Counter, int]:
    """Up to `n` task records, the rejections by reason, and the passages read.

    `retriever` has `search(queries, k) -> [[Hit]]`; `index` is an entity lookup with
    `prepare(ids)` and `annotation(id)` (evidence/entities.py or lazy_entities.py).
    """
    order = list(range(len(corpus)))
    random.Random(seed).shuffle(order)
    records: list[dict[str, Any]] = []
    reasons: Counter = Counter()
    read = 0
    for start in range(0, len(order), BATCH_PASSAGES):
        if len(records) >= n:
            break
        ids = [corpus.passages[i].id for i in order[start:start + BATCH_PASSAGES]]
        read += len(ids)
        index.prepare(ids)
        clozes = []
        for pid in ids:
            cloze, reason = cloze_of(index.annotation(pid), seed)
            if cloze is None:
                reasons[reason] += 1
            else:
                clozes.append(cloze)
        for cloze, hits in zip(clozes, retriever.search([c.head for c in clozes], k) if clozes else []):
            if cloze.passage_id not in [h.passage_id for h in list(hits)[:k]]:
                reasons["not_retrievable"] += 1
            elif len(records) < n:
                records.append(to_record(cloze, len(records)))
    return records, reasons, read


def write_tasks(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """The task file, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def generate(cfg: CoevoConfig, out: Path, n: int, seed: int) -> dict[str, Any]:
    """Build the corpus, retriever and entity index of `cfg`, write `n` tasks to `out`; the summary."""
    t0 = time.perf_counter()
    corpus = open_corpus(cfg.corpus)
    retriever = build_retriever(corpus, cfg.retrieval)
    index = EvidencePipeline.from_config(corpus, retriever, cfg.evidence).index
    records, reasons, read = extraction_tasks(corpus, retriever, index, n, cfg.ranker.top_k, seed)
    if not records:
        raise ValueError(f"no extraction task in corpus {corpus.name!r} ({read} passages read: {dict(reasons)})")
    write_tasks(out, records)
    return {"out": str(out), "corpus": corpus.name, "tasks": len(records), "passages_read": read, "k": cfg.ranker.top_k,
            "seed": seed, "rejected": dict(sorted(reasons.items())), "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse, generate, print the summary line; a bad option, override or corpus exits 2 naming it."""
    args = list(sys.argv[1:] if argv is None else argv)
    own, overrides = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    parser = argparse.ArgumentParser(prog="python -m evidence.extraction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="task file to write (JSONL)")
    parser.add_argument("--n", type=int, default=400, help="tasks to write (fewer when the corpus runs out)")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(own)
    if opts.n < 1:
        parser.error(f"--n must be at least 1, got {opts.n}")
    try:
        cfg = to_object(compose(overrides))
        summary = generate(cfg, opts.out, opts.n, opts.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"evidence.extraction: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
