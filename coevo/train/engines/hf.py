"""`hf` generation engine: transformers `generate` over token-id prompts (docs/method.md §5.2).

Choices a caller may rely on:
- prompts of different lengths are left-padded into one batch; positions come from the
  attention mask, so a batched greedy result equals the one-prompt-at-a-time result;
- the rows' common prefix (a role's instructions and demonstration, a group's question) is
  computed once when it is at least `SHARED_PREFIX_MIN` tokens: its KV cache is repeated for
  every row and each row's own tokens follow it, padded between the prefix and them (positions
  still come from the mask). Same distributions, prefill cost paid once for the prefix;
- `temperature == 0` is greedy; otherwise multinomial sampling with `temperature` and `top_p`
  (transformers' own warpers; no top-k and none of the checkpoint's `generation_config` sampling
  defaults: the `SamplingParams` are the whole truth, as with vLLM);
- seeds, as the vLLM engine's: row k = i*n + j of a call (prompt i, sample j) draws from its own
  generator seeded `seed + k`, so what a row samples does not depend on the other rows of its batch,
  on `max_batch_rows`, or on how a data-parallel caller splits the prompts (a block starting at prompt
  a is the same call with seed `seed + a*n`, coevo/train/sharded.py `block_sampling`); rows with
  equal prompts still differ. Without a seed the base seed is drawn from torch's global RNG. A
  seeded call leaves the global RNG untouched;
- stop strings are matched on the decoded completion after every token; the completion ends
  at the first token whose decoding completes a stop string. That token is kept whole, so
  `text` contains the stop string and may run a few characters past it when the token spans
  the end of the stop string; `token_ids` are exactly the sampled ids and
  `text == tokenizer.decode(token_ids, skip_special_tokens=True)` (special tokens such as
  EOS stay in `token_ids` but not in `text`, matching vLLM's default);
- EOS (the tokenizer's and every id in the model's `generation_config.eos_token_id`) ends a
  completion and is included in `token_ids`; pad tokens after the end are dropped;
- `logprobs[i]` is log p(token_ids[i] | prefix) under the *raw* model distribution
  (fp32 log-softmax of the logits, before temperature / top-p), read from the same forward
  pass that sampled it. This is what `grpo.sequence_token_logprobs` computes for training, so
  it can serve as `old_logprobs`; it equals the sampling distribution when temperature = 1
  and top_p = 1 (vLLM's default "raw" logprobs make the same choice).
"""
from __future__ import annotations

from typing import Optional

import torch
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from coevo.core.types import Completion, SamplingParams
from coevo.train.lora import hf_model


class _LogprobRecorder(LogitsProcessor):
    """Keeps log p(sampled token) per step without storing every step's [R, V] scores.

    A processor sees the logits *before* the token is sampled, so each call gathers the
    previous step's token (now the last column of `input_ids`); `finish` gathers the last one.
    It runs first, before `_RowSampler` applies temperature and top-p, so these are raw logits.
    """

    def __init__(self) -> None:
        self._prev: Optional[torch.Tensor] = None  # [R, V] log-softmax of the previous step
        self._steps: list[torch.Tensor] = []  # each [R]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prev is not None:
            self._steps.append(self._prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """Per-token logprobs [R, G] for the G generated columns of `sequences` [R, P+G]."""
        if self._prev is not None:
            self._steps.append(self._prev.gather(-1, sequences[:, -1:]).squeeze(-1))
            self._prev = None
        if not self._steps:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self._steps, dim=1).cpu()


class _RowSampler(LogitsProcessor):
    """Samples every row from its own generator (row r seeded `seeds[r]`) and keeps only the drawn token.

    Runs after `_LogprobRecorder` (which must see the raw logits): temperature, then top-p (the warpers
    `do_sample` would apply), then one multinomial draw per row. `generate` runs greedy over the
    returned scores (the drawn token 0, every other -inf), so its argmax is the draw: transformers'
    own sampling would draw every row from one global stream, which ties a row's sample to its batch.
    """

    def __init__(self, seeds: list[int], temperature: float, top_p: float, device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.warpers: list[LogitsProcessor] = [TemperatureLogitsWarper(temperature)] if temperature != 1.0 else []
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        warped = scores
        for warper in self.warpers:
            warped = warper(input_ids, warped)
        probs = torch.softmax(warped.float(), dim=-1)
        drawn = torch.cat([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.generators)])
        return torch.full_like(scores, float("-inf")).scatter_(1, drawn[:, None], 0.0)


class _StopStrings(StoppingCriteria):
    """Marks a row done at the first step where its decoded completion contains a stop string.

    `stop_len[r]` records how many generated tokens row r had at that moment: the exact
    token-level cut, so post-processing never has to re-search the text.
    """

    def __init__(self, tokenizer, stops: list[str], prompt_len: int, n_rows: int) -> None:  # noqa: ANN001
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.prompt_len = prompt_len
        self.stop_len: list[Optional[int]] = [None] * n_rows

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs: object) -> torch.BoolTensor:  # noqa: ANN001
        gen = input_ids[:, self.prompt_len:].tolist()
        for r, ids in enumerate(gen):
            if self.stop_len[r] is None and self.stops:
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                if any(s in text for s in self.stops):
                    self.stop_len[r] = len(ids)
        return torch.tensor([n is not None for n in self.stop_len], dtype=torch.bool, device=input_ids.device)


