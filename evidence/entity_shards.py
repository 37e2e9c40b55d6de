"""Resumable, multi-process entity annotation of a large corpus (`python -m evidence.build_index`).

spaCy over wiki-18 (21 M passages) takes hours, so the one-shot `build_entity_index` would lose
everything to a kill. Here the corpus is annotated in shards of `shard_passages` passages:
each shard is packed (`spacy_ner.pack`) and written atomically (`atomic_dir`) to
`<entry>.shards/<shard size>-<index>/` beside the cache entry, in the files of a cache entry
(`entities.write_files`). A rerun skips the shards already there. When all are done they are
merged (`spacy_ner.merge_packed`: unpack each in corpus order, pack once) into exactly the
entry `build_entity_index` writes, which then loads it; the shard directory is removed.

The whole build holds the entry's lock (`coevo.core.cache.cache_entry`), so two builders never
annotate the same shard; a killed builder's lock goes with its process.
"""
from __future__ import annotations

import multiprocessing
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator, Optional

from coevo.core.cache import cache_entry, is_complete
from coevo.core.io import atomic_dir
from coevo.core.progress import Progress, note
from evidence import spacy_ner
from evidence.corpus import Corpus, Passage
from evidence.entities import describe, entity_cache_path, read_files, write_files
from evidence.mentions import DEFAULT_SPACY_MODEL

ShardHook = Callable[[int], None]  # called with a shard's index once its files are in place


def shard_root(entry: Path) -> Path:
    """The directory of `entry`'s shards (beside it, so the entry's temp-dir cleanup leaves it alone)."""
    return entry.with_name(entry.name + ".shards")


def shard_ranges(n_passages: int, shard_passages: int) -> list[tuple[int, int]]:
    """[start, stop) of each shard, in corpus order."""
    if shard_passages < 1:
        raise ValueError(f"config key evidence.shard_passages={shard_passages}: expected >= 1")
    return [(a, min(a + shard_passages, n_passages)) for a in range(0, n_passages, shard_passages)]


def _shard_dir(root: Path, shard_passages: int, i: int) -> Path:
    # The size is in the name: shards of another size (a changed setting) are never mixed in.
    return root / f"{shard_passages}-{i:06d}"


def _is_done(path: Path, start: int, stop: int, corpus_hash: str) -> bool:
    """Whether `path` holds the finished shard [start, stop) of this corpus."""
    if not (path / "meta.json").is_file():
        return False
    meta = read_files(path)[3]
    return (meta.get("start"), meta.get("stop"), meta.get("corpus_hash")) == (start, stop, corpus_hash)


def annotate_shard(passages: list[Passage], model: str, batch_size: int, out: str, start: int,
                   corpus_hash: str) -> int:
    """Annotate one shard and write it to `out` atomically; returns its passage count (pool workers run this)."""
    records = spacy_ner.annotate_records(passages, model, 1, batch_size)
    arrays, vocab, labels = spacy_ner.pack(records, len(passages))
    with atomic_dir(out) as tmp:
        write_files(tmp, arrays, vocab, labels, {"start": start, "stop": start + len(passages),
                                                 "corpus_hash": corpus_hash, "spacy_model": model})
    return len(passages)


def _run_shards(corpus: Corpus, todo: list[tuple[int, int, int, Path]], model: str, workers: int,
                batch_size: int, progress: Progress, on_shard: Optional[ShardHook]) -> None:
    """Annotate the shards `todo` ((index, start, stop, dir)): in this process, or in `workers` processes."""
    if workers <= 1:
        for i, a, b, path in todo:
            progress.update(annotate_shard(corpus.passages[a:b], model, batch_size, str(path), a,
                                           corpus.content_hash))
            if on_shard is not None:
                on_shard(i)
        return
    # spawn, not fork: the parent may hold threads (torch, tokenizers) that a fork would copy half-way.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: dict[Future, int] = {}
        queue = iter(todo)
        for i, a, b, path in _take(queue, 2 * workers):  # a few shards ahead: passages are pickled per task
            pending[pool.submit(annotate_shard, corpus.passages[a:b], model, batch_size, str(path), a,
                                corpus.content_hash)] = i
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                progress.update(future.result())  # a worker's error stops the build here
                if on_shard is not None:
                    on_shard(pending[future])
                del pending[future]
            for i, a, b, path in _take(queue, len(done)):
                pending[pool.submit(annotate_shard, corpus.passages[a:b], model, batch_size, str(path), a,
                                    corpus.content_hash)] = i


def _take(queue: Iterator, n: int) -> list:
    return [item for _, item in zip(range(n), queue)]


def _parts(dirs: list[Path]) -> Iterator[tuple]:
    for path in dirs:  # one shard in memory at a time
        arrays, vocab, labels, _ = read_files(path)
        yield arrays, vocab, labels


def build_sharded(corpus: Corpus, spacy_model: Optional[str] = None, cache_dir: Optional[str] = None,
                  shard_passages: int = 10_000, workers: Optional[int] = None, batch_size: int = 64,
                  on_shard: Optional[ShardHook] = None, entry: Optional[Path] = None) -> dict:
    """Make the entity cache entry of `corpus` from shards; returns what was done.

    Keys of the result: `path` (the entry), `built` (False: it was already complete), `shards`,
    `reused` (finished shards a previous build left), `annotated`. `workers` defaults to
    `spacy_ner.default_processes`; `on_shard(i)` runs after shard i is written (tests stop a build there);
    `entry` replaces the entry's path (as in `build_entity_index`).
    """
    model = spacy_model or DEFAULT_SPACY_MODEL
    entry = entry if entry is not None else entity_cache_path(corpus, model, cache_dir)
    root = shard_root(entry)
    ranges = shard_ranges(len(corpus), shard_passages)
    workers = spacy_ner.default_processes(len(corpus)) if workers is None else max(1, workers)
    stats = {"path": str(entry), "built": False, "shards": len(ranges), "reused": 0, "annotated": 0}

    def build(tmp: Path) -> None:
        t0 = time.perf_counter()
        root.mkdir(parents=True, exist_ok=True)
        for child in root.iterdir():  # temp dirs of a killed builder (we hold the lock: none is live)
            if child.name.startswith(".tmp-"):
                shutil.rmtree(child, ignore_errors=True)
        dirs = [_shard_dir(root, shard_passages, i) for i in range(len(ranges))]
        todo = [(i, a, b, d) for i, ((a, b), d) in enumerate(zip(ranges, dirs))
                if not _is_done(d, a, b, corpus.content_hash)]
        stats["reused"], stats["annotated"] = len(ranges) - len(todo), len(todo)
        if stats["reused"]:
            note(f"entity annotation of corpus {corpus.name!r}: {stats['reused']} of {len(ranges)} shards "
                     f"already done in {root}")
        procs = max(1, min(workers, len(todo)))  # each process loads its own spaCy: none without a shard
        with Progress(f"entity annotation of corpus {corpus.name!r} ({procs} process(es))",
                      sum(b - a for _, a, b, _ in todo), "passages") as progress:
            _run_shards(corpus, todo, model, procs, batch_size, progress, on_shard)
        arrays, vocab, labels = spacy_ner.merge_packed(_parts(dirs), len(corpus))
        write_files(tmp, arrays, vocab, labels,
                    spacy_ner.index_meta(corpus, model, arrays, vocab, procs, time.perf_counter() - t0))

    stats["built"] = cache_entry(entry, build, describe(corpus))
    if is_complete(entry):  # the shards are in the entry now
        shutil.rmtree(root, ignore_errors=True)
    return stats
