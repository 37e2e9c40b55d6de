"""vLLM engine parity with the HF engine, and in-place weight sync after a GRPO update (docs/method.md §5.2).

One vLLM engine is started for the whole module (about 30-60 s on 2 CPU cores); tests that change
its weights put the original ones back. The model is built here: vLLM's CPU attention needs a
head size of at least 32, which the shared tiny fixtures (head size 8-16) do not have.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from coevo.core.config import PolicyConfig
from coevo.core.grpo import sequence_token_logprobs
from coevo.core.types import SamplingParams, TrainSequence
from coevo.train.engines import build_engine
from coevo.train.engines.hf import HFEngine
from coevo.train.policy import Policy

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
SENTENCES = [
    "what is the answer to the question about the search results",
    "<search>who wrote the novel</search> <answer>Jane Austen</answer>",
    "the information says the capital of France is Paris",
    "café naïve résumé 東京 Zürich",
]
PROMPTS = ["what is the capital", "Zürich", "<search>who wrote", "the search results say that the answer is"]


def _build_model(out_dir: Path) -> Path:
    """2-layer Llama (head size 32, tied embeddings as in SmolLM2) with a byte-level BPE tokenizer trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from coevo.train.models import CHAT_TEMPLATE

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|pad|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(SENTENCES * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", eos_token="<|im_end|>",
                                  bos_token="<|im_start|>")
    tok.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id, tie_word_embeddings=True)
    torch.manual_seed(3)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # A random tied model repeats its last token (each token scores itself highest). Large
        # projections let the layers dominate the residual stream; a large final norm sharpens
        # the next-token distribution (mean sampled log-prob about -3), so outputs vary.
        for name, param in model.named_parameters():
            if param.dim() == 2 and "embed" not in name:
                param.normal_(0.0, 0.3)
        model.model.norm.weight.fill_(20.0)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def _cfg(**kw) -> PolicyConfig:  # noqa: ANN003
    # max_model_len = max_prompt_tokens + max_new_tokens: the 512 positions of the test model.
    base = dict(preset="test", model="unused", engine="vllm", dtype="float32", lr=0.3, kl_coef=0.0,
                micro_batch_size=8, gpu_memory_utilization=0.1, max_prompt_tokens=384, max_new_tokens=128)
    base.update(kw)
    return PolicyConfig(**base)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_model(tmp_path_factory.mktemp("vllm") / "model")


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    """The one vLLM engine of this module (fp32: exact greedy parity with HF on CPU)."""
    from coevo.train.engines.vllm import VLLMEngine, require_vllm

    require_vllm()  # make test installs the vllm extra: a missing vLLM is an error here, not a skip
    from coevo.train.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(str(model_dir))
    eng = VLLMEngine(str(model_dir), tok, _cfg(), kv_cache_memory_bytes=32 << 20)
    yield eng
    eng.close()


@pytest.fixture()
def hf(model_dir: Path):
    """(model, tokenizer) freshly loaded from the module's checkpoint."""
    from coevo.train.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(model_dir))


def _prompts(tok) -> list[list[int]]:  # noqa: ANN001
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def _ids(out) -> list[list[list[int]]]:  # noqa: ANN001
    return [[c.token_ids for c in cs] for cs in out]


def test_greedy_matches_hf(engine, hf) -> None:  # noqa: ANN001
    model, tok = hf
    prompts = _prompts(tok)
    ours, ref = engine.generate(prompts, GREEDY), HFEngine(model, tok).generate(prompts, GREEDY)
    assert _ids(ours) == _ids(ref)
    assert len({tuple(c[0].token_ids) for c in ours}) > 1, "degenerate model: every prompt gives the same output"
    for a, b, p in zip(ours, ref, prompts):
        assert a[0].prompt_ids == p and a[0].text == b[0].text and a[0].finish_reason == b[0].finish_reason
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-4)
    assert engine.generate(prompts[:1], SamplingParams(max_new_tokens=0))[0][0].token_ids == []


def test_sampled_logprobs_are_raw_model_logprobs(engine, hf) -> None:  # noqa: ANN001
    model, tok = hf
    sp = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8, n=2, seed=5)
    for comp in (c for cs in engine.generate(_prompts(tok)[:2], sp) for c in cs):
        assert len(comp.logprobs) == len(comp.token_ids) > 0
        ids = torch.tensor([comp.prompt_ids + comp.token_ids])
        with torch.no_grad():
            ref = sequence_token_logprobs(model, ids, torch.ones_like(ids))[0, len(comp.prompt_ids) - 1:]
        # Raw log-probs (before temperature/top-p), the quantity GRPO uses as old_logprobs.
        assert torch.allclose(ref, torch.tensor(comp.logprobs), atol=1e-4)


