"""coevo/train/precision.py: optimizer state allocated at build is the state a first step would create; whose
log-probs are π_old (`<role>.old_logprobs`) and the engine-vs-trainer mismatch figure every update logs."""
from __future__ import annotations

import copy

import pytest
import torch

from coevo.core.config import PolicyConfig
from coevo.core.types import TrainSequence
from coevo.train import precision
from coevo.train.batching import mismatch_metrics
from coevo.train.policy import Policy
from coevo.train.precision import allocate_optimizer_state


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    torch.manual_seed(seed)
    loss = model(torch.randn(7, 5)).pow(2).sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def test_allocation_changes_no_weight_and_leaves_zero_moments_at_step_zero() -> None:
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=0.5, weight_decay=0.3)
    allocate_optimizer_state(opt)
    for p, old in zip(model.parameters(), before):
        assert torch.equal(p, old)  # bitwise: lr 0 makes decay and update exactly zero
        assert p.grad is None
        state = opt.state[p]
        assert float(state["step"]) == 0.0
        assert torch.count_nonzero(state["exp_avg"]) == 0 and torch.count_nonzero(state["exp_avg_sq"]) == 0
        assert state["exp_avg"].dtype == torch.float32 and state["exp_avg"].shape == p.shape
    assert [g["lr"] for g in opt.param_groups] == [0.5]


def test_steps_after_allocation_equal_torchs_lazy_ones_bitwise() -> None:
    eager, lazy = _model(), _model()
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=1e-2, weight_decay=0.1)
    opt_lazy = torch.optim.AdamW(lazy.parameters(), lr=1e-2, weight_decay=0.1)
    allocate_optimizer_state(opt_eager)
    for seed in (1, 2, 3):  # bias correction uses the step count: three steps check it was reset
        _step(eager, opt_eager, seed)
        _step(lazy, opt_lazy, seed)
    for a, b in zip(eager.parameters(), lazy.parameters()):
        assert torch.equal(a, b)
    assert float(opt_eager.state[next(eager.parameters())]["step"]) == 3.0


def test_allocation_is_skipped_when_state_exists() -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, opt, 1)
    state = copy.deepcopy(opt.state_dict())
    allocate_optimizer_state(opt)  # e.g. after a checkpoint's state was loaded: nothing to do
    after = opt.state_dict()
    assert after["state"].keys() == state["state"].keys()
    for key, value in state["state"].items():
        assert float(after["state"][key]["step"]) == float(value["step"]) == 1.0
        assert torch.equal(after["state"][key]["exp_avg"], value["exp_avg"])


# ---- pi_old and the engine-vs-trainer mismatch ------------------------------------------------------------------

