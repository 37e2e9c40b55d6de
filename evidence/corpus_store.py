"""A corpus file packed once into memory-mapped arrays, shared by every process on the machine.

`load_corpus` turns a file into one `Passage` object per passage in each process that loads it:
at wiki-18 size (21M passages) that is tens of GB in the retrieval actor and again in the evidence
actor. `open_store` instead packs the validated passages once into `$COEVO_CACHE/corpora/<entry>/`
(a `cache_entry`: built under a lock, installed atomically, never seen half-made) and returns a
`MappedCorpus` over it. Its passages are decoded on access from files every process maps read-only,
so the page cache holds one copy per machine.

Entry files (n passages):
- `blob.bin`: the UTF-8 bytes of every passage's id, title and text, concatenated in corpus order;
- `offsets.i64`: 3n + 1 int64 offsets into the blob: field k (0 id, 1 title, 2 text) of passage i
  spans [offsets[3i + k], offsets[3i + k + 1]);
- `id_hash.u64` / `id_pos.i64`: the 64-bit blake2b hashes of the ids, sorted, and the passage each
  belongs to (id lookup: a binary search, then the id itself is compared);
- `meta.json`: name, source, passage count, content hash (equal to `Corpus.content_hash` of the same
  file, so every index keyed on it is shared with in-memory loads) and the loader's report counts.
The entry's name keys the source file's resolved path, size and modification time, and this format's
version: an edited file gets a new entry and never reads a stale one.
"""
from __future__ import annotations

import hashlib
import json
import os
from array import array
from pathlib import Path
from typing import Iterator, Optional, Sequence, overload

import numpy as np

from coevo.core.cache import cache_entry, is_complete
from coevo.core.config import CorpusConfig
from coevo.core.io import atomic_write_text, cache_root
from evidence.corpus import (
    MAX_PASSAGE_CHARS,
    Corpus,
    CorpusError,
    Passage,
    corpus_file,
    corpus_report,
    corpus_source,
    hash_passages,
    load_corpus,
    read_jsonl_passages,
)

STORE_VERSION = 1
FLUSH_EVERY = 1 << 16  # offsets buffered in memory before they are appended to offsets.i64


def string_hash(passage_id: str) -> int:
    """64-bit hash of a string (passage ids here, title keys in evidence/lazy_entities.py), stable across runs."""
    return int.from_bytes(hashlib.blake2b(passage_id.encode("utf-8"), digest_size=8).digest(), "little")


def store_path(source: str | os.PathLike, cache_dir: Optional[str] = None) -> Path:
    """The cache entry `open_store` uses for the corpus file `source` as it is now (it may not exist)."""
    path = Path(source).expanduser().resolve()
    try:
        stat = path.stat()
    except OSError as e:
        raise CorpusError(f"{path}: cannot read corpus file ({e})") from None
    key = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{MAX_PASSAGE_CHARS}\0{STORE_VERSION}"
    root = Path(cache_dir).expanduser() if cache_dir else cache_root() / "corpora"
    return root / f"{path.name.split('.')[0]}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _pack(source: Path, name: str, tmp: Path) -> None:
    """Stream the validated passages of `source` into the entry files of `tmp` (the module docstring)."""
    report = corpus_report(source)
    hashes, offsets, counted = array("Q"), array("q", [0]), [0]
    end = 0
    with open(tmp / "blob.bin", "wb") as blob, open(tmp / "offsets.i64", "wb") as off:
        def written() -> Iterator[Passage]:
            nonlocal end
            for p in read_jsonl_passages(source, report):
                for field in (p.id, p.title, p.text):
                    data = field.encode("utf-8")
                    blob.write(data)
                    end += len(data)
                    offsets.append(end)
                hashes.append(string_hash(p.id))
                counted[0] += 1
                if len(offsets) >= FLUSH_EVERY:
                    offsets.tofile(off)
                    del offsets[:]
                yield p

        content_hash = hash_passages(written())
        offsets.tofile(off)
    if not counted[0]:
        raise CorpusError(f"{source}: holds no passages" + (f" ({report.skipped_empty} with an empty text)"
                                                           if report.skipped_empty else ""))
    ids = np.frombuffer(hashes, dtype=np.uint64)
    order = np.argsort(ids, kind="stable")
    ids[order].tofile(tmp / "id_hash.u64")
    order.astype(np.int64).tofile(tmp / "id_pos.i64")
    report.records = counted[0]
    meta = {"version": STORE_VERSION, "name": name, "source": str(source),
            "n_passages": counted[0], "content_hash": content_hash,
            "report": report.summary()}
    atomic_write_text(tmp / "meta.json", json.dumps(meta))
    report.log()