def test_n_samples_and_seed(engine, hf) -> None:  # noqa: ANN001
    _, tok = hf
    prompts = _prompts(tok)[:2]
    prompts = [prompts[0], prompts[1], prompts[0]]  # a repeated prompt must still get its own samples
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=7)
    out = engine.generate(prompts, sp)
    assert [len(c) for c in out] == [3, 3, 3]
    assert _ids(out) == _ids(engine.generate(prompts, sp))
    assert _ids(out) != _ids(engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=8)))
    assert _ids(out)[0] != _ids(out)[2]
    assert len({tuple(c.token_ids) for c in out[0]}) > 1


def test_seeded_sampling_over_a_batch_larger_than_one_step(engine, hf) -> None:  # noqa: ANN001
    _, tok = hf
    ids = tok(" ".join(SENTENCES * 6), add_special_tokens=False)["input_ids"][:300]
    prompts = [ids[i:] + ids[:i] for i in range(16)]  # > 4096 prompt tokens: more than one scheduler step
    sp = SamplingParams(temperature=1.0, max_new_tokens=2, seed=3)
    out = engine.generate(prompts, sp)
    assert sum(map(len, prompts)) > 4096 and all(len(c[0].token_ids) == 2 for c in out)
    assert _ids(out) == _ids(engine.generate(prompts, sp))


def test_stop_strings_like_hf(engine, hf) -> None:  # noqa: ANN001
    model, tok = hf
    prompts = _prompts(tok)
    ref_engine = HFEngine(model, tok)
    free = ref_engine.generate(prompts, GREEDY)
    # A stop string that completes mid-way through the first prompt's greedy text.
    text = free[0][0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop.strip(), f"greedy text too short to pick a stop string from: {text!r}"
    sp = SamplingParams(temperature=0.0, max_new_tokens=12, stop=[stop])
    ours, ref = engine.generate(prompts, sp), ref_engine.generate(prompts, sp)
    assert _ids(ours) == _ids(ref)
    assert [c[0].finish_reason for c in ours] == [c[0].finish_reason for c in ref]
    assert ours[0][0].finish_reason == "stop" and stop in ours[0][0].text
    assert len(ours[0][0].token_ids) < len(free[0][0].token_ids)
    assert ours[0][0].text == tok.decode(ours[0][0].token_ids, skip_special_tokens=True)


def test_weights_sync_in_place_after_grpo_update(engine, hf, model_dir: Path) -> None:  # noqa: ANN001
    model, tok = hf
    prompts = _prompts(tok)
    before = engine.generate(prompts, GREEDY)
    policy = Policy(_cfg(), model, tok, engine=engine)
    sampled = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, n=2, seed=1))
    batch = [TrainSequence.from_completion(c, advantage=1.0 if j == 0 else -1.0)
             for cs in sampled for j, c in enumerate(cs)]
    metrics = policy.update(batch)  # one AdamW step at lr 0.3, then engine.sync_weights(policy.model)
    assert metrics["n_tokens"] > 0 and engine.last_sync_s is not None
    after = engine.generate(prompts, GREEDY)
    assert _ids(after) == _ids(HFEngine(policy.model, tok).generate(prompts, GREEDY))
    assert _ids(after) != _ids(before)
    # Syncing the original weights back restores the original behaviour (and the module's engine).
    from coevo.train.models import load_model_and_tokenizer

    original, _ = load_model_and_tokenizer(str(model_dir))
    engine.sync_weights(original)
    assert _ids(engine.generate(prompts, GREEDY)) == _ids(before)


def test_lora_policy_syncs_merged_weights(engine, hf, model_dir: Path) -> None:  # noqa: ANN001
    """A LoRA policy's update reaches vLLM as merged weights: vLLM then generates as HF through the adapter."""
    from coevo.core.config import LoraConfig

    model, tok = hf
    prompts = _prompts(tok)
    before = engine.generate(prompts, GREEDY)
    policy = Policy(_cfg(lr=0.05, lora=LoraConfig(rank=8, alpha=16.0)), model, tok, engine=engine)
    sampled = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8, n=2, seed=1))
    batch = [TrainSequence.from_completion(c, advantage=1.0 if j == 0 else -1.0)
             for cs in sampled for j, c in enumerate(cs)]
    policy.update(batch)
    after = engine.generate(prompts, GREEDY)
    assert _ids(after) == _ids(HFEngine(policy.model, tok).generate(prompts, GREEDY))  # HF through the peft model
    assert _ids(after) != _ids(before)
    from coevo.train.models import load_model_and_tokenizer

    original, _ = load_model_and_tokenizer(str(model_dir))
    engine.sync_weights(original)
    assert _ids(engine.generate(prompts, GREEDY)) == _ids(before)


