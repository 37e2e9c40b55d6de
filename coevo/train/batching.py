"""How an update's sequences become micro-batches and padded tensors (coevo/train/policy.py, sharded.py).

Stateless: the policy passes its `micro_batch_size`, `shared_prompt`, pad id and device. Also the
update's engine-vs-trainer log-prob figure (`engine_gap`, `mismatch_metrics`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

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
    denominator of every micro-batch loss (docs/method.md §5.1's token-level mean over the whole batch).
    """
    for s in batch:
        check_sequence(s)
    return [sum(1 for m in s.loss_mask[1:] if m) for s in batch]


@dataclass
class Rescored(TrainSequence):
    """A sequence whose old log-probs the trainer computes (`old_logprobs` None) although the engine gave some.

    `engine_logprobs` keeps the engine's, aligned to `input_ids`, for the mismatch figure only.
    """

    engine_logprobs: Optional[list[float]] = None


def without_engine_old(batch: list[TrainSequence]) -> list[TrainSequence]:
    """`batch` with no engine log-probs as π_old (each sequence that had some: a `Rescored` copy holding them)."""
    return [s if s.old_logprobs is None else
            Rescored(**{**{f.name: getattr(s, f.name) for f in dataclasses.fields(s)},
                        "old_logprobs": None, "engine_logprobs": s.old_logprobs}) for s in batch]


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
    engine: torch.Tensor  # [b, T-1] the engine's log-probs (`old`'s, or a `Rescored` row's), 0 where none
    has_engine: torch.Tensor  # [b] bool: the row has the engine's log-probs


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


@dataclass
class PreparedBatch:
    """An update's micro-batches with their fixed log-probs: what every ppo epoch's optimizer step runs on."""

    micro_batches: list[list[TrainSequence]]
    fixed: list[FixedLogprobs]  # one per micro-batch, same order
    n_tokens: int  # loss tokens of the WHOLE batch (all ranks'): every micro-batch loss is divided by it
    # `mismatch_metrics` of the first optimizer step (None before it), whose weights are π_old's:
    # every later epoch reports that same figure.
    mismatch: Optional[dict[str, float]] = None


def micro_batch_tensors(seqs: list[TrainSequence], pad_id: int, device: torch.device,
                        shared_prompt: bool) -> MicroBatch:
    """The `MicroBatch` of `seqs` on `device`."""
    width = max(2, max(len(s.input_ids) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.float32)
    old = torch.zeros((len(seqs), width), dtype=torch.float32)
    engine = torch.zeros((len(seqs), width), dtype=torch.float32)
    engine_rows = [_engine_logprobs(s) for s in seqs]
    for i, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        if s.old_logprobs is not None:
            old[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        if engine_rows[i] is not None:
            engine[i, :n] = torch.tensor(engine_rows[i], dtype=torch.float32)
    prefix = shared_prefix_len(ids, attn, mask[:, 1:]) if shared_prompt else 0
    return MicroBatch(ids=ids.to(device), attn=attn.to(device), mask=mask[:, 1:].to(device),
                      old=old[:, 1:].to(device), prefix=prefix,
                      adv=torch.tensor([s.advantage for s in seqs], dtype=torch.float32).to(device),
                      has_old=torch.tensor([s.old_logprobs is not None for s in seqs]).to(device),
                      engine=engine[:, 1:].to(device),
                      has_engine=torch.tensor([e is not None for e in engine_rows]).to(device))


def _engine_logprobs(s: TrainSequence) -> Optional[list[float]]:
    """The engine's log-probs of `s`: its old ones, or those a `Rescored` copy kept aside."""
    return s.old_logprobs if s.old_logprobs is not None else getattr(s, "engine_logprobs", None)


def engine_gap(mb: MicroBatch, token_logprobs: torch.Tensor) -> torch.Tensor:
    """|engine - trainer log-prob| on `mb`'s loss tokens of rows with engine log-probs: 1-D float32, on the CPU.

    `token_logprobs`: [b, T-1], the trainer's forward as the update computes it (its precision).
    """
    tokens = mb.has_engine.unsqueeze(-1) & (mb.mask > 0)
    return (mb.engine - token_logprobs.detach().float()).abs()[tokens].cpu()


def mismatch_metrics(gaps: list[torch.Tensor], across_ranks: bool) -> dict[str, float]:
    """`logprob_mismatch_mean` and `logprob_mismatch_p99` over every token of `gaps` (`engine_gap`s).

    `across_ranks` (a sharded update, every rank calling): over every rank's tokens, the same
    figure on each. No token (no engine log-probs in the batch): {}, the keys absent, not 0.
    The p99 interpolates linearly between order statistics, as torch.quantile does.
    """
    values = torch.cat(gaps) if gaps else torch.zeros(0)
    if across_ranks:
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, values)
        values = torch.cat(parts)
    if values.numel() == 0:
        return {}
    values = values.double()
    pos = 0.99 * (values.numel() - 1)
    low = int(pos)
    below, above = (float(values.kthvalue(k + 1).values) for k in (low, min(low + 1, values.numel() - 1)))
    p99 = below + (above - below) * (pos - low)
    return {"logprob_mismatch_mean": float(values.mean()), "logprob_mismatch_p99": p99}


def _prompt_key(s: TrainSequence) -> tuple[int, ...]:
    """The tokens of `s` before its first loss-masked one: the prompt its group's rollouts share."""
    first = next((i for i, m in enumerate(s.loss_mask) if m), len(s.loss_mask))
    return tuple(s.input_ids[:first])
