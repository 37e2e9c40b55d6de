"""LoRA policies (`<role>.lora.rank > 0`): a peft adapter trained over frozen base weights.

- `apply_lora` wraps a loaded HF model: base weights frozen (they may be bf16: they are never
  stepped), adapter weights fp32 and trainable, no adapter dropout (the policy stays a
  deterministic function, as coevo/train/policy.py needs);
- the KL reference is the base model itself, adapter disabled (`model.disable_adapter()`),
  so no second copy of the weights is kept;
- `merged_state_dict` gives an engine that serves a copy (vLLM) plain weights under the base
  model's names, W + scale * B A per wrapped layer, computed on the fly: the training model is
  never merged, so its base weights stay bit-identical. The sum is taken in fp32 over the fp32
  original W and cast once: over a bf16 base loaded from a checkpoint that stores W wider (fp32),
  `apply_lora` keeps those originals on the host (`fp32_originals`), else a change smaller than
  half a bf16 step of W (at lr 1e-6, nearly all of them) would round back to the bf16 W and the
  served model would never move. Where the checkpoint stores W in bf16, the bf16 W is the original;
  a served bf16 copy then moves only where the change exceeds half a step;
- checkpoints hold the adapter (peft's `adapter_config.json` + `adapter_model.safetensors`);
  `load_merged` reads one for evaluation (the base from `<role>.model`, the adapter merged in).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from coevo.core.config import LoraConfig

LOG = logging.getLogger("coevo.lora")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_NAME = "default"  # peft's name of the one adapter a policy trains
BASE_DTYPES = (torch.float32, torch.bfloat16)  # a frozen base may be bf16; fp16 risks overflow in the forward
BASE_FP32 = "coevo_base_fp32"  # attribute of a wrapped layer: its base weight's fp32 original, on the host
SAFETENSORS_DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16}


def is_adapter_dir(path: str | Path) -> bool:
    """Whether `path` is a peft adapter checkpoint (what a LoRA policy saves), not a full HF model."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_lora_model(model: Any) -> bool:
    """Whether `model` is a peft model (the policy trains an adapter over it)."""
    from peft import PeftModel

    return isinstance(model, PeftModel)


def hf_model(model: Any) -> Any:
    """The transformers model under a peft wrapper (its wrapped layers run the adapter), else `model` itself."""
    return model.get_base_model() if is_lora_model(model) else model