def test_engine_processes_start_with_the_pinned_mmap_threshold(engine) -> None:  # noqa: ANN001
    from coevo.core.lifetime import descendants, process_table
    from coevo.train.allocator import MMAP_THRESHOLD, MMAP_THRESHOLD_ENV

    table = process_table()
    children = descendants(table, [os.getpid()])
    names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in children}
    engine_pids = [pid for pid, name in names.items() if name.startswith("VLLM::")]
    assert {names[p] for p in engine_pids} >= {"VLLM::EngineCor", "VLLM::Worker"}, names
    for pid in engine_pids:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert f"{MMAP_THRESHOLD_ENV}={MMAP_THRESHOLD}".encode() in env, names[pid]
    assert MMAP_THRESHOLD_ENV not in os.environ  # only the engine's start saw it


def test_cpu_limits_are_clear_errors(tmp_path: Path) -> None:
    from coevo.train.engines.vllm import VLLMEngine, require_vllm
    from coevo.train.models import build_tiny_random, load_model_and_tokenizer

    require_vllm()
    model, tok = load_model_and_tokenizer(str(build_tiny_random(tmp_path / "m", hidden=32, heads=4)))  # head size 8
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # both fail before any engine process starts
        with pytest.raises(ValueError, match="head size 8"):
            VLLMEngine(model, tok, _cfg())
        with pytest.raises(ValueError, match="ipc"):
            VLLMEngine(model, tok, _cfg(), weight_sync="ipc")
        # the config keys reach the engine through build_engine (CUDA-only features fail before anything starts)
        with pytest.raises(ValueError, match=r"sleep_mode=true \(config keys <role>.weight_sync, <role>.sleep_mode\)"):
            build_engine(_cfg(sleep_mode=True), model, tok)
        with pytest.raises(ValueError, match=r"weight_sync=ipc \(config keys"):
            build_engine(_cfg(weight_sync="ipc"), model, tok)


def test_missing_vllm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, hf) -> None:  # noqa: ANN001
    model, tok = hf
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(ImportError, match="pip install"):
        build_engine(_cfg(), model, tok)


def test_installed_vllm_has_what_each_weight_sync_calls() -> None:
    """The release `make` installs passes the engine-start check (tests/coevo/train/test_vllm_compat.py has fakes)."""
    from coevo.train.engines.vllm import require_vllm
    from coevo.train.engines.vllm_compat import SUPPORTED_VLLM, WEIGHT_SYNC_APIS, missing_apis

    assert require_vllm().__version__ == SUPPORTED_VLLM
    assert {mode: missing_apis(mode) for mode in WEIGHT_SYNC_APIS} == {mode: [] for mode in WEIGHT_SYNC_APIS}


def test_entry_points_load_no_numba_before_an_engine_starts() -> None:
    """`coevo.solve rollout=vllm` failed at engine start when a module it imports loaded bm25s at import time.

    `import bm25s` loads numba and llvmlite; a vLLM CPU worker forked from a process that holds
    llvmlite's library wrapper dies in vLLM's kernel-override scan of sys.modules
    ("'_lib_fn_wrapper' object has no attribute 'get'"). The entry points build their engines before
    their retrievers, so bm25s (evidence/retrieval.py, evidence/bm25_shards.py) is imported where it
    is used. A full one-step vLLM run (about 4.5 min here) is what showed it; this checks the cause.
    """
    import subprocess

    code = ("import sys, coevo.solve, coevo.run, coevo.eval; "
            "print(sorted(m for m in ('bm25s', 'numba', 'llvmlite') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_an_in_process_engine_takes_weights_as_a_stream_of_tensors(model_dir: Path) -> None:
    """`weight_sync=inprocess`: the engine core runs in the caller's process and `load_weights` hands vLLM's
    in-place reload a generator, no file: perturbed embeddings change greedy output, the originals bring it
    back. In a fresh process (inprocess_engine.py): this worker may hold llvmlite, which vLLM cannot scan."""
    import subprocess

    script = Path(__file__).with_name("inprocess_engine.py")
    out = subprocess.run([sys.executable, str(script), str(model_dir)], capture_output=True, text=True, timeout=600,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"


def test_an_in_process_engine_refuses_a_process_holding_llvmlite(model_dir: Path, hf, monkeypatch) -> None:  # noqa: ANN001
    from coevo.train.engines.vllm import VLLMEngine

    monkeypatch.setitem(sys.modules, "llvmlite.binding.ffi", sys.modules.get("llvmlite.binding.ffi", object()))
    with pytest.raises(RuntimeError, match=r"weight_sync=inprocess: this process has imported llvmlite"):
        VLLMEngine(str(model_dir), hf[1], _cfg(), kv_cache_memory_bytes=32 << 20, weight_sync="inprocess")
