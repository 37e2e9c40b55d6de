"""Model shapes from configs alone: parameter counts and dimensions without reading any weight.

`meta_model` instantiates a causal LM on torch's meta device from its config: a local or
embedded model's `config.json`, or, for the hub models the presets name, their public
`config.json` values (coevo/train/public_configs.py: so `coevo.plan` sizes `solver=qwen2.5-7b`
offline, with nothing downloaded). `shape_of` reads what the memory estimates need; `adapter_parameters` counts a
LoRA adapter exactly, from the Linear layers its target names match.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from coevo.train.lora import is_adapter_dir
from coevo.train.models import resolve_model_path
from coevo.train.public_configs import public_config


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimates need from a model's config."""

    params: int  # parameters, tied embeddings counted once
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    tied: bool  # input and output embeddings share one matrix (vLLM runs untied: one more copy)
    kv_heads: int
    head_dim: int


def meta_model(model: str, checkpoint: Optional[str] = None) -> Any:
    """The causal LM of a preset, directory or hub id on torch's meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # A LoRA checkpoint holds only an adapter: the shape is the base model's.
    weights = checkpoint if checkpoint and not is_adapter_dir(checkpoint) else None
    config = None if weights else public_config(model)
    if config is None:
        config = AutoConfig.from_pretrained(weights or resolve_model_path(model))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def shape_of(model: Any) -> ModelShape:
    """`ModelShape` of a (meta) model."""
    config = model.config
    text = config.get_text_config(decoder=True)
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    return ModelShape(params=int(sum(p.numel() for p in model.parameters())), hidden=hidden,
                      layers=int(text.num_hidden_layers), vocab=int(text.vocab_size),
                      intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
                      kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                      head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
                      tied=bool(getattr(config, "tie_word_embeddings", False)))


def adapter_parameters(model: Any, lora: Any) -> int:
    """Parameters of a rank-`lora.rank` LoRA adapter on `model`: r x (in + out) per Linear whose
    name ends with one of `lora.target_modules` (peft's matching rule for plain names); 0 at rank 0."""
    import torch

    rank = int(getattr(lora, "rank", 0) or 0)
    if rank <= 0:
        return 0
    targets = tuple(lora.target_modules)
    return sum(rank * (m.in_features + m.out_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in targets)
