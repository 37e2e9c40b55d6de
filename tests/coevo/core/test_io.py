"""The shared file helpers: atomic dirs, JSONL reader, `step_<n>` names, package-data lookup, mean."""
import errno
import gzip
import json
import multiprocessing
import os
import traceback

import pytest

from coevo.core import io
from coevo.core.io import (
    append_jsonl,
    atomic_dir,
    iter_jsonl,
    iter_lines,
    package_path,
    parse_json_line,
    read_jsonl,
    step_name,
    step_of,
)
from coevo.core.stats import mean


def test_reader_numbers_lines_and_skips_blank_ones(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n  \n[2]\n"\u2028 stays one record"\n', encoding="utf-8")
    assert list(iter_jsonl(p)) == [(1, {"a": 1}), (4, [2]), (5, "\u2028 stays one record")]
    assert read_jsonl(p) == [{"a": 1}, [2], "\u2028 stays one record"]


def test_reader_errors_name_file_line_and_what_was_expected(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n{"a": 1,}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: malformed JSON \(Expecting property name"):
        read_jsonl(p)
    p.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: expected a JSON object, got list"):
        read_jsonl(p, objects=True)
    p.write_bytes(b'{"a": 1}\n"\xff"\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not UTF-8 text"):
        read_jsonl(p)


def test_reader_raises_the_callers_error_type(tmp_path):
    class CustomError(ValueError):
        pass

    p = tmp_path / "c.jsonl"
    p.write_text("{oops\n")
    with pytest.raises(CustomError, match=r"c\.jsonl:1:"):
        read_jsonl(p, error=CustomError)


def test_torn_last_line_is_skipped_only_when_asked_and_only_when_last(tmp_path):
    p = tmp_path / "m.jsonl"
    append_jsonl(p, {"step": 0})
    with open(p, "ab") as f:
        f.write('{"step": 1, "x": "é'.encode()[:-1])  # killed mid-write, even mid-character
    assert read_jsonl(p, skip_torn_last=True) == [{"step": 0}]
    with pytest.raises(ValueError, match=r"m\.jsonl:2:"):
        read_jsonl(p)
    p.write_text('{"step": 0}\n{"step": 1, "x"\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"m\.jsonl:2: malformed JSON"):
        read_jsonl(p, skip_torn_last=True)


def test_gzip_files_are_read_transparently(tmp_path):
    p = tmp_path / "c.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"id": "p1"}) + "\n" + "{bad\n")
    with pytest.raises(ValueError, match=r"c\.jsonl\.gz:2: malformed JSON"):
        read_jsonl(p)
    assert list(iter_lines(p)) == [(1, '{"id": "p1"}'), (2, "{bad")]


def test_parse_json_line_and_text_lines(tmp_path):
    assert parse_json_line('{"q": "x"}', "f:1") == {"q": "x"}
    with pytest.raises(ValueError, match=r"^f:3: malformed JSON"):
        parse_json_line("{", "f:3")
    p = tmp_path / "t.txt"
    p.write_text("who?\r\n\nwhat?\n")
    assert list(iter_lines(p)) == [(1, "who?"), (3, "what?")]


@pytest.mark.parametrize("step", [0, 1, 7, 12345])
@pytest.mark.parametrize("suffix", ["", ".jsonl"])
def test_step_name_round_trip(step, suffix):
    assert step_of(step_name(step, suffix), suffix) == step


@pytest.mark.parametrize("name", ["step_x", "step_", "step_-1", ".tmp-step_3-abc", "step_3.bak", "step_3.jsonl",
                                  "xstep_3", "step_3 ", "step_٣", ".step_3.jsonl.x.tmp"])
def test_step_of_ignores_other_names(name):
    assert step_of(name) is None


def test_step_of_with_suffix():
    assert step_of("step_4.jsonl", ".jsonl") == 4
    assert step_of("step_4", ".jsonl") is None
    assert step_of("step_4.jsonl.tmp", ".jsonl") is None
    with pytest.raises(ValueError):
        step_name(-1)


def test_package_path_finds_bundled_data():
    path = package_path("proposer", "data/reference_questions.txt")
    assert path.is_file() and path.read_text(encoding="utf-8").strip()
    assert package_path("proposer").is_dir()


def test_package_path_errors():
    with pytest.raises(ImportError, match="custom hint"):
        package_path("no_such_package_for_coevo_tests", "x", missing="custom hint")
    with pytest.raises(ImportError, match="no_such_package_for_coevo_tests"):
        package_path("no_such_package_for_coevo_tests")
    with pytest.raises(FileNotFoundError, match="is installed but .*no_such_file.txt is missing"):
        package_path("proposer", "data/no_such_file.txt")


def test_mean():
    assert mean([]) is None and mean(iter([])) is None
    assert mean([1.0, 2.0]) == 1.5
    assert mean(x for x in (0.25, 0.75)) == 0.5
    # Exact: 0.1 + 0.1 + 0.1 summed in floats is 0.30000000000000004.
    assert mean([0.1, 0.1, 0.1]) == 0.1
    assert mean([0.1, 0.2, 0.3, 1e16]) == mean([1e16, 0.3, 0.2, 0.1])


# ---- atomic_dir -----------------------------------------------------------------------------

CTX = multiprocessing.get_context("fork")  # workers are functions of this module (importlib mode)


def _writer(target, n, errors):
    try:
        for i in range(n):
            with atomic_dir(target) as tmp:
                (tmp / "a").write_text(f"{os.getpid()}-{i}")
                (tmp / "b").write_text("x" * 1000)
    except BaseException:
        (errors / f"w{os.getpid()}").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def _watcher(target, stop, errors, seen):
    misses = reads = 0
    while not stop.exists():
        try:
            (target / "a").read_text()
            reads += 1
        except FileNotFoundError:
            misses += 1
    seen.write_text(f"{reads} {misses}")
    os._exit(0)


def test_atomic_dir_concurrent_writers_never_fail_and_readers_never_miss(tmp_path):
    target, errors, stop, seen = tmp_path / "d" / "t", tmp_path / "errors", tmp_path / "stop", tmp_path / "seen"
    errors.mkdir()
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("first")
    # A leftover of the old implementation's fixed aside name once broke every later call.
    (target.parent / f".old-t-{os.getpid()}").mkdir()
    (target.parent / f".old-t-{os.getpid()}" / "junk").write_text("1")
    watcher = CTX.Process(target=_watcher, args=(target, stop, errors, seen))
    watcher.start()
    writers = [CTX.Process(target=_writer, args=(target, 300, errors)) for _ in range(2)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
    stop.touch()
    watcher.join(30)
    problems = "\n".join(f.read_text() for f in errors.iterdir())
    assert not problems and [p.exitcode for p in writers + [watcher]] == [0, 0, 0], problems
    reads, misses = map(int, seen.read_text().split())
    assert misses == 0 and reads > 0
    assert sorted(p.name for p in target.parent.iterdir()) == [f".old-t-{os.getpid()}", "t"]
    assert sorted(p.name for p in target.iterdir()) == ["a", "b"]


def test_atomic_dir_without_rename_exchange_still_replaces(tmp_path, monkeypatch):
    def no_exchange(a, b):
        raise OSError(errno.EINVAL, "not supported here")

    monkeypatch.setattr(io, "_exchange", no_exchange)
    target = tmp_path / "t"
    for version in ("1", "2"):
        with atomic_dir(target) as tmp:
            (tmp / "v").write_text(version)
    assert (target / "v").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_atomic_dir_failure_keeps_the_old_version_and_leaves_nothing(tmp_path):
    target = tmp_path / "t"
    with atomic_dir(target) as tmp:
        (tmp / "v").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "v").write_text("half")
            raise RuntimeError("killed mid-write")
    assert (target / "v").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_sibling_names_belong_to_exactly_one_target(tmp_path):
    t = tmp_path / "a"
    name = io.unique_sibling(t).name
    assert io.is_sibling_of(name, t)
    assert not io.is_sibling_of(io.unique_sibling(tmp_path / "a-b").name, t)
    assert not io.is_sibling_of(".tmp-a-xyz", t) and not io.is_sibling_of("a", t)


def test_atomic_write_text_gives_the_mode_open_gives_and_replaces_whole(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x", encoding="utf-8")
    written = tmp_path / "written.txt"
    io.atomic_write_text(written, "old")
    io.atomic_write_text(written, "new\n")
    assert written.read_text(encoding="utf-8") == "new\n"
    assert (written.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left