def open_store(source: str, cache_dir: Optional[str] = None) -> "MappedCorpus":
    """The file corpus `source` (`wiki_mini` or a JSONL(.gz) path) as a `MappedCorpus`, packed first when
    its entry is not cached."""
    path, name = corpus_file(source)  # `source` of the corpus is the path as configured; its entry keys the real file
    built = cache_entry(store_path(path, cache_dir), lambda tmp: _pack(path, name, tmp),
                        f"the memory-mapped store of corpus {name!r} ({path})")
    corpus = MappedCorpus(store_path(path, cache_dir))
    corpus.from_cache = not built
    return corpus


def open_corpus(cfg: CorpusConfig, cache_dir: Optional[str] = None) -> Corpus:
    """The configured corpus: mapped from its store with `corpus.mmap` (file corpora), else in memory."""
    source = corpus_source(cfg)
    if cfg.mmap and source != "vital_articles":  # the embedded preset is one JSON document: always loaded
        return open_store(source, cache_dir)
    return load_corpus(source)


def stored_meta(source: str, cache_dir: Optional[str] = None) -> Optional[dict]:
    """`meta.json` of the cached store of the file corpus `source`; None when there is none (nothing is built)."""
    entry = store_path(corpus_file(source)[0], cache_dir)
    if not is_complete(entry):
        return None
    return json.loads((entry / "meta.json").read_text(encoding="utf-8"))


class PassageView(Sequence[Passage]):
    """The passages of a `MappedCorpus` in corpus order, decoded on access (a slice gives a list)."""

    def __init__(self, corpus: "MappedCorpus") -> None:
        self._corpus = corpus

    def __len__(self) -> int:
        return len(self._corpus)

    @overload
    def __getitem__(self, i: int) -> Passage: ...

    @overload
    def __getitem__(self, i: slice) -> list[Passage]: ...

    def __getitem__(self, i: int | slice) -> Passage | list[Passage]:
        if isinstance(i, slice):
            return [self._corpus.passage_at(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"passage index {i} out of range for corpus {self._corpus.name!r} ({n} passages)")
        return self._corpus.passage_at(i % n)

    def __iter__(self) -> Iterator[Passage]:
        return (self._corpus.passage_at(i) for i in range(len(self)))


class MappedCorpus(Corpus):
    """A `Corpus` over a packed store: same interface and content hash, passages decoded on access.

    Pickles as its entry path (a process that receives it maps the same files, nothing is copied).
    """

    def __init__(self, entry: str | os.PathLike) -> None:  # noqa: D107 - Corpus's own __init__ is not called
        self.entry = Path(entry)
        meta = json.loads((self.entry / "meta.json").read_text(encoding="utf-8"))
        if meta.get("version") != STORE_VERSION:
            raise CorpusError(f"{self.entry}: corpus store version {meta.get('version')}, expected {STORE_VERSION}")
        self.name, self.source, self._n = meta["name"], meta["source"], int(meta["n_passages"])
        self._hash = meta["content_hash"]
        self.report = None  # the counts of the packing run are in meta.json and were logged then
        self.from_cache = True
        self._blob = np.memmap(self.entry / "blob.bin", dtype=np.uint8, mode="r")
        self._offsets = np.memmap(self.entry / "offsets.i64", dtype=np.int64, mode="r")
        self._hashes = np.memmap(self.entry / "id_hash.u64", dtype=np.uint64, mode="r")
        self._pos = np.memmap(self.entry / "id_pos.i64", dtype=np.int64, mode="r")
        if len(self._offsets) != 3 * self._n + 1 or len(self._hashes) != self._n:
            raise CorpusError(f"{self.entry}: corpus store files do not hold {self._n} passages (meta.json)")
        self.passages = PassageView(self)  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (MappedCorpus, (str(self.entry),))

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Passage]:
        return iter(self.passages)

    def _field(self, k: int) -> str:
        return bytes(self._blob[self._offsets[k]:self._offsets[k + 1]]).decode("utf-8")

    def passage_at(self, i: int) -> Passage:
        """The passage at position `i` of corpus order."""
        return Passage(self._field(3 * i), self._field(3 * i + 1), self._field(3 * i + 2))

    def title_at(self, i: int) -> str:
        return self._field(3 * i + 1)

    def _find(self, passage_id: str) -> Optional[int]:
        h = np.uint64(string_hash(passage_id))
        j = int(np.searchsorted(self._hashes, h, side="left"))
        while j < self._n and self._hashes[j] == h:  # 64-bit collisions: compare the ids themselves
            pos = int(self._pos[j])
            if self._field(3 * pos) == passage_id:
                return pos
            j += 1
        return None

    def __getitem__(self, passage_id: str) -> Passage:
        pos = self._find(passage_id)
        if pos is None:
            raise KeyError(f"passage id {passage_id!r} is not in corpus {self.name!r}")
        return self.passage_at(pos)

    def __contains__(self, passage_id: object) -> bool:
        return isinstance(passage_id, str) and self._find(passage_id) is not None

    def index_of(self, passage_id: str) -> int:
        pos = self._find(passage_id)
        if pos is None:
            raise KeyError(passage_id)
        return pos

    @property
    def content_hash(self) -> str:
        return self._hash
