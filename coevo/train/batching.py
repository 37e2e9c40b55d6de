"""How an update's sequences become micro-batches and padded tensors (coevo/train/policy.py, sharded.py).

Stateless: the policy passes its `micro_batch_size`, `shared_prompt`, pad id and device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from coevo.core.grpo import shared_prefix_len
from coevo.core.types import TrainSequence


def check_sequence(s: TrainSequence) -> None:
    """A ValueError when `s`'s per-token lists do not match its `input_ids` in length."""
    n = len(s.input_ids)
    if len(s.loss_mask) != n:
        raise ValueError(f"TrainSequence loss_mask has {len(s.loss_mask)} entries for {n} input_ids")
    if s.old_logprobs is not None and len(s.old_logprobs) != n:
        raise ValueError(f"TrainSequence old_logprobs has {len(s.old_logprobs)} entries for {n} input_ids")


def loss_token_counts(batch: list[TrainSequence]) -> list[int]:
    """Per sequence of `batch` (each checked by `check_sequence`), its loss-masked tokens that train.

    Position 0 never trains (no token predicts it). The sum is the update's `n_tokens`: the
    denominator of every micro-batch loss (SPEC §5.1's token-level mean over the whole batch).
    """
    for s in batch:
        check_sequence(s)
    return [sum(1 for m in s.loss_mask[1:] if m) for s in batch]


def micro_batches(batch: list[TrainSequence], micro_batch_size: int,
                  shared_prompt: bool) -> list[list[TrainSequence]]:
    """`batch` split into micro-batches of `micro_batch_size`; similar lengths share one to waste little padding.

    With `shared_prompt`, sequences with the same prompt (tokens before the first loss-masked
    one) are chunked together first, so those micro-batches can run their prompt once.
    """
    size = max(1, int(micro_batch_size))
    order = sorted(range(len(batch)), key=lambda i: len(batch[i].input_ids), reverse=True)
    if not shared_prompt or size == 1:
        return [[batch[i] for i in order[start:start + size]] for start in range(0, len(order), size)]
    families: dict[tuple, list[int]] = {}
    for i in order:
        families.setdefault(_prompt_key(batch[i]), []).append(i)
    chunks = [f[start:start + size] for f in families.values() for start in range(0, len(f), size)]
    shared = [c for c in chunks if len(c) > 1]
    single = {c[0] for c in chunks if len(c) == 1}
    rest = [i for i in order if i in single]  # prompts with one sequence left: batched by length
    loose = [rest[start:start + size] for start in range(0, len(rest), size)]
    return [[batch[i] for i in chunk] for chunk in shared + loose]


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded device tensors of one micro-batch, as wide as its own longest sequence T."""

    ids: torch.Tensor  # [b, T] token ids, pad id after each row's end
    attn: torch.Tensor  # [b, T] 1 on real tokens
    mask: torch.Tensor  # [b, T-1] loss mask, shifted to align with next-token log-probs
    old: torch.Tensor  # [b, T-1] sampling log-probs (π_old), 0 where a row has none
    adv: torch.Tensor  # [b] advantages
    has_old: torch.Tensor  # [b] bool: the row came with its sampling log-probs
    prefix: int  # the rows' shared prompt length for `sequence_token_logprobs` (0 without `shared_prompt`)


@dataclass(frozen=True)
class FixedLogprobs:
    """The log-probs one micro-batch's loss compares against, fixed for the whole update (every ppo epoch).

    Computed before the first optimizer step (`Policy.prepare`) and kept on the CPU.
    """

    old: torch.Tensor  # [b, T-1] float32: π_old's log-probs (sampling's, or the initial weights' where missing)
    # False: rows without sampling log-probs still hold 0 in `old`; the first (only) epoch's own
    # forward, detached, fills them (one epoch: the old policy is the weights being trained).
    old_filled: bool
    ref: Optional[torch.Tensor]  # [b, T-1] float32 under the KL reference; None without one


@dataclass(frozen=True)
class PreparedBatch:
    """An update's micro-batches with their fixed log-probs: what every ppo epoch's optimizer step runs on."""

    micro_batches: list[list[TrainSequence]]
    fixed: list[FixedLogprobs]  # one per micro-batch, same order
    n_tokens: int  # loss tokens of the WHOLE batch (all ranks'): every micro-batch loss is divided by it


def micro_batch_tensors(seqs: list[TrainSequence], pad_id: int, device: torch.device,
                        shared_prompt: bool) -> MicroBatch:
    """The `MicroBatch` of `seqs` on `device`."""
    width = max(2, max(len(s.input_ids) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    old = torch.zeros((len(seqs), width), dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        if s.old_logprobs is not None:
            old[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    prefix = shared_prefix_len(ids, attn, mask[:, 1:]) if shared_prompt else 0
    return MicroBatch(ids=ids.to(device), attn=attn.to(device), mask=mask[:, 1:].to(device),
                      old=old[:, 1:].to(device), prefix=prefix,
                      adv=torch.tensor([s.advantage for s in seqs], dtype=torch.float32).to(device),
                      has_old=torch.tensor([s.old_logprobs is not None for s in seqs]).to(device))


def _prompt_key(s: TrainSequence) -> tuple[int, ...]:
    """The tokens of `s` before its first loss-masked one: the prompt its group's rollouts share."""
    first = next((i for i, m in enumerate(s.loss_mask) if m), len(s.loss_mask))
    return tuple(s.input_ids[:first])
