"""`run.logger`: TensorBoard by default, Weights & Biases when asked (offline), or none.

wandb is an optional package and is not installed for the tests: its writer is checked
against a stand-in module put in `sys.modules`, and its absence against `sys.modules["wandb"]
= None` (which makes `import wandb` raise ImportError whether or not it is installed).
"""
import math
import sys
import types

import pytest

from coevo.core.config import compose, to_object
from coevo.orchestrate import loggers
from coevo.orchestrate.outputs import MetricsLog, read_jsonl

STEP = {"reward": {"solver": 0.5, "ranker": None}, "update": {"ranker": {"loss": 1.25, "skipped": False}},
        "candidates": 4, "nan": math.nan, "reasons": {"not_entity": 3}, "name": "x"}
# The numeric leaves of STEP as `group/key` scalars (bools, None, NaN and strings are not scalars).
SCALARS = {"reward/solver": 0.5, "update/ranker/loss": 1.25, "candidates": 4, "reasons/not_entity": 3}


class FakeRun:
    def __init__(self, **kwargs):
        self.init, self.logged, self.finished = kwargs, [], False

    def log(self, data, step):
        self.logged.append((dict(data), step))

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    module = types.ModuleType("wandb")
    module.runs = []

    def init(**kwargs):
        module.runs.append(FakeRun(**kwargs))
        return module.runs[-1]

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    return module


def test_wandb_gets_every_numeric_leaf_offline_by_default(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    log = MetricsLog(tmp_path / "run-7", "wandb", "proj", {"seed": 3})
    log.log(0, STEP)
    log.log(1, {"reward": {"solver": -0.25}})
    log.close()
    (run,) = fake_wandb.runs
    assert run.init == {"project": "proj", "name": "run-7", "dir": str(tmp_path / "run-7"), "config": {"seed": 3},
                        "mode": "offline"}
    assert run.logged == [(SCALARS, 0), ({"reward/solver": -0.25}, 1)]
    assert run.finished
    assert [r["step"] for r in read_jsonl(tmp_path / "run-7" / "metrics.jsonl")] == [0, 1]
    assert not (tmp_path / "run-7" / "tensorboard").exists()


def test_wandb_mode_set_by_the_user_is_kept(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    MetricsLog(tmp_path, "wandb").close()
    assert fake_wandb.runs[0].init["mode"] == "online"


def test_wandb_missing_fails_at_start_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'coevo\[wandb\]'"):
        MetricsLog(tmp_path, "wandb")
    assert list(tmp_path.iterdir()) == []  # no fallback logger wrote anything


def test_run_stops_before_loading_models_without_wandb(tmp_path, monkeypatch):
    import coevo.run as run

    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setattr(run, "create_local_actors", lambda cfg: pytest.fail("actors created before the check"))
    dcfg = compose(["run.logger=wandb", f"run.dir={tmp_path}", "ray.local=true",
                    "run.memory_check=false"])  # the logger check, whatever RAM this machine has free
    with pytest.raises(ImportError, match="run.logger=wandb needs the Weights & Biases client"):
        run.train(to_object(dcfg), dcfg)


def test_tensorboard_is_the_default_and_none_writes_only_jsonl(tmp_path):
    assert to_object(compose([])).run.logger == "tensorboard"
    log = MetricsLog(tmp_path / "tb")
    log.log(0, STEP)
    log.close()
    assert [p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb" / "tensorboard").iterdir()] == [True]
    log = MetricsLog(tmp_path / "none", "none")
    log.log(0, STEP)
    assert log.writer is None and [p.name for p in (tmp_path / "none").iterdir()] == ["metrics.jsonl"]


def test_logger_choice_is_an_enumeration():
    assert to_object(compose(["run.logger=wandb", "run.wandb_project=abl"])).run.wandb_project == "abl"
    with pytest.raises(ValueError, match="run.logger.*tensorboard.*wandb.*none"):
        compose(["run.logger=mlflow"])
    with pytest.raises(ValueError, match="expected one of tensorboard, wandb, none"):
        loggers.open_logger("mlflow", ".")
