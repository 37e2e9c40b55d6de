"""GRPO building blocks (docs/method.md §5.1): stateless tensor functions, in the style of verl's core_algos.

Conventions used by every function here:
- `B` sequences, `T` positions; per-token tensors that come from `sequence_token_logprobs`
  have length `T-1` because position `t` holds the log-prob of token `t+1` (the first token
  has no prefix to be predicted from).
- masks are 0/1 (bool, int or float); masked-out positions never reach the result, not even
  as NaN/inf, because they are selected away with `torch.where` rather than multiplied by 0.
- "token-level mean" means: sum over every masked-in token of the whole batch divided by
  the number of such tokens (not a mean of per-sequence means).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch
from torch import Tensor

# exp() of a log-ratio beyond this overflows fp32 long before it means anything (verl clamps too).
_LOG_RATIO_CLAMP = 20.0
_K3_MAX = 10.0


def group_advantages(rewards: Tensor, group_ids: Union[Tensor, Sequence], scale_std: bool = True,
                     eps: float = 1e-6) -> tuple[Tensor, int]:
    """Group-relative advantages `A_i = (r_i - mean_g) / (std_g + eps)`.

    rewards: [B] float; group_ids: [B] (tensor or list of hashables: ints, strings, tuples).
    Returns (advantages [B] float32, number of zero-variance groups).

    `std_g` is the unbiased (Bessel-corrected, `torch.std` default) std, as in the GRPO
    papers and verl. A group whose rewards are all equal (including any group of size 1)
    carries no learning signal: its advantages are exactly 0 and it is counted, so the
    zero-variance share can be reported (docs/method.md §5.1). `scale_std=False` gives `r_i - mean_g`.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != rewards.shape[0]:
        raise ValueError(f"group_ids has {len(ids)} entries for {rewards.shape[0]} rewards")
    members: dict = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    adv = torch.zeros_like(rewards)
    n_zero_var = 0
    for idx in members.values():
        r = rewards[idx]
        # Exact equality, not a tolerance: a group is only "zero variance" if nothing differs.
        if len(idx) < 2 or bool((r == r[0]).all()):
            n_zero_var += 1
            continue
        centered = r - r.mean()
        adv[idx] = centered / (r.std() + eps) if scale_std else centered
    return adv, n_zero_var


@dataclass(frozen=True)
class GroupStats:
    """What a GRPO batch builder reports of its groups (the proposer's, the solver's and the ranker's alike).

    `groups`: groups formed; `zero_var_groups`: those without reward variance (advantage 0, no
    gradient; `group_advantages`' count); `members`: candidates, rollouts or calls in all groups.
    """

    groups: int
    zero_var_groups: int
    members: int

    def to_metrics(self) -> dict[str, Any]:
        """Its `update/<role>/...` keys: `groups`, `zero_var_groups`, `zero_var_share` (of the groups) and
        `mean_group_size` (members per group); a share or mean of no groups is None (absent, not 0)."""
        return {"groups": self.groups, "zero_var_groups": self.zero_var_groups,
                "zero_var_share": self.zero_var_groups / self.groups if self.groups else None,
                "mean_group_size": self.members / self.groups if self.groups else None}


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum of `x` [..] over positions where `mask` [..] is nonzero; NaN/inf elsewhere are ignored."""
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum()


def masked_mean(x: Tensor, mask: Tensor, denom: Optional[float] = None) -> Tensor:
    """Token-level mean of `x` [B,T] over `mask` [B,T] (scalar).

    `denom` replaces the local token count: gradient accumulation passes the token count of
    the whole batch so that micro-batch losses add up to the exact batch mean. An empty mask
    gives 0 (no tokens, no signal) instead of NaN.
    """
    count = float(mask.bool().sum()) if denom is None else float(denom)
    return masked_sum(x, mask) / max(count, 1.0)


# Vocabulary columns per chunk in `token_logprobs`: the fp32 temporaries are [B, T, chunk], so
# a 152k vocabulary never has a full fp32 [B, T, V] copy (4 x 4096 x 152k fp32 is 10 GB).
LOGPROB_CHUNK = 8192


class _TokenLogprobs(torch.autograd.Function):
    """log_softmax(logits)[..., target] in fp32, computed and differentiated in vocabulary chunks.

    Only `logits` (the model's own output, alive anyway) and the [...] logsumexp are saved;
    the backward recomputes softmax chunk by chunk into one gradient of `logits`' dtype.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, chunk: int) -> Tensor:  # noqa: ANN001
        lse = torch.full(logits.shape[:-1], float("-inf"), dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[-1], chunk):
            lse = torch.logaddexp(lse, torch.logsumexp(logits[..., start:start + chunk].float(), dim=-1))
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk = chunk
        return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float() - lse

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None]:  # noqa: ANN001
        logits, targets, lse = ctx.saved_tensors
        g = grad_out.float().unsqueeze(-1)
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[-1], ctx.chunk):
            part = torch.exp(logits[..., start:start + ctx.chunk].float() - lse.unsqueeze(-1)).mul_(-g)
            # d/dlogit = g * (onehot - softmax); the onehot term is added in fp32 before the cast.
            local = (targets - start).unsqueeze(-1)
            inside = (local >= 0) & (local < part.shape[-1])
            part.scatter_add_(-1, local.clamp(0, part.shape[-1] - 1), torch.where(inside, g, torch.zeros_like(g)))
            grad[..., start:start + ctx.chunk] = part
        return grad, None, None


