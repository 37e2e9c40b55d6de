"""Compiled decoder layers for a CPU update (`<role>.cpu_compile`).

Contract: with the key on, each decoder layer runs through `torch.compile` inside
`CompiledLayers.active()`, which the policy enters only around an update micro-batch's forward and
backward, and eagerly everywhere else. Outside that block the layers are the plain modules:
generation with a KV cache, scoring, checkpoints and the vLLM weight sync see the same parameters
under the same state_dict names (compiling the model object itself would prefix them `_orig_mod.`).
The compiled callable is installed where `nn.Module.compile` installs it (`_compiled_call_impl`),
so hooks and HF's gradient checkpointing wrap it as they wrap the eager layer.

Why: at hidden size 576 an update is bound by memory traffic, not matmuls (docs/learning.md
"Update profile": elementwise ops, norms and casts are over half its time); inductor fuses them.
Why only without a KV cache: HF's cache keeps per-layer state (`is_initialized`, the layer index)
that dynamo guards on, so a cached forward recompiles once per layer until torch's recompile limit
and then runs eagerly without saying so. The key is therefore refused for an update that
shares a prompt's cache (`compile_needs_no_cache`: at start by `validate_config`, and again here for a
policy built directly); it needs `gradient_checkpointing=true` or `shared_prompt=false`.
Why `dynamic=True`: sequence lengths change with every micro-batch. The layers share their code and
dynamo passes built-in modules' parameters as graph inputs, so all layers reuse one graph.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Callable

import torch
from torch._inductor.cpp_builder import get_cpp_compiler

from coevo.core.config import PolicyConfig, compile_needs_no_cache


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of an HF causal LM (`model.base_model.layers`: Llama, Qwen2, Qwen3, Mistral...)."""
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no base_model.layers: cannot shard or compile it per "
                         f"decoder layer")
    return layers


def require_cpp_compiler(role: str) -> None:
    """torch.compile on the CPU writes C++: refuse `<role>.cpu_compile` where no compiler is found."""
    try:  # torch's own search: $CXX, then g++ / clang++
        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - torch raises its own error kinds here; all mean "none usable"
        raise ValueError(f"config key {role}.cpu_compile=true: torch.compile on the CPU needs a C++ compiler "
                         f"({exc}); install one (g++) or set {role}.cpu_compile=false") from exc


def update_layers(cfg: PolicyConfig, model: torch.nn.Module, role: str, shared_prompt: bool,
                  frozen: bool) -> "CompiledLayers":
    """The decoder layers of `model` (an HF model, not a peft wrapper) compiled for the update where
    `<role>.cpu_compile` applies: a trainable policy on the CPU. Else none: `active()` changes nothing."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    if frozen or not on_cpu or not cfg.cpu_compile:
        return CompiledLayers([])
    compile_needs_no_cache(role, shared_prompt)  # validate_config checks it at start; direct Policy users here
    require_cpp_compiler(role)
    return CompiledLayers(list(decoder_layers(model)))


class CompiledLayers:
    """One lazily compiled callable per layer of `layers`, installed only inside `active()`."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        self.layers = layers
        self.compiled: list[Callable] = [torch.compile(layer._call_impl, dynamic=True) for layer in self.layers]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Compiled forwards for the block (the first call per shape compiles), eager ones afterwards."""
        for layer, fn in zip(self.layers, self.compiled):
            layer._compiled_call_impl = fn
        try:
            yield
        finally:
            for layer in self.layers:
                layer._compiled_call_impl = None
