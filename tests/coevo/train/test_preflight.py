"""Preflight: each role's model located without loading it; a hub model that cannot be had fails at once."""
import json
import os
import time
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi, constants

from coevo.core.config import compose, to_object
from coevo.train import preflight
from coevo.train.models import embedded_path
from coevo.train.preflight import (
    PreflightError,
    check_models,
    complete_snapshot,
    hub_weights_bytes,
    locate,
    with_deadline,
)

REPO = "Qwen/Qwen2.5-7B-Instruct"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache and no offline mode, restored afterwards (go_offline writes both)."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")})
    return cache


def fake_snapshot(cache, repo, files, index=None):
    """The hub cache's layout: models--org--name/{refs/main, snapshots/<commit>/...}."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text("abc123")
    for name in files:
        (snapshot / name).write_text("{}")
    if index is not None:
        (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": index}))
    return snapshot


def cfg_with(*overrides):
    return to_object(compose(["experiment=smoke", *overrides]))


def test_complete_snapshot_needs_config_and_every_shard(tmp_path):
    shards = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    snap = fake_snapshot(tmp_path, "o/m", ["config.json", "model-00001-of-00002.safetensors"], shards)
    assert not complete_snapshot(snap)  # shard 2 of 2 missing (an interrupted download)
    (snap / "model-00002-of-00002.safetensors").write_text("")
    assert complete_snapshot(snap)
    single = fake_snapshot(tmp_path, "o/single", ["config.json", "model.safetensors"])
    assert complete_snapshot(single)
    (single / "config.json").unlink()
    assert not complete_snapshot(single)


def test_locate_each_kind_of_model(tmp_path, hub_cache):
    cfg = cfg_with()
    assert locate("solver", cfg.solver).kind == "embedded"
    assert locate("solver", cfg.solver).detail in (str(embedded_path("tiny-random")),
                                                   f"built into {embedded_path('tiny-random')} on first use")
    local = cfg_with(f"solver.model={tmp_path}")
    assert (locate("solver", local.solver).kind, locate("solver", local.solver).detail) == ("local", str(tmp_path))
    gone = locate("solver", cfg_with(f"solver.model={tmp_path / 'nope'}").solver)
    assert (gone.kind, gone.detail) == ("missing", f"directory {tmp_path / 'nope'} does not exist")
    ckpt = locate("solver", cfg_with(f"solver.checkpoint={tmp_path / 'ckpt'}").solver)
    assert ckpt.kind == "missing" and "solver.checkpoint=<a directory that exists>" in ckpt.failure()
    (tmp_path / "full").mkdir()
    assert locate("solver", cfg_with(f"solver.checkpoint={tmp_path / 'full'}").solver).kind == "checkpoint"
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")  # a LoRA checkpoint: its base must be found too
    adapter = cfg_with("solver=qwen2.5-7b", f"solver.checkpoint={tmp_path / 'adapter'}")
    assert locate("solver", adapter.solver).kind == "download"
    hub = cfg_with("solver=qwen2.5-7b")
    assert (locate("solver", hub.solver).kind, locate("solver", hub.solver).preset) == ("download", "qwen2.5-7b")
    snap = fake_snapshot(hub_cache, REPO, ["config.json", "model.safetensors"])
    assert (locate("solver", hub.solver).kind, locate("solver", hub.solver).detail) == ("cached", str(snap))


def test_offline_hub_preset_fails_at_once_naming_role_preset_model_and_override(hub_cache, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(HfApi, "model_info", lambda *a, **k: pytest.fail("offline: the hub must not be asked"))
    with pytest.raises(PreflightError) as err:
        check_models(cfg_with("solver=qwen2.5-7b", "ranker=qwen2.5-3b"))
    lines = str(err.value).splitlines()
    assert lines == [
        f"the solver model cannot be loaded: preset qwen2.5-7b, model {REPO}: not in the hub cache ({hub_cache}) "
        "and offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE). Use a local copy with solver.model=/local/dir",
        "the ranker model cannot be loaded: preset qwen2.5-3b, model Qwen/Qwen2.5-3B-Instruct: not in the hub cache "
        f"({hub_cache}) and offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE). Use a local copy with "
        "ranker.model=/local/dir",
    ]


def test_unreachable_hub_is_asked_once_then_fails(hub_cache, monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once, no network
    calls = []
    real = HfApi.model_info
    monkeypatch.setattr(HfApi, "model_info", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    cfg = cfg_with("solver=qwen2.5-7b", "proposer=qwen2.5-7b", "ranker=qwen3-4b")
    t0 = time.perf_counter()
    with pytest.raises(PreflightError) as err:
        check_models(cfg)
    assert time.perf_counter() - t0 < preflight.HUB_TIMEOUT_S
    assert len(calls) == 1  # the first failure stands for the hub: no retries, no second model asked
    msg = str(err.value)
    assert msg.count("is unreachable: ConnectError") == 3 and "(http://127.0.0.1:9)" in msg
    assert [line.split(":")[0] for line in msg.splitlines()] == [
        "the proposer model cannot be loaded", "the solver model cannot be loaded", "the ranker model cannot be loaded"]


def test_cached_models_with_an_unreachable_hub_run_offline(hub_cache, monkeypatch):
    fake_snapshot(hub_cache, REPO, ["config.json", "model.safetensors"])
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    sources = check_models(cfg_with("solver=qwen2.5-7b"))
    assert [(s.role, s.kind) for s in sources] == [("proposer", "embedded"), ("solver", "cached"),
                                                   ("ranker", "embedded")]
    assert constants.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"  # loads won't wait on the hub


def test_download_size_counts_the_weights_from_pretrained_fetches(monkeypatch):
    def siblings(*names_sizes):
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n, size=s) for n, s in names_sizes])

    info = siblings(("model-1.safetensors", 10), ("model-2.safetensors", 20), ("pytorch_model.bin", 100),
                    ("config.json", 1))
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo, **kw: info)
    assert hub_weights_bytes("o/m") == 30  # safetensors only: the .bin copy is not downloaded
    info = siblings(("pytorch_model.bin", 100), ("config.json", 1))
    assert hub_weights_bytes("o/m") == 100


def test_deadline_bounds_a_hung_request():
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="no answer from the hub within 0.2 s"):
        with_deadline(lambda: time.sleep(3), 0.2)
    assert time.perf_counter() - t0 < 1.5
    assert with_deadline(lambda: 7, 1.0) == 7
    with pytest.raises(KeyError):
        with_deadline(lambda: {}["x"], 1.0)
