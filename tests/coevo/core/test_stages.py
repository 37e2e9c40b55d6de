"""coevo/core/stages.py: stage transitions appended to COEVO_STAGE_FILE, nothing without it."""
import json

import pytest

from coevo.core.stages import STAGE_FILE_ENV, stage


def _stages(path) -> list[str]:  # noqa: ANN001
    return [json.loads(line)["stage"] for line in path.read_text().splitlines()]


def test_nested_stages_publish_their_path_on_entry_and_exit(tmp_path, monkeypatch) -> None:
    path = tmp_path / "stages.jsonl"
    monkeypatch.setenv(STAGE_FILE_ENV, str(path))
    with stage("solve"):
        pass
    with stage("update"):
        with stage("solver"):
            with stage("logprobs"):
                pass
    assert _stages(path) == ["solve", "", "update", "update/solver", "update/solver/logprobs", "update/solver",
                             "update", ""]
    times = [json.loads(line)["t"] for line in path.read_text().splitlines()]
    assert times == sorted(times)


def test_a_failing_stage_is_still_closed(tmp_path, monkeypatch) -> None:
    path = tmp_path / "stages.jsonl"
    monkeypatch.setenv(STAGE_FILE_ENV, str(path))
    with pytest.raises(RuntimeError), stage("update"):
        raise RuntimeError("boom")
    with stage("solve"):
        pass
    assert _stages(path) == ["update", "", "solve", ""]


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(STAGE_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with stage("solve"):
        pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["", "a/b"])
def test_bad_names_are_refused(name) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="stage name"), stage(name):
        pass