def _cfg(**kw) -> PolicyConfig:  # noqa: ANN003
    base = dict(preset="test", model="unused", engine="vllm", lr=1e-2, kl_coef=0.0, micro_batch_size=2)
    base.update(kw)
    return PolicyConfig(**base)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """precision.py's decisions see a CUDA device with bf16; tensors and compute stay on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(precision, "on_cuda", lambda device: True)


@pytest.mark.parametrize("choice, engine, cuda, cpu_bf16, usable", [
    ("auto", "hf", True, False, True),  # the HF engine generates with the trained model
    ("auto", "vllm", True, False, False),  # vLLM's CUDA kernels, although it serves bf16 as the update computes
    ("auto", "vllm", False, False, True),  # the CPU engine serves fp32 as the update computes
    ("auto", "vllm", False, True, False),  # fp32 engine, bf16 update
    ("engine", "vllm", True, False, True),
    ("trainer", "hf", False, False, False),
])
def test_whose_logprobs_are_pi_old(choice, engine, cuda, cpu_bf16, usable, monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: True)
    if cuda:
        _fake_cuda(monkeypatch)
    cfg = _cfg(old_logprobs=choice, engine=engine, cpu_bf16_autocast=cpu_bf16)
    assert precision.bf16_compute(cfg, torch.device("cpu")) == (cuda or cpu_bf16)
    assert precision.engine_logprobs_usable(cfg, torch.device("cpu")) == usable


class _NoEngine:
    """A vLLM stand-in for updates: nothing to generate, weight syncs ignored."""

    def generate(self, prompts, sampling):  # noqa: ANN001, ANN201
        raise AssertionError("no generation in these tests")

    def sync_weights(self, model) -> None:  # noqa: ANN001
        pass


def _ids(tok, text: str) -> list[int]:  # noqa: ANN001
    return tok(text, add_special_tokens=False)["input_ids"]


def _engine_batch(policy: Policy, tok) -> tuple[list[TrainSequence], list[float]]:  # noqa: ANN001
    """Four sequences, advantages +1, -1, +1, -1; the first three with engine log-probs = the update's own
    (its forward on the same micro-batches) + offsets: +-0.5 alternating, 3.0 on one token. The offsets, in order."""
    prompt = _ids(tok, "what is the answer ?")
    gens = ["the answer is 4", "who was in Doc", "search ( information ) 5 6", "Title of 7 8 9 and"]
    plain = [TrainSequence(prompt + _ids(tok, g), [0] * len(prompt) + [1] * len(_ids(tok, g)), a)
             for g, a in zip(gens, [1.0, -1.0, 1.0, -1.0])]
    own = {}
    with torch.no_grad(), policy.compute():
        for chunk in policy.micro_batches(plain):
            mb = policy.micro_batch_tensors(chunk)
            for s, row in zip(chunk, policy.scorer(mb.ids, mb.attn, mb.mask, mb.prefix).float()):
                own[id(s)] = row
    batch, offsets = [], []
    for i, s in enumerate(plain):
        if i == 3:  # no engine log-probs: none of its tokens count
            batch.append(s)
            continue
        old = [0.0] * len(s.input_ids)
        for t in range(1, len(s.input_ids)):
            if s.loss_mask[t]:
                offsets.append(3.0 if (i, t) == (1, len(s.input_ids) - 1) else 0.5 * (-1) ** len(offsets))
                old[t] = float(own[id(s)][t - 1]) + offsets[-1]
        batch.append(TrainSequence(s.input_ids, s.loss_mask, s.advantage, old))
    return batch, offsets


@pytest.mark.parametrize("choice, used", [("auto", False), ("trainer", False), ("engine", True)])
def test_on_cuda_vllm_logprobs_are_not_pi_old_and_their_mismatch_is_logged(tiny, choice, used, monkeypatch) -> None:
    model, tok = tiny
    _fake_cuda(monkeypatch)
    policy = Policy(_cfg(old_logprobs=choice), model, tok, engine=_NoEngine())
    assert precision.bf16_compute(policy.cfg, policy.device)  # the update computes in bf16, as vLLM serves
    batch, offsets = _engine_batch(policy, tok)
    assert len(offsets) == 14 and sorted(abs(o) for o in offsets)[-2:] == [0.5, 3.0]  # of 20 loss tokens
    metrics = policy.update(batch)
    # Engine log-probs as pi_old: the ratio exp(-offset) is 1.65 or 0.61, clipped on about half the tokens.
    # The trainer's own: ratio 1 at the only epoch, nothing clipped.
    assert (metrics["clip_frac"] > 0.2) if used else metrics["clip_frac"] == 0.0
    # |engine - trainer| is |offset|: 0.5 on 13 tokens, 3.0 on one, so the mean is (13 x 0.5 + 3) / 14; the p99
    # sits at 0.99 x 13 = 12.87 in the sorted values: 0.87 of the way from 0.5 (the 13th) to 3.0 (the 14th).
    assert metrics["logprob_mismatch_mean"] == pytest.approx(9.5 / 14, abs=1e-5)
    assert metrics["logprob_mismatch_p99"] == pytest.approx(0.5 + 0.87 * 2.5, abs=1e-5)


def test_trainer_pi_old_at_two_epochs_is_the_forward_before_the_step(tiny, monkeypatch) -> None:
    model, tok = tiny
    _fake_cuda(monkeypatch)
    policy = Policy(_cfg(ppo_epochs=2), model, tok, engine=_NoEngine())
    batch, offsets = _engine_batch(policy, tok)
    chunks = policy.micro_batches(batch)
    assert all(s.old_logprobs is None for c in chunks for s in c)  # the engine's set aside, kept for the figure
    prepared = policy.prepare(chunks, sum(sum(s.loss_mask[1:]) for s in batch))
    gaps = []
    for chunk, fixed in zip(chunks, prepared.fixed):
        mb = policy.micro_batch_tensors(chunk)
        assert fixed.old_filled  # two epochs: the forward ran here, before any step
        gaps.append((mb.engine - fixed.old)[(mb.mask > 0) & mb.has_engine.unsqueeze(-1)].abs())
    # pi_old is the trainer's forward: the engine's values are it plus the offsets, token for token
    assert torch.allclose(torch.cat(gaps).sort().values, torch.tensor(sorted(abs(o) for o in offsets)), atol=1e-5)
    metrics = policy.update(batch)
    assert {"logprob_mismatch_mean", "logprob_mismatch_p99"} <= metrics.keys()


def test_mismatch_keys_are_absent_without_engine_logprobs(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(engine="hf"), model, tok, engine=_NoEngine())
    prompt = _ids(tok, "what is the answer ?")
    batch = [TrainSequence(prompt + _ids(tok, "the answer"), [0] * len(prompt) + [1, 1], 1.0)]
    assert not [k for k in policy.update(batch) if k.startswith("logprob_mismatch")]


def test_mismatch_p99_is_over_every_token_not_per_micro_batch() -> None:
    gaps = [torch.full((50,), 0.1), torch.full((50,), 0.2), torch.tensor([5.0, 7.0])]
    values = torch.cat(gaps).double()
    got = mismatch_metrics(gaps, across_ranks=False)
    assert got["logprob_mismatch_mean"] == pytest.approx(float(values.mean()))
    assert got["logprob_mismatch_p99"] == pytest.approx(float(torch.quantile(values, 0.99)))
    assert got["logprob_mismatch_p99"] == pytest.approx(0.2 + 4.8 * 0.99)  # 0.99 * 101 = 99.99: 0.99 of the way
    assert mismatch_metrics([], across_ranks=False) == {} == mismatch_metrics([torch.zeros(0)], across_ranks=False)
