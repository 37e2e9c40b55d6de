"""Lazy entity annotation: spaCy runs only on the passages retrieval reaches (`evidence.annotation=lazy`).

The eager `EntityIndex` annotates every passage before the evidence actor is ready: ~36
passages/s per core here, so about a week of one core for wiki-18's 21M passages.
`LazyEntityIndex` answers the same questions the evidence stage asks, from three parts:
- **annotations** (`annotation`, `prepare`): a passage is annotated the first time it is
  reached, in one spaCy batch per retrieval round (`prepare`, called by the path builder),
  and its record is kept in the machine-wide `AnnotationStore` (evidence/annotation_store.py),
  so every later run, actor and replica reads it instead. The record is what the eager pass
  produces for that passage (same `spacy_ner.annotate_records`), so the graph and the paths
  are the same (tests/evidence/test_lazy_entities.py checks it on wiki_mini passages).
- **corpus statistics** (`document_frequency` for the hub filter, `entity_label` for target
  types): read from the eager entity index of a uniform sample of `evidence.stats_sample`
  passages (seeded), document frequencies scaled by corpus size / sample size. A corpus no
  larger than the sample is its own sample, so there they are exact. At 20,000 passages a
  1%-of-corpus hub is ~200 sampled mentions (±7% relative, one standard deviation).
  An entity the sample never mentions has no corpus label (the validator then asks spaCy
  about the target itself, as it does for any unknown entity).
- **titles** (`passage_for_title`): a table of 64-bit hashes of every passage's title key,
  built from the titles alone (no spaCy), same first-passage rule as the eager index.

The sample's index and the title table are cache entries (`coevo.core.cache`): built once by
`python -m evidence.build_index` (evidence.annotation=lazy) or, for a corpus under
`evidence.build_in_run_max_passages`, by the first run that needs them.
"""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from coevo.core.cache import cache_entry
from evidence import spacy_ner
from evidence.annotation_store import AnnotationStore, to_annotation
from evidence.corpus import Corpus, CorpusDigest
from evidence.corpus_store import string_hash
from evidence.entities import (
    MEMO_PASSAGES,
    EntityIndex,
    annotator_tag,
    build_entity_index,
    entities_root,
    entity_cache_path,
)
from evidence.mentions import DEFAULT_SPACY_MODEL, PassageAnnotation, normalize_entity, title_key

STATS_SEED = 0  # the sample is part of the cache key through its content hash; the seed fixes it


def sample_corpus(corpus: Corpus, size: int, seed: int = STATS_SEED) -> Corpus:
    """`size` passages drawn uniformly without replacement (corpus order kept); the corpus itself when smaller."""
    if size < 1:
        raise ValueError(f"config key evidence.stats_sample={size}: expected >= 1")
    if size >= len(corpus):
        return corpus
    rows = sorted(random.Random(seed).sample(range(len(corpus)), size))
    return Corpus([corpus.passages[i] for i in rows], name=f"{corpus.name}-sample{size}", source=corpus.source)


def stats_entry_path(corpus: Corpus | CorpusDigest, spacy_model: Optional[str] = None, size: int = 20_000,
                     cache_dir: Optional[str] = None) -> Path:
    """The entity index entry of the corpus's sample: keyed by the corpus, so a digest (no passages
    read) names it; the corpus's own entry when the sample is the whole corpus."""
    model = spacy_model or DEFAULT_SPACY_MODEL
    if size >= len(corpus):
        return entity_cache_path(corpus, model, cache_dir)  # type: ignore[arg-type]  # a digest has what keys need
    return entities_root(cache_dir) / f"{annotator_tag(model)}-{corpus.content_hash[:16]}-sample{size}-seed{STATS_SEED}"


def build_stats(corpus: Corpus, spacy_model: Optional[str] = None, size: int = 20_000,
                cache_dir: Optional[str] = None) -> EntityIndex:
    """The eager entity index of the corpus's sample (cached, or annotated here in one process)."""
    return build_entity_index(sample_corpus(corpus, size), spacy_model, cache_dir,
                              entry=stats_entry_path(corpus, spacy_model, size, cache_dir))


class TitleTable:
    """Title key → first passage with that title key, as sorted 64-bit hashes (mapped from disk)."""

    def __init__(self, corpus: Corpus, path: Path) -> None:
        self.corpus, self.path = corpus, path
        with np.load(path / "titles.npz", allow_pickle=False) as z:
            self._hashes, self._rows = z["hashes"], z["rows"]

    def first_passage(self, key: str) -> Optional[int]:
        """Position of the first passage whose title key is `key` (None when none is)."""
        if not key:
            return None
        h = np.uint64(string_hash(key))
        j = int(np.searchsorted(self._hashes, h))
        while j < len(self._hashes) and self._hashes[j] == h:  # a 64-bit collision: check the title itself
            row = int(self._rows[j])
            if title_key(self.corpus.title_at(row)) == key:
                return row
            j += 1
        return None


def title_table_path(corpus: Corpus | CorpusDigest, cache_dir: Optional[str] = None) -> Path:
    return entities_root(cache_dir) / f"titles-{corpus.content_hash[:16]}"


