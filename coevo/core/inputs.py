"""The validated loaders of the question inputs: labelled questions and reference questions.

Every entry point reads these two kinds through this module (`coevo.solve` and `coevo.eval`
share `load_labelled_questions`; the corpus has its loader in `evidence.corpus`). Bad input
raises `InputError("<file>:<line>: <what was wrong and what was expected>")`: malformed
JSON, bytes that are not UTF-8, wrong types, null / empty / duplicate ids, empty texts.

Length limit: a question longer than `MAX_QUESTION_CHARS` characters is cut to that many
(the longest of the 1,577 shared dev questions has 300; a question far longer would push
the instructions out of a prompt, which is truncated from the left). Cuts are never
silent: the loader counts them in its `InputReport`, which it returns and logs.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from coevo.core.io import iter_jsonl, iter_lines, package_path, parse_json_line

MAX_QUESTION_CHARS = 1000
LOG = logging.getLogger("coevo.inputs")


class InputError(ValueError):
    """An input file that cannot be used as it is; the message names file and line."""


@dataclass
class InputReport:
    """What loading one input file kept, cut and skipped (for the run summary)."""

    path: str
    kind: str  # "labelled questions" | "reference questions" | "corpus"
    records: int = 0  # records kept
    limit: int = 0  # the length limit in characters
    truncated: int = 0  # records whose text was cut to `limit`
    first_truncated: str = ""  # "<file>:<line>" of the first cut record
    skipped_empty: int = 0  # records dropped for an empty text (corpus only)
    first_skipped: str = ""

    def cut(self, where: str) -> None:
        self.truncated += 1
        self.first_truncated = self.first_truncated or where

    def skip(self, where: str) -> None:
        self.skipped_empty += 1
        self.first_skipped = self.first_skipped or where

    def summary(self) -> dict[str, Any]:
        return {"records": self.records, "truncated": self.truncated, "skipped_empty": self.skipped_empty}

    def message(self) -> str:
        """One line for the log; "" when nothing was cut or skipped."""
        parts = []
        if self.truncated:
            parts.append(f"cut {self.truncated} to {self.limit} characters (first at {self.first_truncated})")
        if self.skipped_empty:
            parts.append(f"skipped {self.skipped_empty} with an empty text (first at {self.first_skipped})")
        return f"{self.kind} {self.path}: {'; '.join(parts)}" if parts else ""

    def log(self) -> None:
        # WARNING: shown even where logging is not configured (Python's last-resort handler).
        if self.message():
            LOG.warning(self.message())


def bounded(text: str, limit: int, where: str, report: InputReport) -> str:
    """`text` cut to `limit` characters, counted in `report` when cut."""
    if len(text) <= limit:
        return text
    report.cut(where)
    return text[:limit]


def record_id(rec: dict, where: str) -> Optional[str]:
    """The record's `id` as a string (None when the key is absent).

    Strings and integers are ids; null, booleans, floats, containers and "" are refused
    (`null` would otherwise become the id "None").
    """
    if "id" not in rec:
        return None
    value = rec["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InputError(f"{where}: 'id' must be a string or an integer, got {_kind(value)}")
    if not str(value).strip():
        raise InputError(f"{where}: 'id' must not be empty")
    return str(value)


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r:.40}"


# ---- labelled questions -------------------------------------------------------------------

@dataclass(frozen=True)
class LabelledQuestion:
    """One labelled question (`coevo.solve` tasks, `coevo.eval` questions)."""

    id: str
    question: str
    answers: list[str]
    gold_ids: list[str] = field(default_factory=list)  # evidence passage ids (may be empty)
    dataset: str = ""
    line: int = 0
    guide: list[str] = field(default_factory=list)  # searches a guided rollout replays (may be empty)


def _answers(rec: dict, where: str) -> list[str]:
    key = "answers" if "answers" in rec else "answer"
    value = rec.get(key)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise InputError(f"{where}: 'answers' must be a non-empty list of strings (or 'answer' one string), "
                         f"got {_kind(value)}")
    for a in value:
        if not isinstance(a, str) or not a.strip():
            # An empty gold answer would score an empty (format-failure) prediction as correct.
            raise InputError(f"{where}: every answer must be a non-empty string, got {_kind(a)}")
    return list(value)


def _gold_ids(rec: dict, where: str) -> list[str]:
    value = rec.get("gold_ids", [])
    if not isinstance(value, list):
        # A string here used to be split into characters ("p1" -> ["p", "1"]).
        raise InputError(f"{where}: 'gold_ids' must be a list of passage ids, got {_kind(value)}")
    for g in value:
        if isinstance(g, bool) or not isinstance(g, (str, int)) or not str(g).strip():
            raise InputError(f"{where}: each of 'gold_ids' must be a passage id (string or integer), got {_kind(g)}")
    return [str(g) for g in value]


def _guide(rec: dict, where: str) -> list[str]:
    value = rec.get("guide", [])
    if not isinstance(value, list) or not all(isinstance(g, str) and g.strip() for g in value):
        raise InputError(f"{where}: 'guide' must be a list of non-empty search queries, got {_kind(value)}")
    return list(value)


def labelled_question(rec: Any, where: str, line_no: int, default_dataset: str,
                      report: InputReport) -> LabelledQuestion:
    """One validated record (`question`, `answers`, optional `id`, `dataset`, `gold_ids`, `guide`)."""
    if not isinstance(rec, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for key in ("question", "answers"):
        if key not in rec and not (key == "answers" and "answer" in rec):
            raise InputError(f"{where}: missing key {key!r}" + (" (or 'answer')" if key == "answers" else ""))
    question = rec["question"]
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{where}: 'question' must be a non-empty string, got {_kind(question)}")
    dataset = rec.get("dataset", default_dataset)
    if not isinstance(dataset, str) or not dataset.strip():
        raise InputError(f"{where}: 'dataset' must be a non-empty string, got {_kind(dataset)}")
    qid = record_id(rec, where) or f"{dataset}-{line_no}"
    return LabelledQuestion(qid, bounded(question, MAX_QUESTION_CHARS, where, report), _answers(rec, where),
                            _gold_ids(rec, where), dataset, line_no, _guide(rec, where))


def load_labelled_questions(path: str | os.PathLike) -> tuple[list[LabelledQuestion], InputReport]:
    """All questions of a JSONL(.gz) file, validated, in file order, with the load report.

    A record without `id` gets `<dataset>-<line>`; a record without `dataset` belongs to a
    dataset named after the file. Ids must be unique across the file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"labelled questions file {path} does not exist")
    report = InputReport(str(path), "labelled questions", limit=MAX_QUESTION_CHARS)
    default_dataset = path.name.split(".")[0]
    first_line: dict[str, int] = {}
    out = []
    try:
        for line_no, rec in iter_jsonl(path, error=InputError):
            where = f"{path}:{line_no}"
            q = labelled_question(rec, where, line_no, default_dataset, report)
            if q.id in first_line:
                raise InputError(f"{where}: duplicate question id {q.id!r} (first at line {first_line[q.id]})")
            first_line[q.id] = line_no
            out.append(q)
    except (OSError, EOFError) as e:  # unreadable file, bad or truncated gzip stream
        raise InputError(f"{path}: cannot read labelled questions ({e})") from None
    if not out:
        raise InputError(f"{path}: holds no questions")
    report.records = len(out)
    report.log()
    return out, report


