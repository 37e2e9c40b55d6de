"""Batch front end of the evidence stage, as the co-evolution loop's evidence actor uses it.

    pipe = EvidencePipeline.from_config(corpus, retriever, cfg.evidence)
    verdicts = pipe.validate_targets(targets, reference_questions)   # docs/method.md §3.2
    paths = pipe.build_paths(targets, rng=seed)                       # docs/method.md §3.3
    paths = pipe.direct_paths(targets, support_ids)                   # or: generation=direct
    checks = pipe.validate_questions(questions, targets, paths_used)  # docs/method.md §3.4 (+ its options)
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from coevo.core.choices import Annotation
from coevo.core.config import EvidenceConfig
from coevo.core.types import EvidencePath, Verdict
from evidence.answer_type import answer_type_verdict
from evidence.corpus import Corpus
from evidence.entities import build_entity_index
from evidence.lazy_entities import EntityLookup, open_lazy_index
from evidence.paths import as_random, build_evidence_paths, direct_path
from evidence.task_checks import CHECKS, task_check_verdict
from evidence.validate import (
    check_target_form,
    open_question_verdict,
    retrievability_verdict,
    support_verdict,
    target_label,
    validate_question,
)


class EvidencePipeline:
    """Target validation, path building and question validation with one config."""

    def __init__(self, corpus: Corpus, retriever: Any, index: EntityLookup, cfg: Optional[EvidenceConfig] = None,
                 max_target_chars: int = 80, first_search_k: int = 10) -> None:
        self.corpus, self.retriever, self.index = corpus, retriever, index
        self.cfg = cfg if cfg is not None else EvidenceConfig()
        self.max_target_chars = max_target_chars  # proposer.max_target_chars lives in ProposerConfig
        # ranker.n_candidates (RankerConfig): what the solver's first search retrieves before the ranker picks.
        self.retrievable_k = self.cfg.retrievable_k if self.cfg.retrievable_k is not None else first_search_k

    @classmethod
    def from_config(cls, corpus: Corpus, retriever: Any, cfg: Optional[EvidenceConfig] = None,
                    max_target_chars: int = 80, cache_dir: Optional[str] = None,
                    first_search_k: int = 10) -> "EvidencePipeline":
        """Build (or load from the disk cache) the entity index named by `cfg.spacy_model`:
        eager (every passage annotated) or lazy (`cfg.annotation`, evidence/lazy_entities.py)."""
        cfg = cfg if cfg is not None else EvidenceConfig()
        index: EntityLookup
        if cfg.annotation == Annotation.lazy:
            index = open_lazy_index(corpus, cfg.spacy_model, cfg.stats_sample, cache_dir)
        else:
            index = build_entity_index(corpus, spacy_model=cfg.spacy_model, cache_dir=cache_dir)
        return cls(corpus, retriever, index, cfg, max_target_chars, first_search_k)

    def validate_targets(self, targets: Sequence[Any],
                         reference_questions: Optional[Sequence[Any]] = None) -> list[Verdict]:
        """One verdict per target; retrieval for all surviving targets runs as one batch."""
        refs = list(reference_questions) if reference_questions is not None else [None] * len(targets)
        refs += [None] * (len(targets) - len(refs))
        verdicts: list[Optional[Verdict]] = [None] * len(targets)
        labels: dict[int, str] = {}
        for i, (target, ref) in enumerate(zip(targets, refs)):
            rejection, label = check_target_form(target, self.index, ref, self.max_target_chars)
            if rejection is None:
                labels[i] = label
            else:
                verdicts[i] = rejection
        live = sorted(labels)
        results = self.retriever.search([targets[i].strip() for i in live], self.cfg.retrieve_k) if live else []
        for i, hits in zip(live, results):
            verdicts[i] = support_verdict(targets[i], hits, self.index, labels[i], self.cfg.support_head)
        return [v for v in verdicts if v is not None]

    def build_paths(self, targets: Sequence[Any], rng: Any = None) -> list[list[EvidencePath]]:
        """Certified paths per target. Each target gets its own seed drawn from `rng` in order,
        so a batch is reproducible under one seed."""
        rand = as_random(rng)
        seeds = [rand.randrange(2**63) for _ in targets]
        return [build_evidence_paths(t, self.retriever, self.index, max_hops=self.cfg.max_hops,
                                     branching=self.cfg.branching, rng=seed, retrieve_k=self.cfg.retrieve_k)
                for t, seed in zip(targets, seeds)]

    def direct_paths(self, targets: Sequence[str], support_ids: Sequence[Sequence[str]]) -> list[list[EvidencePath]]:
        """`proposer.generation=direct`: per target, the one-hop path to its first supporting
        passage (the target verdict's evidence); none when that passage is unknown."""
        out: list[list[EvidencePath]] = []
        for target, ids in zip(targets, support_ids):
            known = [pid for pid in ids if pid in self.corpus]
            out.append([direct_path(target, self.corpus[known[0]])] if known else [])
        return out

    def validate_questions(self, questions: Sequence[Any], targets: Sequence[Any],
                           paths: Sequence[EvidencePath]) -> list[Verdict]:
        """One verdict per (question, target, path) triple.

        With `evidence.open_question`, yes/no questions and ones holding a tag are rejected after the
        static checks (`open_question_verdict`). With `evidence.answer_type`, a question asking for a kind
        of answer its target's entity label rules out is rejected (evidence/answer_type.py). Then the
        label-free checks switched on (`evidence.meta_wording`, `head_subject`, `relation_support`:
        evidence/task_checks.py). With `evidence.retrievable`, the questions that pass
        the checks are searched as one batch for their top `evidence.retrievable_k` (default
        ranker.n_candidates, `first_search_k`: every passage the solver's first search could be shown,
        whatever the ranker picks) and must reach the answer.
        """
        verdicts = [validate_question(q, t, p, self.cfg.max_question_chars)
                    for q, t, p in zip(questions, targets, paths)]
        if self.cfg.open_question:
            verdicts = [open_question_verdict(v, q) for v, q in zip(verdicts, questions)]
        if self.cfg.answer_type:
            verdicts = [answer_type_verdict(v, q, target_label(str(t).strip(), self.index) if v.ok else None)
                        for v, q, t in zip(verdicts, questions, targets)]
        keys = {key for key, _, _ in CHECKS if getattr(self.cfg, key)}
        if keys:
            verdicts = [task_check_verdict(v, q, t, p, keys) for v, q, t, p in zip(verdicts, questions, targets, paths)]
        if not self.cfg.retrievable:
            return verdicts
        live = [i for i, v in enumerate(verdicts) if v.ok]
        k = self.retrievable_k
        results = self.retriever.search([questions[i].strip() for i in live], k) if live else []
        for i, hits in zip(live, results):
            verdicts[i] = retrievability_verdict(verdicts[i], targets[i], paths[i], list(hits)[:k], self.index)
        return verdicts