def _leaf_names(model: torch.nn.Module) -> list[str]:
    """Distinct last name parts of `model`'s Linear modules: what `target_modules` may name."""
    return sorted({name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def check_target_modules(model: torch.nn.Module, cfg: LoraConfig, role: str) -> None:
    """Every `lora.target_modules` entry names a module of `model`; else an error naming the key and real names."""
    names = [name for name, _ in model.named_modules()]
    # peft's rule: a target matches a module whose full name is it or ends with "." + it.
    missing = [t for t in cfg.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if not cfg.target_modules or missing:
        raise ValueError(f"config key {role}.lora.target_modules={list(cfg.target_modules)}: "
                         f"{missing or 'no module'} not in {type(model).__name__}; its Linear modules are named "
                         f"{_leaf_names(model)[:12]}")


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, role: str) -> Any:
    """`model` (a PreTrainedModel) as a peft LoRA model: base frozen, fp32 adapter trainable; over a bf16 base,
    the wrapped weights' fp32 originals (`fp32_originals`) kept on the host for `merged_state_dict`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    base_dtype = next(model.parameters()).dtype
    if base_dtype not in BASE_DTYPES:
        raise ValueError(f"config key {role}.dtype={str(base_dtype).replace('torch.', '')}: the frozen base of a "
                         f"LoRA {role} must be float32 or bfloat16")
    check_target_modules(model, cfg, role)
    model.requires_grad_(False)
    peft_cfg = PeftLoraConfig(r=int(cfg.rank), lora_alpha=float(cfg.alpha), target_modules=list(cfg.target_modules),
                              lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    source = str(getattr(model, "name_or_path", "") or "")
    peft_model = get_peft_model(model, peft_cfg, adapter_name=ADAPTER_NAME)
    for name, param in peft_model.named_parameters():
        if "lora_" in name:
            # fp32 master weights whatever the base holds (coevo/train/precision.py says why).
            param.data = param.data.float()
            param.requires_grad_(True)
        elif param.requires_grad:
            raise RuntimeError(f"LoRA {role}: base parameter {name} is trainable; only adapter weights may be")
    if base_dtype != torch.float32:
        layers = _lora_layers(peft_model.get_base_model())
        originals = fp32_originals({f"{n}.weight": layer.base_layer.weight for n, layer in layers}, source, role)
        for n, layer in layers:
            if f"{n}.weight" in originals:
                setattr(layer, BASE_FP32, originals[f"{n}.weight"])
    return peft_model


def _lora_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """(name, layer) of every peft LoRA layer of `model`, in module order."""
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


def _safetensors_files(source: str) -> list[Path]:
    """The safetensors files of checkpoint `source` (a directory, or a hub id already in the local cache)."""
    if Path(source).is_dir():
        return sorted(Path(source).glob("*.safetensors"))
    from huggingface_hub import snapshot_download

    return sorted(Path(snapshot_download(source, allow_patterns=["*.safetensors"], local_files_only=True))
                  .glob("*.safetensors"))


def fp32_originals(weights: dict[str, torch.Tensor], source: str, role: str) -> dict[str, torch.Tensor]:
    """fp32 CPU copies, by name, of the loaded (narrower) `weights` that checkpoint `source` stores wider.

    A weight the checkpoint stores in its loaded dtype is its own original: no copy. A wider one
    is read in fp32 and kept if it rounds to the loaded weight bit for bit (the model came from
    this file). Otherwise (no safetensors files, a name missing, a weight that is not the file's,
    e.g. an adapter `checkpoint` merged at load) a warning and no copies: the merge then starts
    from the loaded weights, and a change below half their step is not served.
    """
    try:
        out, reason = _read_originals(weights, _safetensors_files(source) if source else [])
    except (OSError, ValueError) as err:  # a hub id not in the local cache, or not a valid id
        out, reason = {}, f"{type(err).__name__}: {err}"
    if reason:
        dtype = str(next(iter(weights.values())).dtype).replace("torch.", "")
        LOG.warning("LoRA %s: the served merge starts from the loaded %s weights, not fp32 originals (%s from "
                    "%r): a change below half a step of a weight is not served", role, dtype, reason, source)
    elif out:
        LOG.info("LoRA %s: fp32 originals of %d wrapped weights kept on the host for the merge (%.2f GiB)",
                 role, len(out), sum(t.numel() for t in out.values()) * 4 / 2**30)
    return out


def _read_originals(weights: dict[str, torch.Tensor], files: list[Path]) -> tuple[dict[str, torch.Tensor], str]:
    """(the fp32 copies `fp32_originals` keeps, "") from safetensors `files`, or ({}, why there are none)."""
    from safetensors import safe_open

    if not files:
        return {}, "no safetensors files"
    out: dict[str, torch.Tensor] = {}
    missing = set(weights)
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in sorted(missing.intersection(f.keys())):
                w = weights[name]
                missing.discard(name)
                if SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype()) == w.dtype:
                    continue  # stored as loaded: the loaded weight is the original
                original = f.get_tensor(name).float()
                if not torch.equal(original.to(w.dtype), w.detach().cpu()):
                    return {}, f"{name} in {path.name} is not the loaded weight"
                out[name] = original
    if missing:
        return {}, f"{len(missing)} wrapped weights missing, e.g. {min(missing)}"
    return out, ""


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Plain weights of LoRA `model` under the base model's names: W + scale * B A for every wrapped layer.

    Each tensor keeps the base weight's dtype (a bf16 base's is the serving dtype; an fp32 one the
    engine casts once) and device. The sum is done in fp32 from W's fp32 original (`BASE_FP32`,
    moved to the device one layer at a time) where `apply_lora` kept one, else from W itself, then
    cast once. The model is not modified (no merge_adapter): a merge and unmerge would round a bf16 base.
    """
    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" not in name:  # adapter A/B matrices are folded in below
            out[name.replace(".base_layer.", ".")] = tensor.detach()
    for name, layer in _lora_layers(base):
        key = f"{name}.weight"
        if key not in out:
            raise RuntimeError(f"LoRA layer {name} has no base weight {key} to merge into")
        w = out[key]
        original = getattr(layer, BASE_FP32, None)
        w32 = w.float() if original is None else original.to(w.device)
        delta = sum(layer.get_delta_weight(a).float() for a in layer.active_adapters)
        out[key] = (w32 + delta).to(w.dtype)
    return out


def plain_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """`model`'s weights as a plain HF model holds them: merged for a LoRA model, else its own (detached)."""
    if is_lora_model(model):
        return merged_state_dict(model)
    return {name: t.detach() for name, t in model.state_dict().items()}


def load_adapter_weights(model: Any, directory: str | Path, role: str) -> None:
    """Load the adapter `Policy.save` wrote in `directory` into LoRA `model` (same rank, targets, layers)."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights, set_peft_model_state_dict

    directory = Path(directory)
    if not is_adapter_dir(directory):
        raise ValueError(f"{directory} holds no LoRA adapter ({ADAPTER_CONFIG}) but {role}.lora.rank > 0; "
                         f"it was saved by a full fine-tuning {role} (set {role}.lora.rank=0 to load it)")
    saved = PeftConfig.from_pretrained(str(directory))
    current = model.peft_config[ADAPTER_NAME]
    if saved.r != current.r or set(saved.target_modules) != set(current.target_modules):
        raise ValueError(f"adapter {directory} has rank {saved.r} over {sorted(saved.target_modules)}; this {role} "
                         f"has {role}.lora.rank={current.r} over {sorted(current.target_modules)}")
    device = next(model.parameters()).device
    weights = load_peft_weights(str(directory), device=str(device))
    result = set_peft_model_state_dict(model, weights, adapter_name=ADAPTER_NAME)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if result.unexpected_keys or missing:
        raise ValueError(f"adapter {directory} does not fit this {role}: unexpected {result.unexpected_keys[:3]}, "
                         f"missing {missing[:3]}")
    for name, param in model.named_parameters():
        if "lora_" in name:  # the file may hold another dtype; training keeps fp32 adapter weights
            param.data = param.data.float()


def load_merged(base_path: str, adapter_dir: str | Path, dtype: torch.dtype) -> Any:
    """The HF model at `base_path` with the adapter in `adapter_dir` merged into its weights (a plain model)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
