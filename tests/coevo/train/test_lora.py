"""`<role>.gradient_checkpointing` and `<role>.lora` on tiny random models (coevo/train/recompute.py, lora.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from coevo.core.config import EvalRootConfig, LoraConfig, PolicyConfig, compose, to_object
from coevo.core.grpo import sequence_token_logprobs
from coevo.core.types import SamplingParams, TrainSequence
from coevo.train.checkpoint import resumable_checkpoint, save_checkpoint, verify_checkpoint
from coevo.train.engines.vllm_weights import engine_numel
from coevo.train.engines.vllm_weights import engine_tensors as _engine_tensors
from coevo.train.lora import BASE_FP32, hf_model, is_adapter_dir, merged_state_dict
from coevo.train.models import load_model_and_tokenizer
from coevo.train.policy import Policy
from coevo.train.recompute import remaining_dropout

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def _cfg(rank: int = 0, **kw) -> PolicyConfig:  # noqa: ANN003
    base = dict(preset="test", model="unused", engine="hf", lr=1e-2, kl_coef=0.0, micro_batch_size=2,
                lora=LoraConfig(rank=rank, alpha=8.0))
    base.update(kw)
    return PolicyConfig(**base)


def _ids(tok, text: str) -> list[int]:  # noqa: ANN001
    return tok(text, add_special_tokens=False)["input_ids"]


def _batch(tok) -> list[TrainSequence]:  # noqa: ANN001
    """Four sequences with their own generated words and lengths, advantages +1, -1, +1, -1."""
    prompt = _ids(tok, "what is the answer ?")
    gens = ["the answer is 4", "who was in Doc", "search ( information ) 5 6", "Title of 7 8 9 and"]
    return [TrainSequence(prompt + _ids(tok, g), [0] * len(prompt) + [1] * len(_ids(tok, g)), a)
            for g, a in zip(gens, [1.0, -1.0, 1.0, -1.0])]


def _logprobs(model, seqs: list[TrainSequence]) -> list[torch.Tensor]:  # noqa: ANN001
    with torch.no_grad():
        return [sequence_token_logprobs(model, torch.tensor([s.input_ids]), torch.ones(1, len(s.input_ids)))[0]
                for s in seqs]


def _masked_sums(model, seqs: list[TrainSequence]) -> list[float]:  # noqa: ANN001
    return [float((lp * torch.tensor(s.loss_mask[1:], dtype=torch.float32)).sum())
            for lp, s in zip(_logprobs(model, seqs), seqs)]


def _use_sgd(policy: Policy, lr: float) -> None:
    # SGD steps along -gradient: the change's sign and size follow the loss (Adam's first step is ~lr*sign(g)).
    policy.optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=lr)


# ---- gradient checkpointing ---------------------------------------------------------------------

@pytest.mark.parametrize("rank", [0, 4])
def test_checkpointed_step_equals_the_plain_step_and_recomputes(tiny, rank: int) -> None:
    model, tok = tiny
    results, layer_calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # peft draws lora_A at random: both policies start from the same adapter
        # shared_prompt off in both: a shared prompt adds a prefix forward per micro-batch to the counts below
        policy = Policy(_cfg(rank, gradient_checkpointing=checkpointing, kl_coef=0.1, shared_prompt=False),
                        copy.deepcopy(model), tok)
        _use_sgd(policy, lr=0.5)
        initial = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
        calls, layer = [], hf_model(policy.model).model.layers[0]
        forward = layer.forward  # counted by wrapping: torch runs no module hooks when it recomputes
        layer.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
        policy.update(_batch(tok))
        assert not policy.model.training  # back to eval after the backward passes
        results.append({k: v.detach().clone() for k, v in policy.model.state_dict().items()})
        layer_calls.append(len(calls))
    assert all(torch.allclose(results[0][k], results[1][k], atol=1e-6, rtol=0) for k in results[0])
    assert not all(torch.equal(results[0][k], initial[k]) for k in results[0])  # the step moved weights
    # 2 micro-batches, one trained forward each, and with LoRA one reference forward each (the base, adapter
    # off; without it the reference is a copy); checkpointing recomputes each trained forward once.
    assert layer_calls == ([4, 6] if rank else [2, 4])


def test_checkpointing_turns_dropout_off_so_train_mode_is_eval_mode(tiny_dir) -> None:
    from transformers import AutoModelForCausalLM

    _, tok = load_model_and_tokenizer(str(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, attention_dropout=0.5)
    seqs = _batch(tok)
    eval_lp = _logprobs(model.eval(), seqs)
    torch.manual_seed(0)
    dropped = _logprobs(model.train(), seqs)  # the test has teeth: this model's train mode does drop out
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(eval_lp, dropped))
    assert remaining_dropout(model)
    policy = Policy(_cfg(gradient_checkpointing=True), model.eval(), tok)
    assert remaining_dropout(policy.model) == [] and hf_model(policy.model).is_gradient_checkpointing
    train_lp = _logprobs(policy.model.train(), seqs)
    policy.model.eval()
    assert all(torch.allclose(a, b, atol=1e-6, rtol=0) for a, b in zip(eval_lp, train_lp))


# ---- LoRA ---------------------------------------------------------------------------------------

def test_lora_update_moves_only_the_adapter(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(rank=4, kl_coef=0.1), model, tok)
    assert policy.ref_model is None  # the reference is the base, adapter disabled
    named = dict(policy.model.named_parameters())
    trained = {id(p) for g in policy.optimizer.param_groups for p in g["params"]}
    assert trained and all(("lora_" in n) == (id(p) in trained) == p.requires_grad for n, p in named.items())
    assert all(p.dtype == torch.float32 for n, p in named.items() if "lora_" in n)
    before = {n: p.detach().clone() for n, p in named.items()}
    policy.update(_batch(tok))
    policy.update(_batch(tok))  # the second step moves lora_A too (B starts at 0, so A's first gradient is 0)
    for name, param in named.items():
        if "lora_" in name:
            assert not torch.equal(before[name], param), name
        else:
            assert torch.equal(before[name], param), name  # bit-identical base


def test_lora_reference_is_the_untrained_base_and_positive_advantage_rises(tiny) -> None:
    model, tok = tiny
    base = copy.deepcopy(model)
    batch = _batch(tok)
    policy = Policy(_cfg(rank=4, kl_coef=0.1, grad_clip=0.0), model, tok)
    _use_sgd(policy, lr=0.05)
    before = _masked_sums(hf_model(policy.model), batch)
    assert before == pytest.approx(_masked_sums(base, batch), abs=1e-6)  # a fresh adapter (B = 0) changes nothing
    policy.update(batch)
    after = _masked_sums(hf_model(policy.model), batch)
    for s, b, a in zip(batch, before, after):
        assert (a - b) * s.advantage > 0, (s.advantage, b, a)
    with policy.model.disable_adapter():
        reference = _logprobs(hf_model(policy.model), batch)
    assert all(torch.allclose(r, b, atol=1e-6, rtol=0) for r, b in zip(reference, _logprobs(base, batch)))
    assert policy.update(batch)["kl"] > 0  # the policy has moved away from that reference


def test_lora_save_load_round_trip_resume_and_eval_load(tiny, tiny_dir, tmp_path) -> None:
    model, tok = tiny
    cfg = _cfg(rank=4, model=str(tiny_dir), kl_coef=0.1)
    policy = Policy(cfg, model, tok, role="solver")
    policy.update(_batch(tok))
    policy.update(_batch(tok))
    ckpt = save_checkpoint(tmp_path / "run", 1, 0, lambda role, d: policy.save(d), ["solver"])
    target = ckpt / "solver"
    assert is_adapter_dir(target) and (target / "optimizer.pt").is_file()
    assert not list(target.glob("model*.safetensors"))  # the adapter only, not the base
    assert verify_checkpoint(ckpt) is None and resumable_checkpoint(tmp_path / "run")[0] == ckpt
    fresh = Policy.from_config(cfg, "solver")
    fresh.load(target)
    seqs = _batch(tok)
    expected = _logprobs(hf_model(policy.model), seqs)
    assert all(torch.equal(a, b) for a, b in zip(expected, _logprobs(hf_model(fresh.model), seqs)))
    state_a, state_b = policy.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys() and all(torch.equal(state_a[k]["exp_avg"], state_b[k]["exp_avg"])
                                                    for k in state_a)
    prompt = [_ids(tok, "who is")]
    assert policy.generate(prompt, GREEDY)[0][0].token_ids == fresh.generate(prompt, GREEDY)[0][0].token_ids
    # Evaluation (load_model_and_tokenizer with the checkpoint): a plain model, the adapter merged in.
    merged, _ = load_model_and_tokenizer(str(tiny_dir), checkpoint=str(target))
    assert not hasattr(merged, "peft_config")
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(expected, _logprobs(merged, seqs)))
    with pytest.raises(ValueError, match=r"holds a LoRA adapter but solver.lora.rank=0"):
        Policy.from_config(_cfg(model=str(tiny_dir)), "solver").load(target)


def test_full_checkpoint_does_not_load_into_a_lora_policy(tiny, tiny_dir, tmp_path) -> None:
    model, tok = tiny
    full = Policy(_cfg(model=str(tiny_dir)), copy.deepcopy(model), tok, role="solver")
    full.save(tmp_path / "full")
    with pytest.raises(ValueError, match=r"holds no LoRA adapter .* but solver.lora.rank > 0"):
        Policy(_cfg(rank=4), model, tok, role="solver").load(tmp_path / "full")


def test_missing_target_modules_name_the_key_and_real_modules(tiny) -> None:
    model, tok = tiny
    cfg = _cfg(rank=4, lora=LoraConfig(rank=4, target_modules=["q_proj", "c_attn"]))
    with pytest.raises(ValueError, match=r"config key ranker.lora.target_modules=\['q_proj', 'c_attn'\]: "
                                         r"\['c_attn'\] not in LlamaForCausalLM; .*'down_proj'.*'q_proj'"):
        Policy(cfg, model, tok, role="ranker")


def test_bf16_base_allowed_with_lora_full_fine_tuning_refused(tiny) -> None:
    model, tok = tiny
    half = copy.deepcopy(model).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"config key solver.dtype=bfloat16: a trainable solver keeps fp32 master"):
        Policy(_cfg(), copy.deepcopy(half), tok, role="solver")
    policy = Policy(_cfg(rank=4), half, tok, role="solver")
    dtypes = {("lora_" in n, p.dtype) for n, p in policy.model.named_parameters()}
    assert dtypes == {(False, torch.bfloat16), (True, torch.float32)}
    assert policy.update(_batch(tok))["grad_norm"] > 0
    # The config rule agrees: bf16 is allowed for a trainable role only over a LoRA adapter.
    with pytest.raises(ValueError, match=r"config key solver.dtype=bfloat16: .*solver.lora.rank > 0"):
        to_object(compose(["solver.dtype=bfloat16"]))
    assert to_object(compose(["solver.dtype=bfloat16", "solver.lora.rank=8"])).solver.dtype == "bfloat16"


def test_shared_backbone_with_lora_is_refused_naming_both_keys() -> None:
    for role in ("solver", "ranker"):
        with pytest.raises(ValueError, match=rf"config key {role}.lora.rank=8 with ranker.share_backbone=true"):
            to_object(compose(["ranker.share_backbone=true", f"{role}.lora.rank=8"]))
    assert to_object(compose(["ranker.share_backbone=false", "solver.lora.rank=8", "ranker.lora.rank=8"]))
    # No trained backbone is shared: no ranker model, or every role frozen (evaluation).
    assert to_object(compose(["ranker.share_backbone=true", "ranker.mode=none", "solver.lora.rank=8"]))
    assert to_object(compose(["ranker.share_backbone=true", "solver.lora.rank=8"], config_name="eval"),
                     EvalRootConfig)


def test_vllm_receives_merged_base_plus_delta_weights(tiny) -> None:
    model, tok = tiny
    plain_names = set(model.state_dict())
    base = {k: v.clone() for k, v in model.state_dict().items()}
    policy = Policy(_cfg(rank=4, lora=LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "down_proj"])),
                    model, tok)
    policy.update(_batch(tok))
    policy.update(_batch(tok))
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    merged = merged_state_dict(policy.model)
    assert set(merged) == plain_names
    layer = hf_model(policy.model).model.layers[1].mlp.down_proj
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * (8.0 / 4)
    assert delta.abs().max() > 0
    assert torch.allclose(merged["model.layers.1.mlp.down_proj.weight"],
                          base["model.layers.1.mlp.down_proj.weight"] + delta, atol=1e-7)
    assert torch.equal(merged["model.layers.0.self_attn.k_proj.weight"], base["model.layers.0.self_attn.k_proj.weight"])
    # A plain model holding the merged weights computes what the LoRA policy computes.
    plain = copy.deepcopy(base)
    plain.update(merged)
    reference = type(hf_model(policy.model))(hf_model(policy.model).config)
    reference.load_state_dict(plain)
    seqs = _batch(tok)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(_logprobs(hf_model(policy.model), seqs),
                                                                  _logprobs(reference, seqs)))
    tensors = _engine_tensors(policy.model)  # what VLLMEngine stages or sends
    assert set(tensors) == plain_names and torch.equal(tensors["model.layers.1.mlp.down_proj.weight"],
                                                       merged["model.layers.1.mlp.down_proj.weight"])
    # An in-process engine's planned weight bytes come from shapes alone, without this merge: the same count.
    counted = sum(t.numel() for t in tensors.values())
    assert engine_numel(policy.model) == counted and engine_numel(hf_model(policy.model)) == counted
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the training model is untouched


def _bf16_lora(tiny_dir, **kw) -> Policy:  # noqa: ANN001, ANN003
    model, tok = load_model_and_tokenizer(str(tiny_dir), "bfloat16")  # the checkpoint stores fp32
    torch.manual_seed(0)
    return Policy(_cfg(rank=4, lr=1e-6, **kw), model, tok)


def test_bf16_base_lora_step_at_paper_lr_changes_the_served_weights(tiny, tiny_dir) -> None:
    fp32_model, tok = tiny
    originals = fp32_model.state_dict()
    policy = _bf16_lora(tiny_dir)
    before = merged_state_dict(policy.model)
    assert all(torch.equal(before[k], originals[k].to(torch.bfloat16)) for k in before)  # B = 0: the base served
    policy.update(_batch(tok))
    after = merged_state_dict(policy.model)
    layers = [(n, m) for n, m in hf_model(policy.model).named_modules() if hasattr(m, BASE_FP32)]
    assert len(layers) == 2 * 7  # every wrapped projection has its fp32 original on the host, nothing else
    beyond_old_merge = 0
    for name, layer in layers:
        key, w = f"{name}.weight", layer.base_layer.weight
        original = getattr(layer, BASE_FP32)
        assert original.dtype == torch.float32 and original.device.type == "cpu" and torch.equal(original,
                                                                                                 originals[key])
        delta = layer.get_delta_weight("default").float()
        assert torch.equal(after[key], (original + delta).to(torch.bfloat16))  # summed in fp32, rounded once
        # A change under a quarter of a bf16 step of w: merged into the bf16 w it rounds back to w, every time.
        step = 2.0 ** (torch.floor(torch.log2(w.float().abs())) - 7)
        tiny_change = delta.abs() < step / 4
        assert torch.equal((w.float() + delta).to(torch.bfloat16)[tiny_change], w[tiny_change])
        beyond_old_merge += int((after[key] != before[key])[tiny_change].sum())
    assert beyond_old_merge > 0  # 210 of 20480 elements measured: served now, rounded away by a bf16 merge
    assert all(torch.equal(after[k], before[k]) for k in after if ".layers." not in k)  # unwrapped: the base


def test_bf16_lora_merge_without_wider_originals(tiny_dir, tmp_path, caplog) -> None:
    """A checkpoint that stores bf16: its weights are the originals (no copy, no warning). Weights that are not
    the checkpoint's (an adapter merged at load): a warning, no copies, the merge starts from them."""
    model, tok = load_model_and_tokenizer(str(tiny_dir), "bfloat16")
    model.save_pretrained(tmp_path / "bf16")
    tok.save_pretrained(tmp_path / "bf16")
    policy = _bf16_lora(tmp_path / "bf16")
    assert not [m for m in policy.model.modules() if hasattr(m, BASE_FP32)] and "served merge starts" not in caplog.text
    model, tok = load_model_and_tokenizer(str(tiny_dir), "bfloat16")
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[0, 0] += 1.0
    policy = Policy(_cfg(rank=4, lr=1e-6), model, tok, role="ranker")
    assert not [m for m in policy.model.modules() if hasattr(m, BASE_FP32)]
    assert "LoRA ranker: the served merge starts from the loaded bfloat16 weights, not fp32 originals " \
           "(model.layers.1.mlp.up_proj.weight in model.safetensors is not the loaded weight" in caplog.text
    merged = merged_state_dict(policy.model)
    assert torch.equal(merged["model.layers.1.mlp.up_proj.weight"], model.model.layers[1].mlp.up_proj.weight)
