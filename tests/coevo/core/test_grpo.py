"""GRPO math against hand-computed values (docs/method.md §5.1)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coevo.core.grpo import (
    clipped_surrogate_loss,
    group_advantages,
    k3_kl,
    masked_mean,
    sequence_token_logprobs,
    shared_prefix_len,
    token_logprobs,
)

# ---- advantages -------------------------------------------------------------------------------

def test_advantages_one_group_unbiased_std() -> None:
    # mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3)
    adv, n_zero = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), [0, 0, 0, 0])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(adv, torch.tensor([a, -a, -a, a]), atol=1e-6)
    assert n_zero == 0


def test_advantages_two_groups_and_zero_variance() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 0.3])
    groups = ["q1", "q1", "q1", "q1", "q2", "q2", "q3"]  # q2 all equal, q3 a singleton
    adv, n_zero = group_advantages(rewards, groups)
    # q1: mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0])
    expected[:4] /= 0.5 + 1e-6
    assert torch.allclose(adv, expected, atol=1e-6)
    assert n_zero == 2
    assert adv[4:].eq(0).all()


def test_advantages_without_std_scaling_and_tensor_ids() -> None:
    adv, n_zero = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0]),
                                   torch.tensor([7, 7, 7, 7, 8, 8]), scale_std=False)
    assert torch.allclose(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 1.0, -1.0]))
    assert n_zero == 0


def test_advantages_reject_bad_shapes() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0]), [0])


# ---- clipped surrogate --------------------------------------------------------------------------

def _toy(ratios: list[float], adv: float) -> tuple[torch.Tensor, dict, torch.Tensor]:
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    lp = (old + torch.log(torch.tensor([ratios]))).requires_grad_(True)
    loss, metrics = clipped_surrogate_loss(lp, old, torch.tensor([adv]), torch.ones(1, 2), clip_eps=0.2)
    loss.backward()
    return loss.detach(), metrics, lp.grad


def test_clipped_loss_positive_advantage() -> None:
    # token 1: ratio 1.1 inside the clip -> -1.1; token 2: ratio 1.5 clipped to 1.2 -> max(-1.5, -1.2) = -1.2
    loss, metrics, grad = _toy([1.1, 1.5], adv=1.0)
    assert loss.item() == pytest.approx(-1.15, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    # d/dlp of -A * ratio / 2 = -0.55 for the live token; the clipped token gets no gradient
    assert torch.allclose(grad, torch.tensor([[-0.55, 0.0]]), atol=1e-6)


def test_clipped_loss_negative_advantage() -> None:
    # A = -1: token 1 ratio 1.1 -> 1.1; token 2 ratio 1.5 -> max(1.5, 1.2) = 1.5 (pessimistic, unclipped)
    loss, metrics, _ = _toy([1.1, 1.5], adv=-1.0)
    assert loss.item() == pytest.approx(1.3, abs=1e-6)
    assert metrics["clip_frac"] == 0.0
    # ratio 0.5 below the clip: A = -1 -> max(0.5, 0.8) = 0.8 (clipped); A = +1 -> max(-0.5, -0.8) = -0.5
    loss, metrics, grad = _toy([0.5, 1.0], adv=-1.0)
    assert loss.item() == pytest.approx((0.8 + 1.0) / 2, abs=1e-6)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert grad[0, 0].item() == 0.0
    loss, metrics, _ = _toy([0.5, 1.0], adv=1.0)
    assert loss.item() == pytest.approx((-0.5 - 1.0) / 2, abs=1e-6)
    assert metrics["clip_frac"] == 0.0


def test_clipped_loss_is_token_level_mean_over_batch() -> None:
    # Two sequences with 1 and 3 masked tokens, ratio 1: loss = -(1*a1 + 3*a2) / 4, not a mean of means.
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, metrics = clipped_surrogate_loss(lp, lp, torch.tensor([2.0, -1.0]), mask)
    assert loss.item() == pytest.approx(-(2.0 - 3.0) / 4)
    assert metrics["n_tokens"] == 4
    half, _ = clipped_surrogate_loss(lp, lp, torch.tensor([2.0, -1.0]), mask, denom=8)
    assert half.item() == pytest.approx(loss.item() / 2)


# ---- KL and masked mean --------------------------------------------------------------------------

def test_k3_kl_hand_values() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.5, 0.4]]))
    kl = k3_kl(lp, ref)
    # r = ref/p: 0.5 -> 0.5 - ln 0.5 - 1; 1 -> 0; 2 -> 2 - ln 2 - 1
    expected = torch.tensor([[0.5 + math.log(2) - 1, 0.0, 1 - math.log(2)]])
    assert torch.allclose(kl, expected, atol=1e-6)
    masked = k3_kl(lp, ref, torch.tensor([[1, 0, 1]]))
    assert masked[0, 1] == 0 and torch.allclose(masked[0, [0, 2]], expected[0, [0, 2]], atol=1e-6)
    assert (k3_kl(torch.randn(3, 5), torch.randn(3, 5)) >= 0).all()


def test_masked_mean() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]])
    assert masked_mean(x, mask).item() == pytest.approx(10 / 3)
    assert masked_mean(x, mask, denom=5).item() == pytest.approx(2.0)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0


# ---- property: masked positions never reach the loss or its gradient -----------------------------

_any_float = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(0, 2**31 - 1), st.lists(_any_float, min_size=36, max_size=36))
def test_masked_positions_do_not_change_loss_or_grad(b: int, t: int, seed: int, junk: list[float]) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g) * 3
    old = lp + 0.3 * torch.randn(b, t, generator=g)
    ref = lp + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, generator=g)
    mask = (torch.rand(b, t, generator=g) < 0.6).float()
    noise = torch.tensor(junk[: b * t]).view(b, t)

    def run(lp0: torch.Tensor, old0: torch.Tensor, ref0: torch.Tensor) -> tuple[float, torch.Tensor]:
        x = lp0.clone().requires_grad_(True)
        pg, _ = clipped_surrogate_loss(x, old0, adv, mask, 0.2)
        loss = pg + 0.1 * masked_mean(k3_kl(x, ref0, mask), mask)
        loss.backward()
        return loss.item(), x.grad

    loss_a, grad_a = run(lp, old, ref)
    keep = mask.bool()
    loss_b, grad_b = run(torch.where(keep, lp, noise), torch.where(keep, old, noise), torch.where(keep, ref, noise))
    assert loss_a == pytest.approx(loss_b, abs=1e-6) and math.isfinite(loss_b)
    assert torch.equal(grad_a, grad_b)
    assert grad_b[~keep].eq(0).all()


# ---- chunked token log-probs -------------------------------------------------------------------

def test_token_logprobs_hand_values_and_gradient() -> None:
    # softmax([0, ln 2, ln 3]) = [1/6, 2/6, 3/6]; chunks of 2 columns split the vocabulary 2 + 1.
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])).requires_grad_(True)
    out = token_logprobs(logits, torch.tensor([2, 0]), chunk_size=2)
    assert torch.allclose(out, torch.tensor([math.log(1 / 2), math.log(1 / 6)]), atol=1e-6)
    out.sum().backward()
    # d log p_y / d logits = onehot(y) - softmax
    expected = torch.tensor([[-1 / 6, -2 / 6, 1 / 2], [5 / 6, -2 / 6, -3 / 6]])
    assert torch.allclose(logits.grad, expected, atol=1e-6)
    huge = torch.tensor([[1e4, 0.0, -1e4]])  # no overflow: the logsumexp is stable chunk by chunk
    assert torch.allclose(token_logprobs(huge, torch.tensor([1]), 1), torch.tensor([-1e4]))
    with pytest.raises(ValueError):
        token_logprobs(huge, torch.tensor([1]), 0)


@pytest.mark.parametrize("chunk", [1, 5, 16, 37, 100])  # 5 and 16 do not divide V = 37
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_logprobs_equal_log_softmax_gather(chunk: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(chunk)
    logits = (3 * torch.randn(3, 6, 37, generator=g)).to(dtype)
    targets = torch.randint(0, 37, (3, 6), generator=g)
    upstream = torch.randn(3, 6, generator=g)  # an arbitrary loss: gradients of every position differ

    def run(fn) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        x = logits.clone().requires_grad_(True)
        out = fn(x)
        (out * upstream).sum().backward()
        return out.detach(), x.grad

    plain, plain_grad = run(lambda x: torch.log_softmax(x.float(), -1).gather(-1, targets[..., None]).squeeze(-1))
    chunked, chunked_grad = run(lambda x: token_logprobs(x, targets, chunk))
    assert chunked.dtype == torch.float32 and chunked_grad.dtype == dtype
    assert torch.allclose(chunked, plain, atol=1e-5)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16: one rounding of the same fp32 value
    assert torch.allclose(chunked_grad.float(), plain_grad.float(), atol=tol)


# ---- log-probs under a model --------------------------------------------------------------------

def test_sequence_token_logprobs_matches_log_softmax_and_padding(tiny) -> None:
    model, _ = tiny
    ids = torch.tensor([[5, 9, 12, 7, 20]])
    with torch.no_grad():
        lp = sequence_token_logprobs(model, ids, torch.ones_like(ids))
        full = torch.log_softmax(model(ids).logits.float(), -1)
    expected = full[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
    assert lp.shape == (1, 4) and torch.allclose(lp[0], expected, atol=1e-5)
    # left and right padding give the same values on the real tokens
    left = torch.tensor([[0, 0, 5, 9, 12, 7, 20]])
    right = torch.tensor([[5, 9, 12, 7, 20, 0, 0]])
    m_left = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        lp_left = sequence_token_logprobs(model, left, m_left)[0, 2:]
        lp_right = sequence_token_logprobs(model, right, m_left.flip(-1))[0, :4]
    assert torch.allclose(lp_left, lp[0], atol=1e-5) and torch.allclose(lp_right, lp[0], atol=1e-5)


def _tiny_causal_lm(kind: str) -> torch.nn.Module:
    """A 2-layer random Llama / Qwen2 (no download): the architectures the head-on-positions path serves."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=False)).eval()
    return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True)).eval()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_logprobs_on_positions_equal_the_full_head_values_and_gradients(kind: str) -> None:
    model = _tiny_causal_lm(kind)
    ids = torch.tensor([[3, 7, 9, 11, 4, 0], [5, 8, 2, 6, 13, 21]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    positions = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 1, 1]])
    full = sequence_token_logprobs(model, ids, attn)
    (full * positions).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    part = sequence_token_logprobs(model, ids, attn, positions=positions)
    part.sum().backward()
    sel = positions.bool()
    assert part.shape == full.shape and torch.equal(part[~sel], torch.zeros(int((~sel).sum())))
    assert torch.allclose(part[sel], full[sel], atol=1e-5)
    for p, expected in zip(model.parameters(), full_grads):
        assert torch.allclose(p.grad, expected, atol=1e-5)


