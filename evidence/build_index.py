"""`python -m evidence.build_index <overrides>`: build and cache every index a run needs, once, outside Ray.

The overrides are those of `coevo.run` (`corpus=jsonl corpus.path=… retrieval=e5_faiss …`);
what gets built is what a run with them would otherwise build inside its actors:
- with `corpus.mmap` (corpus=jsonl's default), the packed corpus store every actor maps
  (evidence/corpus_store.py);
- the retrieval index of `retrieval.backend` (bm25s, dense_minilm, dense_faiss: the backends'
  own cached builders; `rank_bm25` keeps nothing on disk, `http` is served elsewhere, and a
  `retrieval.faiss.index_path` file is used as it is);
- the entity index (evidence/entities.py), annotated in resumable shards of
  `evidence.shard_passages` passages by `evidence.build_workers` processes
  (evidence/entity_shards.py): a killed build reruns from the shards it finished. With
  `evidence.annotation=lazy` (evidence/lazy_entities.py) only a sample of
  `evidence.stats_sample` passages is annotated here, plus the corpus's title table: runs
  annotate the passages they reach.
Progress goes to stderr; the last line on stdout is one JSON object: per index kind its cache
path, bytes on disk, seconds and whether it was already cached.

`coevo.run` refuses to start when a corpus has more than `evidence.build_in_run_max_passages`
passages and an index it needs is not cached (`check_prebuilt`): at wiki-18 scale the build
takes hours, longer than the actors' readiness window (`ray.ready_timeout_s`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Any, Optional, Sequence

from coevo.core.cache import is_complete
from coevo.core.choices import Annotation
from coevo.core.cli import EXIT_REFUSED
from coevo.core.config import CoevoConfig, compose, to_object
from coevo.core.console import setup_logging
from evidence.corpus import PRESETS, Corpus, CorpusDigest, corpus_file, corpus_source, digest_corpus
from evidence.corpus_store import open_corpus, store_path, stored_meta
from evidence.entities import entity_cache_path
from evidence.entity_shards import build_sharded
from evidence.lazy_entities import build_title_table, sample_corpus, stats_entry_path, title_table_path
from evidence.retrieval import build_retriever, index_cache_path

PROG = "python -m evidence.build_index"
BLOCKS = ("corpus", "retrieval", "evidence")  # the config blocks that decide which indexes a run needs
_PLAIN = re.compile(r"[A-Za-z_/.~][\w./~-]*")  # a Hydra override value that needs no quotes


class IndexNotBuilt(RuntimeError):
    """A large corpus's index is not cached; the message names it and the command that builds it."""


