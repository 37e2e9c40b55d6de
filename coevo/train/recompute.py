"""Gradient checkpointing of a policy (`<role>.gradient_checkpointing=true`) without dropout.

HF decoders recompute a layer's activations in backward only in train mode, while a policy
stays in eval mode on purpose: RL ratios compare the deterministic function that sampled the
tokens. So a checkpointed policy has every dropout probability forced to 0 once, at load
(`disable_dropout`, asserted), and is put in train mode only around the forward + backward of
an update's micro-batch (`train_mode`): train mode then changes nothing but the recomputation.
Non-reentrant checkpointing (`use_reentrant=False`) is used: the reentrant kind needs inputs
that require gradients, which a frozen LoRA base's embeddings do not give.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def _dropout_fields(obj: object) -> dict[str, float]:
    """Float attributes of `obj` whose name holds "dropout" (HF keeps e.g. `attention_dropout` on each layer)."""
    return {k: v for k, v in vars(obj).items() if "dropout" in k and isinstance(v, float)}


def remaining_dropout(model: torch.nn.Module) -> list[str]:
    """Where `model` still drops out: dropout modules with p > 0, and non-zero dropout fields of modules and config."""
    left = [f"{name or 'model'} (p={m.p})" for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
    for name, module in model.named_modules():
        left += [f"{name or 'model'}.{k}={v}" for k, v in _dropout_fields(module).items() if v > 0]
    config = getattr(model, "config", None)
    if config is not None:
        left += [f"config.{k}={v}" for k, v in _dropout_fields(config).items() if v > 0]
    return left


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout probability of `model` to 0 (modules, per-layer fields, config); assert none is left."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for key in _dropout_fields(module):
            setattr(module, key, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key in _dropout_fields(config):
            setattr(config, key, 0.0)
    left = remaining_dropout(model)
    if left:
        raise RuntimeError(f"dropout still active after disabling it: {left[:5]}; train mode would change the policy")


def enable_gradient_checkpointing(model: torch.nn.Module, role: str) -> None:
    """Dropout off, then HF's non-reentrant gradient checkpointing on `model` (a PreTrainedModel)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"config key {role}.gradient_checkpointing=true: {type(model).__name__} does not support "
                         f"gradient checkpointing in transformers; set {role}.gradient_checkpointing=false")
    disable_dropout(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def train_mode(model: torch.nn.Module, enabled: bool) -> Iterator[None]:
    """Train mode for the block when `enabled` (checkpointing only recomputes in train mode), eval afterwards."""
    if not enabled:
        yield
        return
    model.train()
    try:
        yield
    finally:
        model.eval()
