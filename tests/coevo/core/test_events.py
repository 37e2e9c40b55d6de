"""coevo/core/events.py: appended lines, read back in order; the reader skips junk and waits for torn lines."""
import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.core.events import EVENTS_NAME, READY, STEP, emit, read_events


def test_events_append_in_order_with_the_writers_pid_and_read_from_an_offset(tmp_path) -> None:
    emit(tmp_path, READY, start=2, last=5, actors={"solver": 11})
    emit(tmp_path, STEP, step=2)
    events, offset = read_events(tmp_path / EVENTS_NAME)
    assert [(e["event"], e["pid"]) for e in events] == [(READY, os.getpid()), (STEP, os.getpid())]
    assert events[0]["start"] == 2 and events[0]["last"] == 5 and events[0]["actors"] == {"solver": 11}
    assert events[1]["step"] == 2 and isinstance(events[1]["time"], float)
    assert read_events(tmp_path / EVENTS_NAME, offset) == ([], offset)  # nothing new
    emit(tmp_path, STEP, step=3)
    later, _ = read_events(tmp_path / EVENTS_NAME, offset)
    assert [e["step"] for e in later] == [3]


def test_a_missing_file_holds_no_events(tmp_path) -> None:
    assert read_events(tmp_path / EVENTS_NAME, 7) == ([], 7)


def test_junk_lines_are_skipped_and_a_torn_last_line_is_left_for_the_next_read(tmp_path) -> None:
    path = tmp_path / EVENTS_NAME
    path.write_bytes(b'not json\n[1, 2]\n{"event": 3}\n\xff\xfe\n{"event": "step", "step": 1}\n{"event": "st')
    events, offset = read_events(path)
    assert events == [{"event": "step", "step": 1}] and offset == path.stat().st_size - len(b'{"event": "st')
    with open(path, "ab") as f:
        f.write(b'ep", "step": 2}\n')
    assert read_events(path, offset) == ([{"event": "step", "step": 2}], path.stat().st_size)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), cut=st.integers(0, 300))
def test_the_reader_never_raises_and_returns_only_event_objects(tmp_path_factory, data, cut) -> None:
    path = tmp_path_factory.mktemp("events") / EVENTS_NAME
    path.write_bytes(data + b"\n" + json.dumps({"event": "ready"}).encode() + b"\n")
    events, offset = read_events(path, min(cut, len(data)))
    assert all(isinstance(e, dict) and isinstance(e["event"], str) for e in events)
    assert offset == path.stat().st_size and events[-1] == {"event": "ready"}
