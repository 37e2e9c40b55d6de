"""Tiny random models for coevo unit tests: built in code, saved and reloaded, never downloaded."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

BPE_SENTENCES = [
    "what is the answer to the question about the search results",
    "<search>who wrote the novel</search> <answer>Jane Austen</answer>",
    "the information says the capital of France is Paris",
    "café naïve résumé 東京 Zürich",
]


def build_bpe_model(out_dir: Path, sentences: list[str] = BPE_SENTENCES * 4, vocab_size: int = 400) -> Path:
    """A 2-layer Qwen2 with a byte-level BPE tokenizer trained here (sub-word and multi-byte tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from coevo.train.models import CHAT_TEMPLATE

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(sentences, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|im_end|>",
                                  bos_token="<|im_start|>")
    tok.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(config)
    # A larger init makes the random model's next-token choice less flat, so greedy output varies.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from coevo.train.models import build_tiny_random

    return build_tiny_random(tmp_path_factory.mktemp("tiny") / "model", hidden=32)


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bpe_model(tmp_path_factory.mktemp("bpe") / "model")


@pytest.fixture(scope="session")
def prompt_bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The BPE model with a vocabulary learnt from the role packages' sources, which hold every
    prompt's fixed text: prompts take about a word per token instead of a byte, so updates on
    whole episodes stay quick. Decoding stays exact (byte-level)."""
    root = Path(__file__).resolve().parents[2]
    sources = [(root / pkg).glob("*.py") for pkg in ("proposer", "solver")]
    lines = [line for files in sources for f in sorted(files) for line in f.read_text().splitlines()]
    return build_bpe_model(tmp_path_factory.mktemp("prompt_bpe") / "model", lines * 2, vocab_size=3000)


@pytest.fixture()
def tiny(tiny_dir: Path):
    """(model, tokenizer) freshly loaded from the tiny word-level checkpoint."""
    from coevo.train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_dir))


@pytest.fixture()
def bpe(bpe_dir: Path):
    """(model, tokenizer) freshly loaded from the byte-level BPE checkpoint."""
    from coevo.train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(bpe_dir))


def _tensorboard_points(log_dir: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value rounded to 4 digits) of every scalar in every event file under `log_dir`."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    points = []
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                value = v.tensor.float_val[0] if v.HasField("tensor") else v.simple_value
                points.append((v.tag, event.step, round(value, 4)))
    return points


@pytest.fixture()
def tensorboard_points():
    """`f(log_dir)`: the scalars TensorBoard holds, as (tag, step, value), read from the raw event files."""
    return _tensorboard_points