def build_title_table(corpus: Corpus, cache_dir: Optional[str] = None) -> TitleTable:
    """The corpus's title table, from its cache entry (built here, once, when missing)."""
    path = title_table_path(corpus, cache_dir)

    def build(tmp: Path) -> None:
        first: dict[int, int] = {}
        last_title, key = None, ""
        for i in range(len(corpus)):
            title = corpus.title_at(i)
            if title != last_title:  # wiki-18's passages come in runs of one article's chunks
                last_title, key = title, title_key(title)
                if key:
                    first.setdefault(string_hash(key), i)
        hashes = np.fromiter(first.keys(), dtype=np.uint64, count=len(first))
        rows = np.fromiter(first.values(), dtype=np.int64, count=len(first))
        order = np.argsort(hashes, kind="stable")
        np.savez(tmp / "titles.npz", hashes=hashes[order], rows=rows[order])

    cache_entry(path, build, f"the title table of corpus {corpus.name!r} ({len(corpus)} passages)")
    return TitleTable(corpus, path)


def lazy_store_path(corpus: Corpus, spacy_model: Optional[str] = None, cache_dir: Optional[str] = None) -> Path:
    """The directory of the corpus's lazily made annotation records."""
    model = spacy_model or DEFAULT_SPACY_MODEL
    return entities_root(cache_dir) / f"lazy-{annotator_tag(model)}-{corpus.content_hash[:16]}"


class LazyEntityIndex:
    """What `EntityIndex` answers for the evidence stage, with passages annotated on first reach."""

    def __init__(self, corpus: Corpus, stats: EntityIndex, titles: TitleTable, store: AnnotationStore,
                 batch_size: int = 64) -> None:
        self.corpus, self.stats, self.titles, self.store = corpus, stats, titles, store
        self.model_name, self.model_version = stats.model_name, stats.model_version
        self.batch_size = batch_size
        # exact when the sample is the corpus; else counts in the sample scale to the corpus
        self.scale = 1.0 if stats.corpus is corpus else len(corpus) / len(stats.corpus)
        self.annotated = 0  # passages this process ran spaCy on (the rest came from the store)
        self.from_cache, self.build_s, self.path = stats.from_cache, 0.0, store.root
        self.meta = {**stats.meta, "annotation": "lazy", "stats_passages": len(stats.corpus)}
        self._memo: dict[str, PassageAnnotation] = {}
        self.derived: dict[str, dict] = {}  # graph.py memoizes per-passage pairs here, as on EntityIndex

    def __contains__(self, entity: object) -> bool:
        """Whether the sample mentions the entity or some passage's title names it."""
        return entity in self.stats or self.passage_for_title(entity) is not None  # type: ignore[arg-type]

    @property
    def nlp(self) -> Any:
        return spacy_ner.load_nlp(self.model_name)

    def prepare(self, passage_ids: Iterable[str]) -> None:
        """Annotate the passages among `passage_ids` that no process has annotated yet, in one spaCy batch."""
        want: dict[int, str] = {}
        for pid in passage_ids:
            if isinstance(pid, str) and pid not in self._memo and pid in self.corpus:
                want[self.corpus.index_of(pid)] = pid
        if not want:
            return
        records = self.store.get(want)
        missing = sorted(set(want) - set(records))
        if missing:
            passages = [self.corpus.passages[i] for i in missing]
            fresh = dict(zip(missing, spacy_ner.annotate_records(passages, self.model_name, 1, self.batch_size)))
            self.store.put(fresh)
            records.update(fresh)
            self.annotated += len(missing)
        if len(self._memo) + len(records) > MEMO_PASSAGES:  # bound memory in a long-lived evidence actor
            self._memo.clear()
        for i, record in records.items():
            self._memo[want[i]] = to_annotation(self.corpus.passages[i], record)

    def annotation(self, passage_id: str) -> Optional[PassageAnnotation]:
        """Sentences and mentions of one passage (None for an id the corpus lacks); annotates it if needed."""
        if not isinstance(passage_id, str):
            return None
        ann = self._memo.get(passage_id)
        if ann is None:
            self.prepare([passage_id])
            ann = self._memo.get(passage_id)
        return ann

    def document_frequency(self, entity: str) -> int:
        """Passages mentioning the entity: counted in the sample, scaled to the corpus."""
        return int(round(self.stats.document_frequency(entity) * self.scale))

    def entity_label(self, entity: str) -> Optional[str]:
        """Most frequent label of the entity in the sample (None when the sample never mentions it)."""
        return self.stats.entity_label(entity)

    def passage_for_title(self, title: str) -> Optional[str]:
        """Id of the first passage titled `title` (compared as entity keys), else None."""
        row = self.titles.first_passage(title_key(title))
        if row is None:
            row = self.titles.first_passage(normalize_entity(title))
        return None if row is None else self.corpus.passages[row].id

    def annotate_text(self, text: str) -> list:
        """Mentions in a free text (not a corpus passage); runs spaCy."""
        return self.stats.annotate_text(text)


# What the evidence stage (graph, paths, validation) reads entities from: either index answers it.
EntityLookup = EntityIndex | LazyEntityIndex


def open_lazy_index(corpus: Corpus, spacy_model: Optional[str] = None, stats_sample: int = 20_000,
                    cache_dir: Optional[str] = None) -> LazyEntityIndex:
    """The lazy index of `corpus`: its sample's entity index and its title table (cached or built here)."""
    model = spacy_model or DEFAULT_SPACY_MODEL
    t0 = time.perf_counter()
    stats = build_stats(corpus, model, stats_sample, cache_dir)
    titles = build_title_table(corpus, cache_dir)
    store = AnnotationStore(lazy_store_path(corpus, model, cache_dir),
                            {"corpus": corpus.name, "corpus_hash": corpus.content_hash, "spacy_model": model,
                             "annotator": annotator_tag(model)})
    index = LazyEntityIndex(corpus, stats, titles, store)
    index.build_s = time.perf_counter() - t0
    return index
