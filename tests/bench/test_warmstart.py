"""bench/warmstart.py: window means and denominators from hand-made coevo.solve metrics."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import warmstart


def _line(step: int, em: float, fmt: float, update: float | None) -> dict:
    times = {"solve": 10.0, **({"update": update} if update is not None else {})}
    return {"step": step, "questions": 2, "episodes": 8,
            "solver": {"format_valid": fmt, "em": em, "f1": em + 0.1, "mean_searches": 1.0, "guided": 2},
            "ranker": {"i_ans": 0.5}, "time_s": times}


def _run(tmp_path: Path, name: str, lines: list[dict]) -> Path:
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def test_windows_and_denominators_are_computed_from_the_metrics(tmp_path, capsys) -> None:
    trained = _run(tmp_path, "warm", [_line(0, 0.0, 0.5, 30.0), _line(1, 1 / 6, 1.0, 20.0), _line(2, 0.5, 1.0, 40.0)])
    control = _run(tmp_path, "control", [_line(0, 0.0, 0.5, None), _line(1, 0.0, 0.25, None), _line(2, 0.0, 0.0, None)])
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps({"metrics": {"average": {"em": 0.1, "f1": 0.2, "n": 3}, "popqa": {"em": 0.1, "n": 3}}}))
    out, png = tmp_path / "w.json", tmp_path / "w.png"
    assert warmstart.main(["--trained", str(trained), "--control", str(control), "--eval-trained", str(ev),
                           "--window", "2", "--out", str(out), "--png", str(png)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result == json.loads(out.read_text()) and png.stat().st_size > 0
    arm = result["arms"]["trained"]
    assert arm["sampled"] == 18 and arm["correct"] == 0 + 1 + 3  # 6 sampled rollouts a step (8 - 2 guided)
    assert arm["windows"][0] == {"steps": [0, 1], "format_valid": 0.75, "em": 0.0833, "f1": 0.1833, "i_ans": 0.5,
                                 "mean_searches": 1.0, "stage_s": 35.0, "update_s": 25.0}
    assert arm["windows"][1]["steps"] == [2, 2] and arm["windows"][1]["em"] == 0.5
    assert arm["update_s_median"] == 30.0 and arm["stage_s_median"] == 40.0
    assert arm["eval"]["em"] == 0.1 and arm["eval"]["per_dataset"]["popqa"]["n"] == 3
    control_arm = result["arms"]["control"]
    assert control_arm["update_s_median"] is None and control_arm["windows"][0]["update_s"] is None
    assert control_arm["eval"] is None


def test_a_run_without_steps_is_an_error_naming_its_file(tmp_path) -> None:
    empty = _run(tmp_path, "empty", [])
    with pytest.raises(ValueError, match=r"empty/metrics\.jsonl: no steps recorded"):
        warmstart.main(["--trained", str(empty), "--control", str(empty)])
