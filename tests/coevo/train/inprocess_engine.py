"""`python tests/coevo/train/inprocess_engine.py <model dir>`: an in-process vLLM engine fed a stream of tensors.

Run by test_vllm_engine.py in a fresh interpreter (nothing else imported); prints "ok" when every check holds.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from coevo.core.config import PolicyConfig
from coevo.core.types import SamplingParams
from coevo.train.engines.hf import HFEngine
from coevo.train.engines.vllm import VLLMEngine
from coevo.train.engines.vllm_weights import engine_weights
from coevo.train.models import load_model_and_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
PROMPTS = ["what is the capital", "Zürich", "<search>who wrote", "the search results say that the answer is"]


def main(model_dir: str) -> None:
    model, tok = load_model_and_tokenizer(model_dir)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    cfg = PolicyConfig(preset="test", model="unused", engine="vllm", dtype="float32", gpu_memory_utilization=0.1,
                       max_prompt_tokens=384, max_new_tokens=128)
    ids = lambda out: [[c.token_ids for c in cs] for cs in out]  # noqa: E731
    with VLLMEngine(model_dir, tok, cfg, kv_cache_memory_bytes=32 << 20, weight_sync="inprocess") as eng:
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # set for the engine's start only
        before = eng.generate(prompts, GREEDY)
        assert ids(before) == ids(HFEngine(model, tok).generate(prompts, GREEDY))
        handed: list[str] = []

        def perturbed():  # noqa: ANN202
            gen = torch.Generator().manual_seed(0)
            for name, tensor in engine_weights(model, torch.float32):
                handed.append(name)
                noise = torch.randn(tensor.shape, generator=gen) if "embed" in name else 0
                yield name, tensor + 0.5 * noise

        eng.load_weights(perturbed())
        assert "lm_head.weight" in handed and not list(Path(eng.sync_dir).glob("*.safetensors")), handed
        assert ids(eng.generate(prompts, GREEDY)) != ids(before)
        eng.sync_weights(model)
        assert ids(eng.generate(prompts, GREEDY)) == ids(before)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
