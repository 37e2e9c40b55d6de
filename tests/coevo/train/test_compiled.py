"""Compiled decoder layers in the CPU update (`<role>.cpu_compile`, coevo/train/compiled.py) on tiny models."""
from __future__ import annotations

import copy

import pytest
import torch

from coevo.core.config import LoraConfig, PolicyConfig
from coevo.core.types import TrainSequence
from coevo.train import compiled
from coevo.train.policy import Policy


def _cfg(**kw) -> PolicyConfig:  # noqa: ANN003
    base = dict(preset="test", model="unused", engine="hf", lr=1e-2, kl_coef=0.0, micro_batch_size=2,
                grad_clip=0.0, gradient_checkpointing=True)
    base.update(kw)
    return PolicyConfig(**base)


def _batch(tok) -> list[TrainSequence]:  # noqa: ANN001
    """Four sequences of different lengths (two micro-batches of two), advantages +1, -1, +1, -1."""
    prompt = tok("what is the answer ?", add_special_tokens=False)["input_ids"]
    gens = ["the answer is 4", "who was in Doc", "search ( information ) 5 6", "Title of 7 8 9 and"]
    out = []
    for text, adv in zip(gens, [1.0, -1.0, 1.0, -1.0]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        out.append(TrainSequence(prompt + ids, [0] * len(prompt) + [1] * len(ids), adv))
    return out


def _count_compiled_calls(policy: Policy) -> list[int]:
    """A list that grows by one at each call through the policy's compiled layer callables."""
    calls: list[int] = []
    for i, fn in enumerate(policy.update_layers.compiled):
        policy.update_layers.compiled[i] = lambda *a, _fn=fn, **k: calls.append(1) or _fn(*a, **k)
    return calls


def test_a_compiled_update_steps_as_the_eager_one_and_leaves_the_layers_eager(tiny) -> None:
    model, tok = tiny
    before = copy.deepcopy(model)
    eager = Policy(_cfg(), copy.deepcopy(model), tok)
    policy = Policy(_cfg(cpu_compile=True), model, tok)
    names = list(policy.model.state_dict())
    calls = _count_compiled_calls(policy)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    batch = _batch(tok)
    for p in (eager, policy):
        p.optimizer = torch.optim.SGD(p.model.parameters(), lr=0.05)
        p.update(batch)
    # forward and recomputed forward, per layer and micro-batch, through graphs dynamo built
    assert len(calls) == 2 * 2 * len(compiled.decoder_layers(model))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
    assert all(layer._compiled_call_impl is None for layer in compiled.decoder_layers(model))
    assert list(policy.model.state_dict()) == names  # no `_orig_mod.`: checkpoints and weight sync unchanged
    with torch.no_grad():
        step = max(float((a - b).abs().max()) for a, b in zip(eager.model.parameters(), before.parameters()))
        gap = max(float((a - b).abs().max()) for a, b in zip(policy.model.parameters(), eager.model.parameters()))
    assert step > 1e-3 and gap < 1e-3 * step  # the same step as eager, to float noise


def test_a_compiled_lora_update_steps_as_the_eager_one_and_moves_only_the_adapter(tiny) -> None:
    model, tok = tiny
    lora = LoraConfig(rank=4, alpha=8.0)
    policies = []
    for compile_layers in (False, True):
        torch.manual_seed(0)  # the same adapter initialisation in both
        policies.append(Policy(_cfg(cpu_compile=compile_layers, lora=lora), copy.deepcopy(model), tok))
    eager, policy = policies
    assert len(policy.update_layers.layers) == len(compiled.decoder_layers(model))  # found inside peft's wrapper
    calls = _count_compiled_calls(policy)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    for p in (eager, policy):
        p.optimizer = torch.optim.SGD([q for q in p.model.parameters() if q.requires_grad], lr=0.05)
        p.update(_batch(tok))
    assert len(calls) == 2 * 2 * len(compiled.decoder_layers(model))  # forward + recompute, two micro-batches
    after = dict(policy.model.named_parameters())
    moved = {n for n, p in after.items() if float((p.detach() - before[n]).abs().max()) > 0}
    assert moved and all("lora_" in n for n in moved)  # the base stays frozen under compilation too
    with torch.no_grad():
        gap = max(float((a - b).abs().max()) for a, b in zip(after.values(), eager.model.parameters()))
        step = max(float((after[n] - before[n]).abs().max()) for n in moved)
    assert gap < 1e-3 * step  # the same adapter step as eager, to float noise


def test_compiled_layers_are_refused_for_an_update_through_a_kv_cache(tiny) -> None:
    model, tok = tiny
    with pytest.raises(ValueError, match=r"solver\.cpu_compile=true.*solver\.gradient_checkpointing=true"):
        Policy(_cfg(cpu_compile=True, gradient_checkpointing=False, micro_batch_size=4), model, tok, role="solver")
    policy = Policy(_cfg(cpu_compile=True, gradient_checkpointing=False, shared_prompt=False), model, tok)
    assert len(policy.update_layers.layers) == len(compiled.decoder_layers(model))


def test_compiled_layers_need_a_cpp_compiler_and_a_trainable_cpu_policy(tiny, monkeypatch) -> None:
    model, tok = tiny

    def no_compiler() -> str:
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(compiled, "get_cpp_compiler", no_compiler)
    with pytest.raises(ValueError, match=r"ranker\.cpu_compile=true.*no C\+\+ compiler found"):
        Policy(_cfg(cpu_compile=True), model, tok, role="ranker")
    assert Policy(_cfg(cpu_compile=True, frozen=True), model, tok).update_layers.layers == []
