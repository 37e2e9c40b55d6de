"""One-hop extraction tasks written from the corpus itself (label-free): the solver's warm-start.

    python -m evidence.extraction --out FILE [--n 400] [--seed 0] [--split train|heldout]
                                  [--heldout-share 0.2] [-- COEVO_OVERRIDES...]

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
- (with a split) the sentence is not copied, word for word, on a page of the other split among
  the first `CROSS_K` passages a search for the sentence itself returns [cross_split].
Passages are visited in a seeded order and each picks its sentence and mention with its own
seeded generator, so a file is reproducible from (corpus, seed, split, config).

Page split (docs/method.md §4.8): a Wikipedia page is a passage title (wiki_mini's paragraphs of
one page share it; a vital_articles passage is a page), and `page_split` puts it in `heldout`
when the first 8 bytes of sha256(title, stripped, UTF-8), read as a fraction of 2**64, fall below
`--heldout-share`, else in `train`: a stable hash, so every process and machine splits alike.
`--split` keeps only the passages of that split's pages (default `train`, what the warm-start and
`solver.extraction_mix` train on), so a held-out task's gold passage is on a held-out page by
construction. What could still leak, and what is checked: the same sentence on pages of both
splits (a duplicated paragraph under two titles) is checked, as far as the search for it reaches
[cross_split]; the same fact worded differently on a page of the other split (H's sentence naming T
and T's page naming H) is not: a one-hop fact may be stated on both ends' pages. The corpus itself is
shared: a solver scored on held-out clozes searches training pages too.

The output is labelled-questions JSONL (coevo/core/inputs.py), written atomically:
    {"id", "question", "answers", "guide": [H], "gold_ids": [P], "dataset": "extraction",
     "page": H, "split": "train" | "heldout"}
It trains with `coevo.solve solve.data=FILE corpus=<this corpus> solver.guided_rollouts=true`
(the last rollout of each group replays the guide); the checkpoint starts a co-evolution run
with `solver.checkpoint=<checkpoint>/solver`. A held-out file is scored by `coevo.eval` (greedy,
one answer a task; the guide is not replayed there):
    python -m coevo.eval experiment=small_learning corpus=vital_articles mode=agent ranker.mode=none \
        data=heldout.jsonl out=heldout-eval.json [solver.checkpoint=<checkpoint>/solver]
Stdout is one JSON line: passages read, tasks written, rejections by reason, the split, its rule
and share, the passages of the split, seconds.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from coevo.core.cli import EXIT_REFUSED
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
TRAIN, HELDOUT = "train", "heldout"
SPLIT_RULE = "heldout when int(sha256(title.strip()).digest()[:8]) / 2**64 < heldout_share, else train"
HELDOUT_SHARE = 0.2
CROSS_K = 5  # passages of the search for a task's sentence checked for a copy on the other split's pages


def page_split(title: str, heldout_share: float) -> str:
    """`heldout` or `train` for the page titled `title` (`SPLIT_RULE`: the same in every process)."""
    digest = hashlib.sha256(title.strip().encode("utf-8")).digest()
    return HELDOUT if int.from_bytes(digest[:8], "big") / 2**64 < heldout_share else TRAIN


@dataclass(frozen=True)
class PageSplit:
    """The pages a task file is written from: split `name` of `page_split` at `heldout_share`."""

    name: str
    heldout_share: float = HELDOUT_SHARE

    def __post_init__(self) -> None:
        if self.name not in (TRAIN, HELDOUT):
            raise ValueError(f"split must be {TRAIN!r} or {HELDOUT!r}, got {self.name!r}")
        if not 0.0 < self.heldout_share < 1.0:
            raise ValueError(f"heldout share must be strictly between 0 and 1, got {self.heldout_share}")

    def holds(self, title: str) -> bool:
        return page_split(title, self.heldout_share) == self.name


@dataclass(frozen=True)
class Cloze:
    """A candidate task: passage `passage_id` titled `head` blanks `answer` in its question."""

    passage_id: str
    head: str
    answer: str
    question: str
    sentence: str  # the sentence before blanking, whitespace collapsed (the cross-split check)

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
                  QUESTION.format(sentence=blanked(ann, sentence, mention)), _collapsed(sentence.text))
    if any(echoes(a, [cloze.question, cloze.head]) for a in cloze.answers):
        return None, "echo"
    return cloze, ""


def _collapsed(text: str) -> str:
    return " ".join(text.split())


def to_record(cloze: Cloze, number: int, split: Optional[str] = None) -> dict[str, Any]:
    """One line of the task file (labelled-questions JSONL with a guide), with its page and split (if any)."""
    rec = {"id": f"{DATASET}-{number}", "question": cloze.question, "answers": cloze.answers,
           "guide": [cloze.head], "gold_ids": [cloze.passage_id], "dataset": DATASET, "page": cloze.head}
    return rec if split is None else {**rec, "split": split}


def copied_across(corpus: Corpus, retriever: Any, clozes: Sequence[Cloze], split: PageSplit) -> list[bool]:
    """Per cloze: whether its sentence stands, word for word, in a passage of the other split's pages among
    the first `CROSS_K` a search for the sentence returns (a duplicated paragraph under another title)."""
    out = []
    for cloze, hits in zip(clozes, retriever.search([c.sentence for c in clozes], CROSS_K) if clozes else []):
        others = [corpus[h.passage_id] for h in list(hits)[:CROSS_K]]
        out.append(any(not split.holds(p.title) and cloze.sentence in _collapsed(p.text) for p in others))
    return out


def extraction_tasks(corpus: Corpus, retriever: Any, index: Any, n: int, k: int, seed: int = 0,
                     split: Optional[PageSplit] = None) -> tuple[list[dict[str, Any]], Counter, int]:
    """Up to `n` task records, the rejections by reason, and the passages read.

    `retriever` has `search(queries, k) -> [[Hit]]`; `index` is an entity lookup with
    `prepare(ids)` and `annotation(id)` (evidence/entities.py or lazy_entities.py). With `split`,
    only the passages of its pages are read, and the records carry it.
    """
    order = list(range(len(corpus)))
    random.Random(seed).shuffle(order)
    if split is not None:
        order = [i for i in order if split.holds(corpus.title_at(i))]
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
        found = retriever.search([c.head for c in clozes], k) if clozes else []
        copied = copied_across(corpus, retriever, clozes, split) if split is not None else [False] * len(clozes)
        for cloze, hits, across in zip(clozes, found, copied):
            if cloze.passage_id not in [h.passage_id for h in list(hits)[:k]]:
                reasons["not_retrievable"] += 1
            elif across:
                reasons["cross_split"] += 1
            elif len(records) < n:
                records.append(to_record(cloze, len(records), split.name if split is not None else None))
    return records, reasons, read


def write_tasks(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """The task file, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def generate(cfg: CoevoConfig, out: Path, n: int, seed: int, split: PageSplit) -> dict[str, Any]:
    """Build the corpus, retriever and entity index of `cfg`, write `n` tasks of `split`'s pages to `out`;
    the summary."""
    t0 = time.perf_counter()
    corpus = open_corpus(cfg.corpus)
    retriever = build_retriever(corpus, cfg.retrieval)
    index = EvidencePipeline.from_config(corpus, retriever, cfg.evidence).index
    records, reasons, read = extraction_tasks(corpus, retriever, index, n, cfg.ranker.top_k, seed, split)
    if not records:
        raise ValueError(f"no extraction task in corpus {corpus.name!r}, split {split.name!r} ({read} passages read: "
                         f"{dict(reasons)})")
    write_tasks(out, records)
    in_split = sum(1 for i in range(len(corpus)) if split.holds(corpus.title_at(i)))
    return {"out": str(out), "corpus": corpus.name, "tasks": len(records), "passages_read": read, "k": cfg.ranker.top_k,
            "seed": seed, "split": split.name, "split_rule": SPLIT_RULE, "heldout_share": split.heldout_share,
            "split_passages": in_split, "corpus_passages": len(corpus), "rejected": dict(sorted(reasons.items())),
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse, generate, print the summary line; a bad option, override or corpus exits 2 naming it."""
    args = list(sys.argv[1:] if argv is None else argv)
    own, overrides = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    parser = argparse.ArgumentParser(prog="python -m evidence.extraction", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="task file to write (JSONL)")
    parser.add_argument("--n", type=int, default=400, help="tasks to write (fewer when the corpus runs out)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=[TRAIN, HELDOUT], default=TRAIN,
                        help="write tasks only from this split's pages (default train)")
    parser.add_argument("--heldout-share", type=float, default=HELDOUT_SHARE,
                        help=f"share of pages in the held-out split, in (0, 1) (default {HELDOUT_SHARE})")
    opts = parser.parse_args(own)
    if opts.n < 1:
        parser.error(f"--n must be at least 1, got {opts.n}")
    if not 0.0 < opts.heldout_share < 1.0:
        parser.error(f"--heldout-share must be strictly between 0 and 1, got {opts.heldout_share}")
    try:
        cfg = to_object(compose(overrides))
        summary = generate(cfg, opts.out, opts.n, opts.seed, PageSplit(opts.split, opts.heldout_share))
    except (ValueError, FileNotFoundError) as e:
        print(f"evidence.extraction: error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