def test_logprobs_on_positions_zero_elsewhere_for_other_architectures() -> None:
    """An architecture outside HEAD_ON_POSITIONS_TYPES takes the full head; unwanted entries are still 0."""
    model = _tiny_causal_lm("llama")
    ids, attn = torch.tensor([[3, 7, 9, 11]]), torch.ones(1, 4, dtype=torch.long)
    positions = torch.tensor([[0, 1, 1]])
    with torch.no_grad():
        expected = sequence_token_logprobs(model, ids, attn)
        model.config.model_type = "gemma2"  # soft-capped logits: the head must see every position
        got = sequence_token_logprobs(model, ids, attn, positions=positions)
    assert got[0, 0] == 0 and torch.allclose(got[0, 1:], expected[0, 1:], atol=1e-6)


def test_shared_prefix_len_hand_values() -> None:
    ids = torch.tensor([[4, 5, 6, 7, 8], [4, 5, 6, 9, 0], [4, 5, 6, 7, 1]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    late = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0], [0, 0, 0, 1]])
    assert shared_prefix_len(ids, attn, late) == 3  # tokens 4 5 6 are common; row 1 differs at position 3
    early = torch.tensor([[0, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert shared_prefix_len(ids, attn, early) == 1  # log-prob at position 1 needs row 0's own hidden state there
    assert shared_prefix_len(ids[:1], attn[:1], late[:1]) == 0  # one row shares with nobody
    padded = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0], [0, 1, 1, 1, 1]])  # left padding: nothing shared
    assert shared_prefix_len(ids, padded, late) == 0


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_shared_prefix_equals_the_unshared_values_and_gradients(kind: str) -> None:
    """The prompt run once with its keys/values repeated gives every row's values and the weights' gradients."""
    model = _tiny_causal_lm(kind)
    ids = torch.tensor([[3, 7, 9, 11, 4, 8, 0, 0], [3, 7, 9, 11, 5, 2, 6, 13], [3, 7, 9, 11, 5, 1, 0, 0]])
    attn = (torch.arange(8) < torch.tensor([[6], [8], [6]])).long()
    positions = torch.tensor([[0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 0, 1, 0]])
    weights = torch.randn(3, 7)
    full = sequence_token_logprobs(model, ids, attn, positions=positions)
    (full * weights).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    prefix = shared_prefix_len(ids, attn, positions)
    assert prefix == 3
    shared = sequence_token_logprobs(model, ids, attn, positions=positions, prefix_len=prefix)
    (shared * weights).sum().backward()
    assert torch.allclose(shared, full, atol=1e-5) and not shared[~positions.bool()].any()
    for p, expected in zip(model.parameters(), full_grads):
        assert torch.allclose(p.grad, expected, atol=1e-5)


def test_shared_prefix_refuses_rows_that_differ_in_it() -> None:
    model = _tiny_causal_lm("llama")
    ids, attn = torch.tensor([[3, 7, 9, 1], [3, 8, 9, 2]]), torch.ones(2, 4, dtype=torch.long)
    positions = torch.tensor([[0, 0, 1], [0, 0, 1]])
    with pytest.raises(ValueError, match="prefix_len=2"):
        sequence_token_logprobs(model, ids, attn, positions=positions, prefix_len=2)