# ---- reference questions ------------------------------------------------------------------

def _is_jsonl(path: Path) -> bool:
    """JSONL by name (.jsonl / .json, optionally .gz), or a file whose first line is an object."""
    suffixes = [s for s in path.suffixes if s != ".gz"]
    if suffixes and suffixes[-1] in (".jsonl", ".json"):
        return True
    first = next(iter_lines(path, error=InputError), None)
    return first is not None and first[1].lstrip().startswith("{")


def load_reference_questions(path: Optional[str | os.PathLike] = None) -> tuple[list[str], InputReport]:
    """The proposer's reference questions and the load report; default: the bundled set.

    A text file holds one question per line (blank lines skipped); a JSONL file one object
    with a string `question` per line (other keys ignored). The format is decided per file
    (see `_is_jsonl`), so a stray text line in a JSONL file is an error, not a question.
    """
    p = package_path("proposer", "data/reference_questions.txt") if path is None else Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"reference questions file {p} does not exist")
    report = InputReport(str(p), "reference questions", limit=MAX_QUESTION_CHARS)
    questions = []
    try:
        jsonl = _is_jsonl(p)
        for line_no, line in iter_lines(p, error=InputError):
            where = f"{p}:{line_no}"
            text = line
            if jsonl:
                rec = parse_json_line(line, where, error=InputError)
                text = rec.get("question") if isinstance(rec, dict) else None
                if not isinstance(text, str):
                    raise InputError(f"{where}: expected an object with a string 'question', got "
                                     f"{_kind(text) if isinstance(rec, dict) else type(rec).__name__}")
            text = text.strip()
            if not text:
                raise InputError(f"{where}: empty question")
            questions.append(bounded(text, MAX_QUESTION_CHARS, where, report))
    except (OSError, EOFError) as e:
        raise InputError(f"{p}: cannot read reference questions ({e})") from None
    if not questions:
        raise InputError(f"{p}: holds no reference questions")
    report.records = len(questions)
    report.log()
    return questions, report
