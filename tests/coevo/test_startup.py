"""The one start-up path of coevo.run, coevo.solve and coevo.eval (coevo/startup.py).

A dry run makes the checks the real run makes before any model starts: a model that cannot be had
fails with the preflight's one line, exit 2, and nothing is downloaded.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
from huggingface_hub import HfApi, constants

import coevo.eval as eval_cmd
import coevo.run as run_cmd
import coevo.solve as solve_cmd
from coevo import startup
from coevo.core.cli import hydra_entry
from coevo.core.config import compose, to_object
from coevo.evaluate.harness import to_eval_object
from coevo.orchestrate import startup_checks
from coevo.train.memory import MemoryBudgetError
from coevo.train.preflight import PreflightError

SOLVER_LINE = ("error: the solver model cannot be loaded: preset qwen2.5-7b, model Qwen/Qwen2.5-7B-Instruct: "
               "not in the hub cache ({cache}) and the hub (http://127.0.0.1:9) is unreachable: ConnectError")
CHECKS = ("check_models", "check_gpu_plan", "check_devices", "check_prebuilt", "check_run_memory")


@pytest.fixture
def no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A hub that refuses at once (nothing listens), an empty hub cache, no offline mode, and every
    download path failing the test; `asked` counts the preflight's requests to the hub."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()  # restored: setup_logging writes it
                                        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")})
    asked: list[Any] = []
    real = HfApi.model_info
    monkeypatch.setattr(HfApi, "model_info", lambda self, *a, **k: asked.append(a) or real(self, *a, **k))

    def stub(name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: pytest.fail(f"{name} called: a download started before the preflight failed")

    import huggingface_hub
    import huggingface_hub.file_download
    import transformers.utils.hub

    for module in (huggingface_hub, huggingface_hub.file_download, transformers.utils.hub):
        for name in ("hf_hub_download", "snapshot_download"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, stub(f"{module.__name__}.{name}"))
    monkeypatch.setattr(startup, "load_stack_summary", stub("load_stack_summary"))  # the plan loads models
    monkeypatch.setattr(startup, "ensure_reaper", lambda: None)  # no reaper process for the test process
    return {"cache": cache, "asked": asked}


def _entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, module: Any, config_name: str, hydra_main: str,
           argv: list[str]) -> int:
    """An entry point's whole command line in-process, from an empty directory; its exit code.

    Hydra's decorator is stepped over (it finds configs/ only under `python -m`): the entry's function
    gets the config Hydra would compose from the same overrides (hydra_entry appends its dry-run ones).
    """
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [sys.argv[0]])
    body = getattr(module, hydra_main).__wrapped__
    monkeypatch.setattr(module, hydra_main, lambda: body(compose(argv, config_name)))
    with pytest.raises(SystemExit) as stop:
        if module is eval_cmd:
            eval_cmd.main(argv)
        else:
            hydra_entry(module.main, config_name, module.COMMAND.validate, argv)
    assert list(cwd.iterdir()) == []  # a dry run writes nothing
    return stop.value.code


@pytest.mark.parametrize("prog", ["run", "eval"])
def test_dry_run_of_an_unavailable_model_fails_with_the_preflight_line_before_any_download(
        prog, no_hub, tmp_path, monkeypatch, capsys):
    if prog == "run":
        code = _entry(monkeypatch, tmp_path, run_cmd, "coevo", "main",
                      ["solver=qwen2.5-7b", "dry_run=true", f"run.dir={tmp_path / 'run'}"])
    else:
        data = tmp_path / "q.jsonl"
        data.write_text('{"id": "1", "question": "q?", "answers": ["a"], "dataset": "nq"}\n')
        code = _entry(monkeypatch, tmp_path, eval_cmd, "eval", "_hydra_main",
                      ["solver=qwen2.5-7b", "dry_run=true", f"data={data}", f"out={tmp_path / 'out.json'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"coevo.{prog}: " + SOLVER_LINE.format(cache=no_hub["cache"])), err
    assert err.rstrip().endswith("Use a local copy with solver.model=/local/dir")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert len(no_hub["asked"]) == 1  # the hub asked once, no retries
    assert not (tmp_path / "run").exists()


def test_a_dry_run_refuses_a_run_dir_the_real_run_would_refuse_and_writes_nothing(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    code = _entry(monkeypatch, tmp_path, run_cmd, "coevo", "main",
                  ["experiment=smoke", "dry_run=true", f"run.dir={run_dir}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"coevo.run: error: run.dir {run_dir} already holds a run (metrics.jsonl)"), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]


def _fake_command(calls: list[str], owns_run_dir: bool, fail: BaseException | None = None) -> startup.Command:
    def checks(cfg: Any) -> None:
        calls.append("checks")
        if fail is not None:
            raise fail

    return startup.Command(prog="coevo.x", validate=lambda d: d, checks=checks, roles=lambda cfg: ("solver",),
                           run=lambda cfg, d: calls.append("run"), owns_run_dir=owns_run_dir)


@pytest.mark.parametrize("dry_run, owns_run_dir, expected", [
    (True, True, ["reaper", "checks", "plan"]),  # a training command's dry run: the checks here, then the plan
    (True, False, ["reaper", "checks", "plan"]),
    (False, True, ["reaper", "report", "run"]),  # its real run makes them in open_run, holding run.dir
    (False, False, ["reaper", "checks", "run"]),  # eval: the checks here, then the evaluation
])
def test_start_checks_before_the_plan_or_the_run(dry_run, owns_run_dir, expected, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(startup, "ensure_reaper", lambda: calls.append("reaper"))
    monkeypatch.setattr(startup, "setup_logging", lambda level: None)
    monkeypatch.setattr(startup, "dry_run_plan", lambda cfg, roles: calls.append("plan") or "PLAN")
    monkeypatch.setattr(startup, "run_and_report", lambda prog, run_dir, body: calls.append("report") or body())
    cfg = SimpleNamespace(dry_run=dry_run, log=SimpleNamespace(level="info"), run=SimpleNamespace(dir="runs/x"))
    startup.start(_fake_command(calls, owns_run_dir), cfg)
    assert calls == expected


@pytest.mark.parametrize("error, code, line", [
    (PreflightError("the solver model cannot be loaded"), 2, "coevo.x: error: the solver model cannot be loaded"),
    (MemoryBudgetError("estimated peak 9 GiB"), 1, "estimated peak 9 GiB"),
])
def test_a_failed_check_ends_the_dry_run_as_the_real_run(error, code, line, monkeypatch, capsys):
    calls: list[str] = []
    monkeypatch.setattr(startup, "ensure_reaper", lambda: None)
    monkeypatch.setattr(startup, "setup_logging", lambda level: None)
    monkeypatch.setattr(startup, "dry_run_plan", lambda cfg, roles: pytest.fail("the plan loaded after a failed check"))
    cfg = SimpleNamespace(dry_run=True, log=SimpleNamespace(level="info"))
    with pytest.raises(SystemExit) as stop:
        startup.start(_fake_command(calls, True, error), cfg)
    assert stop.value.code == code and calls == ["checks"]
    assert capsys.readouterr().err.splitlines() == [line]


def test_an_invalid_config_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(startup, "ensure_reaper", lambda: None)

    def invalid(dcfg: Any) -> Any:
        raise ValueError("config key x=1 must be >= 2")

    command = startup.Command(prog="coevo.x", validate=invalid, checks=lambda c: pytest.fail("checked"),
                              roles=lambda c: (), run=lambda c, d: pytest.fail("ran"))
    with pytest.raises(SystemExit) as stop:
        startup.start(command, None)
    assert stop.value.code == 2 and capsys.readouterr().err == "coevo.x: error: config key x=1 must be >= 2\n"


def _record_checks(monkeypatch: pytest.MonkeyPatch, module: Any, calls: list[tuple[str, bool]]) -> None:
    """Replace each check `module` calls by a recorder of (name, whether it covers the proposer)."""
    for name in CHECKS:
        def record(cfg: Any, *args: Any, _name: str = name, **kwargs: Any) -> Any:
            covers = ([*args, *kwargs.values()] or [True])[0]
            calls.append((_name, bool(covers)))
            return [] if _name == "check_models" else None
        monkeypatch.setattr(module, name, record)


@pytest.mark.parametrize("with_proposer", [True, False])
def test_the_dry_run_makes_the_checks_of_the_real_run_in_its_order(with_proposer, tmp_path, monkeypatch):
    dcfg = compose(["experiment=smoke", f"run.dir={tmp_path / 'run'}"])
    cfg = to_object(dcfg)
    monkeypatch.setattr(startup_checks, "setup_logging", lambda *a: None)  # no run.log, no log variables left set
    dry: list[tuple[str, bool]] = []
    _record_checks(monkeypatch, startup_checks, dry)
    startup_checks.dry_run_checks(cfg, with_proposer)  # before the real run: it leaves run.dir holding a run
    real: list[tuple[str, bool]] = []
    _record_checks(monkeypatch, startup_checks, real)
    with startup_checks.open_run("coevo.x", cfg, dcfg, with_proposer=with_proposer):
        pass
    assert real == [(name, with_proposer) for name in CHECKS]
    # the dry run makes these very checks
    assert dry == real and run_cmd.COMMAND.checks is startup_checks.dry_run_checks


def test_each_entry_point_starts_through_startup():
    assert (run_cmd.COMMAND.prog, run_cmd.COMMAND.owns_run_dir) == ("coevo.run", True)
    assert (solve_cmd.COMMAND.prog, solve_cmd.COMMAND.owns_run_dir) == ("coevo.solve", True)
    assert (eval_cmd.COMMAND.prog, eval_cmd.COMMAND.owns_run_dir) == ("coevo.eval", False)
    assert run_cmd.COMMAND.checks is startup_checks.dry_run_checks and eval_cmd.COMMAND.validate is to_eval_object
    cfg = to_object(compose(["experiment=smoke"]))
    assert run_cmd.COMMAND.roles(cfg) == ("proposer", "solver", "ranker")
