"""Entity mentions and the cached per-corpus entity index (docs/method.md §3.3).

`normalize_entity` is the one entity normalizer (built on the docs/method.md §5.4 answer normalization).
`build_entity_index(corpus)` runs spaCy once over a corpus and stores, per passage, the
sentence spans, the entity mentions of each sentence (label + normalized key) and the
offsets of the verb/preposition tokens the graph needs for its relation cues. The result
is written under `$COEVO_CACHE/entities/` keyed by corpus hash and spaCy model
name+version, as numpy arrays (`allow_pickle=False`) plus one JSON vocabulary, so a
second build only loads (no spaCy import at all). A large corpus's entry is made beforehand,
in resumable shards, by `python -m evidence.build_index` (evidence/entity_shards.py).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np

from coevo.core.cache import cache_entry
from coevo.core.io import cache_root
from evidence import spacy_ner
from evidence.corpus import Corpus
from evidence.mentions import (
    ANNOTATOR_VERSION,
    DEFAULT_SPACY_MODEL,
    Mention,
    PassageAnnotation,
    SentenceAnnotation,
    normalize_entity,
    title_key,
)

MEMO_PASSAGES = 50_000  # decoded passage annotations kept in memory


def describe(corpus: Corpus) -> str:
    """What an entity cache entry holds, as lock waiters and markers say it."""
    return f"the entity annotations of corpus {corpus.name!r} ({len(corpus)} passages)"


class EntityIndex:
    """Per-passage sentence/mention annotations of a corpus and the entity → passage maps."""

    def __init__(self, corpus: Corpus, arrays: dict[str, np.ndarray], vocab: list[str], labels: list[str],
                 meta: dict[str, Any]) -> None:
        self.corpus = corpus
        self.model_name: str = meta["spacy_model"]
        self.model_version: str = meta["spacy_version"]
        self.meta = meta
        self.vocab = vocab
        self.labels = labels
        self.from_cache = False
        self.build_s = 0.0
        self.path: Optional[Path] = None
        # Plain lists: per-item numpy scalar access is slower than list indexing in hot loops.
        self._sent_ptr = arrays["sent_ptr"].tolist()
        self._sent_span = arrays["sent_span"]
        self._ment_ptr = arrays["ment_ptr"].tolist()
        self._ment = arrays["ment"]
        self._link_ptr = arrays["link_ptr"].tolist()
        self._link = arrays["link"]
        self._ent_ptr = arrays["ent_ptr"]
        self._ent_pass = arrays["ent_pass"]
        self._ent_label = arrays["ent_label"]
        self._title_ent = arrays["title_ent"]
        self._ent_id = {k: i for i, k in enumerate(vocab)}
        self._title_passage: dict[str, int] = {}
        for p, e in enumerate(self._title_ent.tolist()):
            self._title_passage.setdefault(vocab[e], p)
        self._memo: dict[str, PassageAnnotation] = {}
        # Per-passage data consumers derive from annotations (graph.py memoizes edge pairs here).
        self.derived: dict[str, dict] = {}

    def __len__(self) -> int:
        return len(self.vocab)

    def __contains__(self, entity: object) -> bool:
        """Whether the entity is mentioned in, or titles, some passage."""
        key = normalize_entity(entity)
        return bool(key) and key in self._ent_id

    @property
    def nlp(self) -> Any:
        """The spaCy pipeline (loaded on first use; a cache hit never needs it for paths)."""

        return spacy_ner.load_nlp(self.model_name)

    def annotation(self, passage_id: str) -> Optional[PassageAnnotation]:
        """Sentences and mentions of one passage (None for an id the corpus lacks)."""
        if not isinstance(passage_id, str):
            return None
        ann = self._memo.get(passage_id)
        if ann is None and passage_id in self.corpus:
            if len(self._memo) >= MEMO_PASSAGES:  # bound memory in a long-lived evidence actor
                self._memo.clear()
            ann = self._memo[passage_id] = self._decode(self.corpus.index_of(passage_id))
        return ann

    def prepare(self, passage_ids: Iterable[str]) -> None:
        """Nothing to do: every passage is annotated already (a lazy index annotates them here)."""

    def _decode(self, p: int) -> PassageAnnotation:
        passage = self.corpus.passages[p]
        text, vocab, labels = passage.text, self.vocab, self.labels
        sentences = []
        for s in range(self._sent_ptr[p], self._sent_ptr[p + 1]):
            start, end = self._sent_span[s].tolist()
            mentions = tuple(Mention(text[a:b], labels[lab], vocab[e], a, b)
                             for a, b, lab, e in self._ment[self._ment_ptr[s]:self._ment_ptr[s + 1]].tolist())
            linkers = tuple(self._link[self._link_ptr[s]:self._link_ptr[s + 1]].tolist())
            sentences.append(SentenceAnnotation(s - self._sent_ptr[p], start, end, text[start:end], mentions, linkers))
        return PassageAnnotation(passage.id, passage.title, self.vocab[int(self._title_ent[p])], text,
                                 tuple(sentences))

    def passages_mentioning(self, entity: str) -> list[str]:
        """Ids of passages whose text mentions the entity (by normalized key), corpus order."""
        e = self._ent_id.get(normalize_entity(entity))
        if e is None:
            return []
        rows = self._ent_pass[self._ent_ptr[e]:self._ent_ptr[e + 1]].tolist()
        return [self.corpus.passages[p].id for p in rows]

    def document_frequency(self, entity: str) -> int:
        """Number of passages mentioning the entity (0 when unknown)."""
        e = self._ent_id.get(normalize_entity(entity))
        return 0 if e is None else int(self._ent_ptr[e + 1] - self._ent_ptr[e])

    def passage_for_title(self, title: str) -> Optional[str]:
        """Id of the first passage titled `title` (compared as entity keys), else None."""
        key = title_key(title)
        if not key:  # untitled passages share the empty key; it names nothing
            return None
        p = self._title_passage.get(key)
        if p is None:
            p = self._title_passage.get(normalize_entity(title))
        return None if p is None else self.corpus.passages[p].id

    def entity_label(self, entity: str) -> Optional[str]:
        """Most frequent label of the entity in the corpus (None when never mentioned)."""
        e = self._ent_id.get(normalize_entity(entity))
        if e is None:
            return None
        lab = int(self._ent_label[e])
        return self.labels[lab] if lab >= 0 else None

    def annotate_text(self, text: str) -> list[Mention]:
        """Mentions in a free text (not a corpus passage), e.g. a proposed target; runs spaCy."""

        if not isinstance(text, str) or not text.strip():
            return []
        return spacy_ner.extract_mentions(self.nlp(text[:10_000]), title="")


def entities_root(cache_dir: Optional[str] = None) -> Path:
    """Where entity caches live: `cache_dir`, else `$COEVO_CACHE/entities`."""
    return Path(cache_dir).expanduser() if cache_dir else cache_root() / "entities"


def annotator_tag(model: str, version: Optional[str] = None) -> str:
    """spaCy model, its version and our annotator version: what annotations depend on besides the text."""
    safe_model = re.sub(r"[^\w.-]", "_", model)
    return f"{safe_model}-{version or spacy_ner.model_version(model)}-{ANNOTATOR_VERSION}"


def _cache_dir(corpus: Corpus, model: str, version: str, cache_dir: Optional[str]) -> Path:
    return entities_root(cache_dir) / f"{annotator_tag(model, version)}-{corpus.content_hash[:16]}"


def entity_cache_path(corpus: Corpus, spacy_model: Optional[str] = None, cache_dir: Optional[str] = None) -> Path:
    """The cache entry `build_entity_index` reads or writes for these arguments (it may not exist)."""
    model = spacy_model or DEFAULT_SPACY_MODEL
    return _cache_dir(corpus, model, spacy_ner.model_version(model), cache_dir)


def read_files(path: Path) -> tuple[dict[str, np.ndarray], list[str], list[str], dict[str, Any]]:
    """Arrays, vocabulary, labels and meta of a directory written by `write_files`."""
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    strings = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, strings["vocab"], strings["labels"], meta


def _load(path: Path, corpus: Corpus) -> EntityIndex:
    """The index in the complete cache entry `path` (checked by `cache_entry`)."""
    arrays, vocab, labels, meta = read_files(path)
    if meta.get("corpus_hash") != corpus.content_hash:
        # The entry name holds 16 hex digits of the hash; the full one differs only by a collision
        # or a hand edit, and a complete entry is never rebuilt in place (readers may be using it).
        raise RuntimeError(f"entity cache entry {path} was built for another corpus ({meta.get('corpus')!r}); "
                           "delete it to rebuild")
    return EntityIndex(corpus, arrays, vocab, labels, meta)


def write_files(directory: Path, arrays: dict[str, np.ndarray], vocab: list[str], labels: list[str],
                meta: dict[str, Any]) -> None:
    """The files of an entity index (a cache entry, or one shard of evidence/entity_shards.py)."""
    # Uncompressed npz: loading is a memcpy; compression would cost more than it saves here.
    np.savez(directory / "arrays.npz", **arrays)
    (directory / "vocab.json").write_text(json.dumps({"vocab": vocab, "labels": labels}, ensure_ascii=False),
                                          encoding="utf-8")
    (directory / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")


def build_entity_index(corpus: Corpus, spacy_model: Optional[str] = None, cache_dir: Optional[str] = None,
                       n_process: Optional[int] = None, batch_size: int = 64,
                       entry: Optional[Path] = None) -> EntityIndex:
    """Entity index of `corpus`: loaded from the disk cache, or built with spaCy and cached.

    `cache_dir` replaces the cache root (default `$COEVO_CACHE/entities`); `n_process`
    defaults to `spacy_ner.default_processes` (1 on machines with fewer than 4 cores).
    Parallel callers share one build (`coevo.core.cache`); the build shows its progress.
    `entry` replaces the entry's path (a lazy index's sample: evidence/lazy_entities.py).
    """
    model = spacy_model or DEFAULT_SPACY_MODEL
    t0 = time.perf_counter()
    path = entry if entry is not None else entity_cache_path(corpus, model, cache_dir)
    built: list[EntityIndex] = []

    def build(tmp: Path) -> None:
        arrays, vocab, labels, meta = spacy_ner.annotate_corpus(corpus, model, n_process=n_process,
                                                                batch_size=batch_size)
        write_files(tmp, arrays, vocab, labels, meta)
        built.append(EntityIndex(corpus, arrays, vocab, labels, meta))

    cache_entry(path, build, describe(corpus))
    index = built[0] if built else _load(path, corpus)
    index.from_cache = not built
    index.path = path
    index.build_s = time.perf_counter() - t0
    return index
