"""Cache location and atomic writes: nothing already written is ever left half-written."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator


def cache_root() -> Path:
    """Root of coevo's on-disk caches (`$COEVO_CACHE`, default ~/.cache/coevo)."""
    return Path(os.environ.get("COEVO_CACHE", "~/.cache/coevo")).expanduser()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temp file in the same directory + fsync + rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> None:
    """Write one JSON object per line, atomically."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    """Append one JSON line with a single write call (a crash leaves at most a torn last line)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp dir beside `target`; on success it replaces `target` in one rename.

    A crash inside the block leaves only a `.tmp-*` sibling that readers ignore.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; caches and checkpoints are meant to be shared
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".old-{target.name}-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