def _value(v: Any) -> str:
    """A config value as a Hydra override value."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, Enum):
        return str(v.value)
    if isinstance(v, str) and not _PLAIN.fullmatch(v):
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"  # Hydra's quoted string
    return str(v)


def index_overrides(cfg: CoevoConfig) -> list[str]:
    """`key=value` for every key of the corpus, retrieval and evidence blocks that differs from the schema.

    Derived from the config rather than the command line: an experiment preset or a config
    group sets these keys too, and these overrides reproduce the blocks whatever set them.
    """
    return [o for block in BLOCKS for o in _changed(getattr(cfg, block), f"{block}.")]


def _changed(node: Any, prefix: str) -> list[str]:
    """`key=value` of every field of `node` (a dataclass; nested blocks walked) that differs from its default."""
    out = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):  # a backend's block (`retrieval.faiss`)
            out += _changed(value, f"{prefix}{f.name}.")
            continue
        if isinstance(value, dict):  # Ray resource labels: where an actor runs, not what it builds
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if value != default:
            out.append(f"{prefix}{f.name}={_value(value)}")
    return out


def build_command(cfg: CoevoConfig) -> str:
    """The shell command that builds the indexes of `cfg` (as `check_prebuilt` prints it)."""
    return " ".join([PROG, *(shlex.quote(o) for o in index_overrides(cfg))])


def missing_indexes(cfg: CoevoConfig, corpus: Corpus | CorpusDigest, entities: bool = True) -> list[tuple[str, Path]]:
    """(what, cache path) of each index `cfg` needs over `corpus` that is not a complete cache entry.

    A `retrieval.faiss.index_path` file is the user's, never built here (its retriever checks it).
    """
    out: list[tuple[str, Path]] = []
    if not cfg.retrieval.faiss.index_path:
        path = index_cache_path(corpus, cfg.retrieval)  # type: ignore[arg-type]  # a digest has what keys need
        if path is not None and not is_complete(path):
            out.append((f"the {cfg.retrieval.backend} retrieval index", path))
    if not entities:
        return out
    model = cfg.evidence.spacy_model
    if cfg.evidence.annotation == Annotation.lazy:
        size = cfg.evidence.stats_sample
        wanted = [(f"the entity index of a {min(size, len(corpus))}-passage sample ({model}; evidence.annotation="
                   "lazy)", stats_entry_path(corpus, model, size)),
                  ("the title table (evidence.annotation=lazy)", title_table_path(corpus))]
    else:
        wanted = [(f"the entity index ({model})", entity_cache_path(corpus, model))]  # type: ignore[arg-type]
    return out + [(what, path) for what, path in wanted if not is_complete(path)]


def check_prebuilt(cfg: CoevoConfig, entities: bool = True) -> None:
    """Raise IndexNotBuilt when the corpus is over `evidence.build_in_run_max_passages` and an index is missing.

    `entities=False`: the command uses no evidence stage (coevo.solve). A corpus at or under
    the limit returns after counting it: a run builds its indexes as before. A large file is
    read once here, streaming (minutes at wiki-18 size, against hours of building in the actors).
    """
    limit = cfg.evidence.build_in_run_max_passages
    source = corpus_source(cfg.corpus)
    if source not in PRESETS and not Path(source).expanduser().exists():
        return  # not on this node: each actor's host-path check names the node and the key (a cluster run)
    mapped = bool(cfg.corpus.mmap) and source != "vital_articles"
    meta = stored_meta(source) if mapped else None
    digest = (CorpusDigest(meta["name"], meta["source"], meta["n_passages"], meta["content_hash"]) if meta
              else digest_corpus(source))  # the packed store knows its size and hash: nothing is read
    if len(digest) <= limit:
        return
    missing = missing_indexes(cfg, digest, entities)
    if mapped and meta is None:
        missing.insert(0, ("the memory-mapped corpus store", store_path(corpus_file(source)[0])))
    if missing:
        listed = "; ".join(f"{what} at {path}" for what, path in missing)
        raise IndexNotBuilt(
            f"corpus {digest.name!r} ({digest.source}) has {len(digest)} passages, more than "
            f"evidence.build_in_run_max_passages={limit}, and these indexes are not cached: {listed}. A run does "
            f"not build them inside its actors (hours at this size, past ray.ready_timeout_s); build them once "
            f"(resumable) with: {build_command(cfg)}")


def disk_bytes(path: Optional[Path]) -> Optional[int]:
    """Bytes of the files under `path` (a file counts itself); None for no path."""
    if path is None or not path.exists():
        return None
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build_retrieval(corpus: Corpus, cfg: CoevoConfig) -> dict[str, Any]:
    """The retrieval index of `cfg` (built or found cached) and its summary entry."""
    backend = str(cfg.retrieval.backend)
    if backend == "http":
        return {"kind": backend, "path": None, "bytes": None, "seconds": 0.0, "cached": None,
                "note": f"served by {cfg.retrieval.http.url}; nothing to build here"}
    t0 = time.perf_counter()
    retriever = build_retriever(corpus, cfg.retrieval)
    path = getattr(retriever, "path", None)
    entry: dict[str, Any] = {"kind": backend, "path": str(path) if path else None, "bytes": disk_bytes(path),
                             "seconds": round(time.perf_counter() - t0, 3), "cached": retriever.from_cache}
    if path is None:
        entry["note"] = "rank_bm25 keeps its index in memory only; every run rebuilds it"
    return entry


def build_entities(corpus: Corpus, cfg: CoevoConfig) -> dict[str, Any]:
    """The entity index of `cfg` from resumable shards, and its summary entry.

    evidence.annotation=lazy: the entity index of the corpus's sample (the lazy index's statistics)
    instead of the whole corpus's, and the title table; passages are annotated as runs reach them.
    """
    t0 = time.perf_counter()
    ev = cfg.evidence
    lazy = ev.annotation == Annotation.lazy
    target = sample_corpus(corpus, ev.stats_sample) if lazy else corpus
    entry = stats_entry_path(corpus, ev.spacy_model, ev.stats_sample) if lazy else None
    stats = build_sharded(target, ev.spacy_model, shard_passages=ev.shard_passages, workers=ev.build_workers,
                          entry=entry)
    path = Path(stats["path"])
    out = {"kind": "entities", "annotation": str(ev.annotation), "passages": len(target), "path": str(path),
           "bytes": disk_bytes(path), "seconds": round(time.perf_counter() - t0, 3), "cached": not stats["built"],
           "shards": stats["shards"], "shards_reused": stats["reused"], "shards_annotated": stats["annotated"]}
    if lazy:
        t1 = time.perf_counter()
        cached = is_complete(title_table_path(corpus))
        titles = build_title_table(corpus)
        out["titles"] = {"path": str(titles.path), "bytes": disk_bytes(titles.path),
                         "seconds": round(time.perf_counter() - t1, 3), "cached": cached}
    return out


def build_all(cfg: CoevoConfig) -> dict[str, Any]:
    """Build (or find cached) every index of `cfg`; returns the summary `main` prints."""
    t0 = time.perf_counter()
    corpus = open_corpus(cfg.corpus)
    summary: dict[str, Any] = {"corpus": {"name": corpus.name, "source": corpus.source, "passages": len(corpus),
                                          "hash": corpus.content_hash[:16]}}
    entry = getattr(corpus, "entry", None)  # corpus.mmap: the packed store every actor maps
    if entry is not None:
        summary["corpus"].update(store=str(entry), store_bytes=disk_bytes(entry), cached=corpus.from_cache)
    summary["retrieval"] = build_retrieval(corpus, cfg)
    summary["entities"] = build_entities(corpus, cfg)
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    return summary


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Parse the overrides, build, print the summary line; errors exit 2 naming the key or file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return
    flags = [a for a in args if a.startswith("-")]
    try:
        if flags:
            raise ValueError(f"unknown option {flags[0]!r}; expected only coevo.run overrides (key=value)")
        cfg = to_object(compose(args))
    except (ValueError, FileNotFoundError) as e:
        print(f"evidence.build_index: error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    setup_logging(cfg.log.level)  # progress lines on the terminal; there is no run.log
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # shard workers are processes already
    try:
        summary = build_all(cfg)
    except (ValueError, FileNotFoundError) as e:  # a corpus file or config value the build cannot use
        print(f"evidence.build_index: error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