def eos_token_ids(model, tokenizer) -> set[int]:  # noqa: ANN001
    """Every id that ends a completion: the tokenizer's EOS plus the model's generation EOS ids."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, gen_eos):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return ids


# Shortest common prefix worth a separate forward (below it, one more call costs more than it saves).
SHARED_PREFIX_MIN = 32


def common_prefix_len(rows: list[list[int]]) -> int:
    """Length of the rows' common prefix, at most the shortest row minus one (each row keeps a token to feed)."""
    shortest = min(len(r) for r in rows)
    first, n = rows[0], 0
    while n < shortest - 1 and all(r[n] == first[n] for r in rows):
        n += 1
    return n


class HFEngine:
    """A `GenerationEngine` backed by `model.generate`; shares the training model, so weight sync is free."""

    def __init__(self, model, tokenizer, max_batch_rows: Optional[int] = None) -> None:  # noqa: ANN001
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows  # rows (prompts x n) per generate call; None = all
        self.eos_ids = eos_token_ids(model, tokenizer)
        if not self.eos_ids:
            raise ValueError("tokenizer and model define no EOS token; HFEngine cannot tell where a completion ends")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.eos_ids)

    def sync_weights(self, model) -> None:  # noqa: ANN001
        """No-op beyond re-pointing: this engine generates with the very model object that trains."""
        self.model = model

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """Return `sampling.n` completions for each prompt (see the module docstring for semantics)."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("HFEngine.generate got an empty prompt; every prompt needs at least one token")
        rows = [list(p) for p in prompts for _ in range(sampling.n)]
        step = self.max_batch_rows or max(len(rows), 1)
        base = sampling.seed
        if base is None and sampling.temperature > 0:
            base = int(torch.randint(0, 2**62, ()).item())  # unseeded: from the global RNG, then per row
        flat: list[Completion] = []
        for start in range(0, len(rows), step):
            chunk = rows[start:start + step]
            seeds = None if base is None else [int(base) + start + k for k in range(len(chunk))]
            flat.extend(self._generate_rows(chunk, sampling, seeds))
        return [flat[i * sampling.n:(i + 1) * sampling.n] for i in range(len(prompts))]

    def _generation_config(self, sampling: SamplingParams) -> GenerationConfig:
        """Greedy decoding always: a sampled call draws in `_RowSampler`, and generate takes its one token."""
        return GenerationConfig(max_new_tokens=sampling.max_new_tokens, do_sample=False, num_beams=1,
                                pad_token_id=self.pad_id, eos_token_id=sorted(self.eos_ids),
                                return_dict_in_generate=True)

    def _generate_rows(self, rows: list[list[int]], sampling: SamplingParams,
                       seeds: Optional[list[int]]) -> list[Completion]:
        """One `model.generate` over `rows`; `seeds` (one per row) when sampling, None when greedy."""
        if sampling.max_new_tokens <= 0:
            return [Completion(prompt_ids=r, token_ids=[], text="", logprobs=[], finish_reason="length") for r in rows]
        device = next(self.model.parameters()).device
        shared = common_prefix_len(rows) if len(rows) > 1 else 0
        shared = shared if shared >= SHARED_PREFIX_MIN else 0
        width = shared + max(len(r) - shared for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # [shared prefix | padding | the row's own tokens]
            input_ids[i, :shared], attention[i, :shared] = torch.tensor(r[:shared], dtype=torch.long), 1
            input_ids[i, width - len(r) + shared:] = torch.tensor(r[shared:], dtype=torch.long)
            attention[i, width - len(r) + shared:] = 1
        cache = self._prefix_cache(rows[0][:shared], len(rows), device) if shared else None
        recorder = _LogprobRecorder()
        processors: list[LogitsProcessor] = [recorder]
        if sampling.temperature > 0:
            assert seeds is not None and len(seeds) == len(rows)  # `generate` gives a sampled call its row seeds
            processors.append(_RowSampler(seeds, float(sampling.temperature), float(sampling.top_p), device))
        stopper = _StopStrings(self.tokenizer, list(sampling.stop), width, len(rows))
        # A peft (LoRA) model generates through its wrapper, but the defaults live on the HF model inside.
        holder = hf_model(self.model)
        saved = holder.generation_config
        # A checkpoint's generation_config (top_k, repetition_penalty, ...) would silently fill
        # every field we leave unset; a blank one keeps SamplingParams authoritative.
        holder.generation_config = GenerationConfig()
        try:
            out = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                      past_key_values=cache, generation_config=self._generation_config(sampling),
                                      logits_processor=processors, stopping_criteria=[stopper])
        finally:
            holder.generation_config = saved
        generated = out.sequences[:, width:].cpu()
        logprobs = recorder.finish(out.sequences)
        return [self._completion(rows[i], generated[i].tolist(), logprobs[i].tolist(), stopper.stop_len[i])
                for i in range(len(rows))]

    @torch.no_grad()
    def _prefix_cache(self, prefix: list[int], rows: int, device: torch.device):  # noqa: ANN202 - a transformers Cache
        """KV cache of `prefix` computed once, repeated for `rows` rows (generate continues after it)."""
        cache = self.model(input_ids=torch.tensor([prefix], dtype=torch.long, device=device), use_cache=True,
                           ).past_key_values
        cache.batch_repeat_interleave(rows)
        return cache

    def _completion(self, prompt: list[int], gen: list[int], logps: list[float],
                    stop_len: Optional[int]) -> Completion:
        cut, reason = len(gen), "length"
        for i, tok in enumerate(gen):
            if tok in self.eos_ids:
                cut, reason = i + 1, "eos"
                break
        if stop_len is not None and stop_len <= cut:
            cut, reason = stop_len, "stop"
        ids = gen[:cut]
        return Completion(prompt_ids=prompt, token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True),
                          logprobs=logps[:cut], finish_reason=reason)
