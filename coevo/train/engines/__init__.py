"""Generation engines behind one contract (`coevo.core.types.GenerationEngine`), chosen by name.

`ENGINES` is the one place a new engine kind plugs in: map its config name (`<role>.engine`)
to a factory `(model, tokenizer, policy_cfg) -> GenerationEngine`. `hf` generates with the training
model itself; `vllm` serves a copy of its weights and is re-synced after every update.
vLLM is imported only when a `vllm` engine is built (CPU-only machines may lack it).
"""
from __future__ import annotations

from typing import Any, Callable

from coevo.core.config import PolicyConfig
from coevo.core.types import GenerationEngine
from coevo.train.engines.hf import HFEngine
from coevo.train.engines.vllm import VLLMEngine

EngineFactory = Callable[[Any, Any, PolicyConfig], GenerationEngine]

ENGINES: dict[str, EngineFactory] = {
    "hf": lambda model, tokenizer, cfg: HFEngine(model, tokenizer, cfg.generation_rows or None),
    # vLLM serves a copy of the weights (staged from `model`); `model` stays the training copy
    # and Policy.update pushes it to the engine with sync_weights after every step.
    "vllm": lambda model, tokenizer, cfg: VLLMEngine(model, tokenizer, cfg, weight_sync=str(cfg.weight_sync),
                                                     sleep_mode=bool(cfg.sleep_mode)),
}


def build_engine(cfg: PolicyConfig, model: Any, tokenizer: Any) -> GenerationEngine:
    """Generation engine named by `cfg.engine`."""
    name = str(getattr(cfg.engine, "value", cfg.engine))
    factory = ENGINES.get(name)
    if factory is None:
        raise ValueError(f"config key engine={name!r} is not available in this build; "
                         f"known engines: {sorted(ENGINES)}")
    return factory(model, tokenizer, cfg)
