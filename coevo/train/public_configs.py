"""The public config.json values of the hub models the shipped presets name, and a transformers config from them.

Kept apart from coevo/train/shapes.py so that it imports nothing but transformers (lazily) and the standard
library: bench/gpu_verify.py builds the 7B and 3B shapes from it on a machine that has torch and transformers
only (no omegaconf, which shapes.py's imports pull in). `coevo.plan` sizes `solver=qwen2.5-7b` from these
values offline, with nothing downloaded.
"""
from __future__ import annotations

from typing import Any, Optional

# Public config.json values of the hub models the shipped presets name (configs/model/*.yaml).
_QWEN25_3B = {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
              "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
              "tie_word_embeddings": True, "max_position_embeddings": 32768}
PUBLIC_CONFIGS: dict[str, dict] = {
    "Qwen/Qwen2.5-7B-Instruct": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
                                 "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                                 "vocab_size": 152064, "tie_word_embeddings": False,
                                 "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-3B-Instruct": _QWEN25_3B,
    "Qwen/Qwen2.5-3B": _QWEN25_3B,
    "Qwen/Qwen3-4B": {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                      "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                      "tie_word_embeddings": True, "max_position_embeddings": 40960},
}


def public_config(model: str, **changes: Any) -> Optional[Any]:
    """A transformers config built from `PUBLIC_CONFIGS[model]` with `changes` applied (e.g. fewer layers);
    None for any other model."""
    values = PUBLIC_CONFIGS.get(model)
    if values is None:
        return None
    from transformers import AutoConfig

    values = {**values, **changes}
    return AutoConfig.for_model(values.pop("model_type"), **values)
