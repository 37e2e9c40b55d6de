"""Per-passage entity annotations on disk, shared by processes: the lazy index's cache.

`evidence.annotation=lazy` annotates a passage the first time retrieval reaches it
(evidence/lazy_entities.py). The records (`spacy_ner.annotate_records`'s `(title key,
sentences)`, passage text left out) are kept here, so a passage is annotated once per
machine, whichever run, actor or replica reaches it first.

Why SQLite files: several evidence actors (and runs) add records at once and read each
other's. An SQLite transaction is atomic and survives SIGKILL of the writer (WAL mode: a torn
write is rolled back on the next open), readers never block on writers, and a row is
readable by every process the moment its transaction commits. Records are sharded by
passage index into files of `BLOCK_PASSAGES` rows (`block-000012.sqlite`: passages
12,000,000-12,999,999), so one file stays small and writers to different blocks never wait
on each other. Rows are only ever inserted (`INSERT OR IGNORE`: annotation is deterministic,
so a second writer of the same passage has nothing to add); nothing is updated or deleted.

A row that does not decode (a hand edit, another program) is an error naming the file and
the passage, never silently re-annotated. SQLite's locking is unreliable on network
filesystems: on a cluster whose `$COEVO_CACHE` is an NFS mount, each node should keep this
store on local disk (`COEVO_CACHE` per node); the other cache entries are fine shared.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

from coevo.core.io import atomic_write_text
from evidence.corpus import Passage
from evidence.mentions import Mention, PassageAnnotation, SentenceAnnotation

BLOCK_PASSAGES = 1_000_000  # rows per database file
BUSY_TIMEOUT_S = 120.0  # a writer waits this long for another process's transaction before failing
Record = tuple[str, list]  # (title key, [(start, end, [(x, y, label, key), ...], [linker offsets]), ...])


class AnnotationStoreError(RuntimeError):
    """A stored record does not decode; the message names the file and the passage."""


def encode_record(record: Record) -> str:
    """The JSON text of one record (tuples become lists; `decode_record` reads either)."""
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def _check_sentence(s: Any) -> None:
    a, b, spans, links = s
    if not (isinstance(a, int) and isinstance(b, int) and isinstance(spans, list) and isinstance(links, list)):
        raise ValueError("a sentence is [start, end, [mentions], [linkers]]")
    for x, y, label, key in spans:
        if not (isinstance(x, int) and isinstance(y, int) and isinstance(label, str) and isinstance(key, str)):
            raise ValueError("a mention is [start, end, label, key]")
    if not all(isinstance(i, int) for i in links):
        raise ValueError("linkers are character offsets")


def decode_record(text: str, where: str) -> Record:
    """One record from its JSON text; AnnotationStoreError naming `where` when it is not one."""
    try:
        t_key, sentences = json.loads(text)
        if not isinstance(t_key, str) or not isinstance(sentences, list):
            raise ValueError("a record is [title key, [sentences]]")
        for s in sentences:
            _check_sentence(s)
    except (ValueError, TypeError) as e:
        raise AnnotationStoreError(f"{where}: not an annotation record ({e}); delete the file to annotate its "
                                   "passages again") from None
    return t_key, sentences


def to_annotation(passage: Passage, record: Record) -> PassageAnnotation:
    """The passage's annotation from its record (what `EntityIndex.annotation` returns for it)."""
    t_key, sentences = record
    text = passage.text
    sents = []
    for i, (a, b, spans, links) in enumerate(sentences):
        mentions = tuple(Mention(text[x:y], label, key, x, y) for x, y, label, key in spans)
        sents.append(SentenceAnnotation(i, a, b, text[a:b], mentions, tuple(links)))
    return PassageAnnotation(passage.id, passage.title, t_key, text, tuple(sents))


class AnnotationStore:
    """Records by corpus passage index in `root/block-*.sqlite`; safe to share between processes."""

    def __init__(self, root: str | os.PathLike, meta: Mapping[str, Any], block: int = BLOCK_PASSAGES) -> None:
        """`meta` (what the records are: corpus, model, annotator) is written to `root/meta.json` once."""
        self.root, self.block = Path(root), int(block)
        self.root.mkdir(parents=True, exist_ok=True)
        if not (self.root / "meta.json").is_file():
            atomic_write_text(self.root / "meta.json", json.dumps(dict(meta), indent=1))
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._conns: dict[int, sqlite3.Connection] = {}

    def _file(self, b: int) -> Path:
        return self.root / f"block-{b:06d}.sqlite"

    def _conn(self, b: int) -> sqlite3.Connection:
        if self._pid != os.getpid():  # a forked child must not share its parent's connections
            self._conns, self._pid = {}, os.getpid()
        conn = self._conns.get(b)
        if conn is None:
            conn = sqlite3.connect(self._file(b), timeout=BUSY_TIMEOUT_S, check_same_thread=False,
                                   isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: consistent after any crash
                conn.execute("CREATE TABLE IF NOT EXISTS ann (p INTEGER PRIMARY KEY, rec TEXT NOT NULL)")
            except sqlite3.DatabaseError as e:
                conn.close()
                raise AnnotationStoreError(f"{self._file(b)}: not an annotation store ({e}); delete the file to "
                                           "annotate its passages again") from None
            self._conns[b] = conn
        return conn

    def _blocks(self, indexes: Iterable[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for i in indexes:
            out.setdefault(int(i) // self.block, []).append(int(i))
        return out

    def get(self, indexes: Iterable[int]) -> dict[int, Record]:
        """The stored records among `indexes` (absent ones are left out)."""
        found: dict[int, Record] = {}
        with self._lock:
            for b, rows in self._blocks(indexes).items():
                if not self._file(b).is_file():
                    continue
                conn = self._conn(b)
                for start in range(0, len(rows), 500):  # SQLite's bound-parameter limit
                    chunk = rows[start:start + 500]
                    marks = ",".join("?" * len(chunk))
                    for p, text in conn.execute(f"SELECT p, rec FROM ann WHERE p IN ({marks})", chunk):
                        found[p] = decode_record(text, f"{self._file(b)}: passage index {p}")
        return found

    def put(self, records: Mapping[int, Record]) -> None:
        """Store records (one transaction per block file); passages already stored keep theirs."""
        with self._lock:
            for b, rows in self._blocks(records).items():
                conn = self._conn(b)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    conn.executemany("INSERT OR IGNORE INTO ann (p, rec) VALUES (?, ?)",
                                     [(p, encode_record(records[p])) for p in rows])
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise

    def count(self) -> int:
        """Records stored, over every block file."""
        with self._lock:
            blocks = sorted(int(f.stem.split("-")[1]) for f in self.root.glob("block-*.sqlite"))
            return sum(self._conn(b).execute("SELECT COUNT(*) FROM ann").fetchone()[0] for b in blocks)

    def close(self) -> None:
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns = {}