def token_logprobs(logits: Tensor, targets: Tensor, chunk_size: int = LOGPROB_CHUNK) -> Tensor:
    """out[...] = log_softmax(logits.float(), -1)[..., targets[...]], without a full fp32 copy.

    logits: [..., V] any float dtype (e.g. [B, T, V] bf16); targets: [...] long in [0, V).
    Returns [...] float32, differentiable w.r.t. `logits`. The logsumexp is accumulated over
    vocabulary chunks of `chunk_size` columns (the last one may be shorter), so besides
    `logits` and its gradient only [..., chunk_size] fp32 temporaries exist, in the forward
    and in the backward alike; equal to the plain log_softmax + gather within float tolerance.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return _TokenLogprobs.apply(logits, targets, int(chunk_size))


# Architectures whose logits are exactly `lm_head(base_model(x).last_hidden_state)` (no logit
# scaling or soft-capping), so the head may run on a subset of positions.
HEAD_ON_POSITIONS_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def sequence_token_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                            chunk_size: int = LOGPROB_CHUNK, positions: Optional[Tensor] = None,
                            prefix_len: int = 0) -> Tensor:
    """Log-probs of each next token under `model`: out[b, t] = log p(input_ids[b, t+1] | input_ids[b, :t+1]).

    input_ids, attention_mask: [B, T] (left or right padding; positions are derived from the
    mask so both give the same values as an unpadded forward). Returns [B, T-1] float32 with
    gradients if enabled; the [B, T, V] logits live only inside this call (and, with
    gradients, in the graph until backward). Log-probs come from `token_logprobs`.

    positions: optional [B, T-1] 0/1 mask (a loss mask): only these entries are wanted and the
    rest of `out` is 0. For `HEAD_ON_POSITIONS_TYPES` the LM head then runs on those positions
    alone -- with prompts most of a sequence, that skips most of the head's [T, V] matmul and
    log-softmax in the forward and the backward; the wanted values are the same.

    prefix_len: P > 0 when every row starts with the same P real tokens (right padding) and no
    wanted position lies before P (`shared_prefix_len` gives the largest such P). With
    `positions` on a `HEAD_ON_POSITIONS_TYPES` model, the prefix then runs once as a batch of
    one and its keys/values are repeated for the rows: G rollouts of one prompt cost one prompt
    forward (and backward: gradients reach the weights through the shared keys/values), not G.
    Values and gradients equal the unshared forward's within float tolerance. Ignored otherwise.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if positions is not None and model_type in HEAD_ON_POSITIONS_TYPES:
        if prefix_len > 0 and input_ids.shape[0] > 1:
            return _logprobs_shared_prefix(model, input_ids, attention_mask, position_ids, positions.bool(),
                                           int(prefix_len), chunk_size)
        return _logprobs_on_positions(model, input_ids, attention_mask, position_ids, positions.bool(), chunk_size)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits
    # The last position predicts nothing; a dummy target there keeps `logits` whole: slicing
    # it to [B, T-1, V] would make the backward allocate another full-size zero gradient.
    targets = torch.cat([input_ids[:, 1:], torch.zeros_like(input_ids[:, :1])], dim=1)
    out = token_logprobs(logits, targets, chunk_size)[:, :-1]
    return out if positions is None else torch.where(positions.bool(), out, torch.zeros_like(out))


def _logprobs_on_positions(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                           position_ids: Tensor, selected: Tensor, chunk_size: int) -> Tensor:
    """`sequence_token_logprobs` with the LM head applied at the `selected` [B, T-1] positions only."""
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, :-1][selected])  # [N, V], N = selected positions
    values = token_logprobs(logits, input_ids[:, 1:][selected], chunk_size)
    out = torch.zeros(selected.shape, dtype=values.dtype, device=values.device)
    out[selected] = values
    return out


def shared_prefix_len(input_ids: Tensor, attention_mask: Tensor, positions: Tensor) -> int:
    """Largest P for `sequence_token_logprobs(prefix_len=P)`: 0 when the rows share nothing usable.

    input_ids, attention_mask: [B, T]; positions: [B, T-1] wanted log-prob positions. P is the
    rows' common run of identical real tokens, ended before the first wanted position: the
    hidden state at a wanted position t (which predicts token t+1) must come from the rows' own
    forward, so P <= t for every wanted t.
    """
    if input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)  # [T]
    common = int(same.long().cumprod(0).sum())
    wanted = positions.bool().any(0).nonzero()
    first_wanted = int(wanted[0]) if len(wanted) else positions.shape[1]
    return min(common, first_wanted)


def _logprobs_shared_prefix(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                            position_ids: Tensor, selected: Tensor, prefix_len: int, chunk_size: int) -> Tensor:
    """`_logprobs_on_positions` with the rows' common first `prefix_len` tokens run once and their KV shared."""
    p = prefix_len
    if bool(selected[:, :p].any()) or not bool((input_ids[:, :p] == input_ids[:1, :p]).all()):
        raise ValueError(f"prefix_len={p}: the rows differ in their first {p} tokens or want a log-prob there")
    base = model.base_model
    cache = base(input_ids=input_ids[:1, :p], attention_mask=attention_mask[:1, :p], position_ids=position_ids[:1, :p],
                 use_cache=True).past_key_values
    cache.batch_repeat_interleave(input_ids.shape[0])  # [1, ...] -> [B, ...] keys/values, still in the graph
    hidden = base(input_ids=input_ids[:, p:], attention_mask=attention_mask, position_ids=position_ids[:, p:],
                  past_key_values=cache, use_cache=True).last_hidden_state  # [B, T-p, H]: positions p..T-1
    sel = selected[:, p:]  # [B, T-1-p]: hidden[:, s] predicts token p+s+1
    logits = model.get_output_embeddings()(hidden[:, :-1][sel])
    values = token_logprobs(logits, input_ids[:, p + 1:][sel], chunk_size)
    out = torch.zeros(selected.shape, dtype=values.dtype, device=values.device)
    out[:, p:][sel] = values
    return out


def clipped_surrogate_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor,
                           clip_eps: float = 0.2, denom: Optional[float] = None) -> tuple[Tensor, dict]:
    """PPO clipped policy-gradient loss, token-level mean over masked tokens.

    logprobs, old_logprobs, loss_mask: [B, T]; advantages: [B] (one per sequence, broadcast
    over its tokens). Per token, with ratio rho = exp(logprobs - old_logprobs):
        loss_t = max(-A * rho, -A * clip(rho, 1 - eps, 1 + eps))
    Returns (scalar loss, {"clip_frac": share of masked tokens where the clipped branch was
    taken, "ratio_mean", "n_tokens"}). `denom` as in `masked_mean`.
    """
    mask = loss_mask.bool()
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    adv = advantages.to(ratio.dtype).unsqueeze(-1)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    per_token = torch.maximum(unclipped, clipped)
    loss = masked_mean(per_token, mask, denom)
    with torch.no_grad():
        metrics = {
            "clip_frac": float(masked_mean((clipped > unclipped).float(), mask)),
            "ratio_mean": float(masked_mean(ratio, mask)),
            "n_tokens": int(mask.sum()),
        }
    return loss, metrics


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor, loss_mask: Optional[Tensor] = None) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref): exp(ref - lp) - (ref - lp) - 1, shape [B, T].

    Non-negative and unbiased for samples drawn from pi (Schulman's "k3"). The log-ratio is
    clamped to +-20 and the result to <= 10, as verl does, so one wild token cannot blow up
    the loss. Positions where `loss_mask` [B, T] is 0 are set to 0; average the result with
    `masked_mean` for the token-level mean.
    """
    delta = ref_logprobs - logprobs
    if loss_mask is not None:
        # Select before exp(): a NaN at a masked position would otherwise leak into the gradient.
        delta = torch.where(loss_mask.bool(), delta, torch.zeros_like(delta))
    delta = delta.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (torch.exp(delta) - delta - 1.0).clamp(max=_K3_MAX)
