"""HF engine semantics and Policy training / checkpoints on tiny random models."""
from __future__ import annotations

import copy
import json
import platform
import sys

import pytest
import torch

from coevo.core.budget import PromptBudgetError
from coevo.core.config import PolicyConfig
from coevo.core.grpo import k3_kl, sequence_token_logprobs
from coevo.core.stages import STAGE_FILE_ENV
from coevo.core.types import SamplingParams, TrainSequence
from coevo.train import precision
from coevo.train.allocator import pin_mmap_threshold
from coevo.train.engines import build_engine
from coevo.train.engines.hf import HFEngine
from coevo.train.policy import Policy

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


def _cfg(**kw) -> PolicyConfig:  # noqa: ANN003
    base = dict(preset="test", model="unused", engine="hf", lr=1e-2, kl_coef=0.0, micro_batch_size=2)
    base.update(kw)
    return PolicyConfig(**base)


def _ids(tok, text: str) -> list[int]:  # noqa: ANN001
    return tok(text, add_special_tokens=False)["input_ids"]


def _params(model) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(a: dict, b: dict, atol: float = 0.0) -> bool:
    return all(torch.allclose(a[k], b[k], atol=atol, rtol=0) for k in a)


# ---- HF engine ----------------------------------------------------------------------------------

def test_greedy_is_deterministic_and_batch_equals_one_by_one(bpe) -> None:
    model, tok = bpe
    engine = HFEngine(model, tok)
    prompts = [_ids(tok, "what is the capital"), _ids(tok, "Zürich"), _ids(tok, "the search results say that")]
    batched = engine.generate(prompts, GREEDY)
    again = engine.generate(prompts, GREEDY)
    assert [c[0].token_ids for c in batched] == [c[0].token_ids for c in again]
    for prompt, comps in zip(prompts, batched):
        single = engine.generate([prompt], GREEDY)[0][0]
        assert comps[0].token_ids == single.token_ids and comps[0].prompt_ids == prompt
        assert comps[0].text == tok.decode(single.token_ids, skip_special_tokens=True)
        assert len(comps[0].logprobs) == len(comps[0].token_ids)


def test_a_long_common_prefix_is_computed_once_with_the_same_results(bpe, monkeypatch) -> None:
    """Rows sharing >= SHARED_PREFIX_MIN tokens get one prefix forward; greedy ids and log-probs are unchanged."""
    from coevo.train.engines import hf

    model, tok = bpe
    head = _ids(tok, "you answer questions with a search engine over the whole of wikipedia " * 4)
    assert len(head) >= hf.SHARED_PREFIX_MIN
    prompts = [head + _ids(tok, tail) for tail in ("what is the capital", "Zürich", "the search results say that")]
    assert hf.common_prefix_len(prompts) >= len(head) and hf.common_prefix_len([[1, 2], [1, 2]]) == 1
    engine = HFEngine(model, tok)
    calls = []
    prefix_cache = engine._prefix_cache
    monkeypatch.setattr(engine, "_prefix_cache", lambda *a: calls.append(len(a[0])) or prefix_cache(*a))
    batched = engine.generate(prompts, GREEDY)
    assert calls and calls[0] >= len(head)
    for prompt, comps in zip(prompts, batched):
        single = engine.generate([prompt], GREEDY)[0][0]  # one row: nothing shared
        assert comps[0].token_ids == single.token_ids and comps[0].prompt_ids == prompt
        assert torch.allclose(torch.tensor(comps[0].logprobs), torch.tensor(single.logprobs), atol=1e-4)
    assert len(calls) == 1


def test_sampling_n_seed_and_logprobs_match_model(tiny) -> None:
    model, tok = tiny
    engine = HFEngine(model, tok)
    prompts = [_ids(tok, "what is the answer ?"), _ids(tok, "who")]
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=7)
    out = engine.generate(prompts, sp)
    assert [len(c) for c in out] == [3, 3]
    again = engine.generate(prompts, sp)
    assert [[c.token_ids for c in cs] for cs in out] == [[c.token_ids for c in cs] for cs in again]
    other = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=6, n=3, seed=8))
    assert [[c.token_ids for c in cs] for cs in out] != [[c.token_ids for c in cs] for cs in other]
    for comp in (c for cs in out for c in cs):
        assert len(comp.logprobs) == len(comp.token_ids) > 0
        ids = torch.tensor([comp.prompt_ids + comp.token_ids])
        with torch.no_grad():
            lp = sequence_token_logprobs(model, ids, torch.ones_like(ids))[0, len(comp.prompt_ids) - 1:]
        assert torch.allclose(lp, torch.tensor(comp.logprobs), atol=1e-4)


def test_tiny_top_p_equals_greedy(bpe) -> None:
    model, tok = bpe
    engine = HFEngine(model, tok)
    prompt = [_ids(tok, "the information says")]
    nucleus = engine.generate(prompt, SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=8, seed=3))
    greedy = engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert nucleus[0][0].token_ids == greedy[0][0].token_ids


def test_stop_string_cuts_at_the_completing_token(bpe) -> None:
    model, tok = bpe
    engine = HFEngine(model, tok)
    prompts = [_ids(tok, "what is the capital"), _ids(tok, "Zürich")]
    ref = engine.generate(prompts[:1], SamplingParams(temperature=0.0, max_new_tokens=20))[0][0].token_ids
    pieces = [tok.decode(ref[:k + 1], skip_special_tokens=True) for k in range(len(ref))]
    # a stop string that ends in the middle of the longest clean multi-character token
    single = [tok.decode([t]) for t in ref]
    longest = max(single, key=lambda p: 0 if "\ufffd" in p else len(p))
    assert len(longest) >= 3
    stop = longest[:-2]
    expected = next(n for n in range(1, len(ref) + 1) if stop in pieces[n - 1])
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=20, stop=["@@never", stop]))
    comp = out[0][0]
    assert comp.finish_reason == "stop" and comp.token_ids == ref[:expected]
    assert comp.text == tok.decode(comp.token_ids, skip_special_tokens=True) and stop in comp.text
    assert stop not in tok.decode(comp.token_ids[:-1], skip_special_tokens=True)
    assert len(comp.logprobs) == len(comp.token_ids)
    # the other row of the batch is unaffected by the first one stopping early
    assert out[1][0].token_ids == engine.generate(prompts[1:], SamplingParams(
        temperature=0.0, max_new_tokens=20, stop=["@@never", stop]))[0][0].token_ids


def test_eos_ends_completion_without_padding(tiny) -> None:
    model, tok = tiny
    bias = torch.zeros(len(tok))
    bias[tok.eos_token_id] = 100.0
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        out = HFEngine(model, tok).generate([_ids(tok, "who"), _ids(tok, "what is the answer")],
                                            SamplingParams(temperature=1.0, max_new_tokens=5, n=2, seed=0))
    finally:
        handle.remove()
    for comp in (c for cs in out for c in cs):
        assert comp.token_ids == [tok.eos_token_id] and comp.finish_reason == "eos" and comp.text == ""


# ---- Policy: construction, prompts, engines -----------------------------------------------------

def test_from_config_chat_prompt_and_prompt_budget(tiny_dir) -> None:
    policy = Policy.from_config(_cfg(model=str(tiny_dir), max_prompt_tokens=4), role="solver")
    assert policy.role == "solver" and policy.num_parameters() > 0 and policy.ref_model is None
    ids = policy.chat_prompt_ids([{"role": "user", "content": "what is the answer ?"}])
    rendered = policy.tokenizer.decode(ids)
    assert rendered.startswith("<|im_start|> user") and rendered.endswith("<|im_start|> assistant")
    # A prompt over max_prompt_tokens is never cut (it used to lose its head): an error naming the key.
    with pytest.raises(PromptBudgetError, match=rf"{len(ids)} tokens exceed config key solver.max_prompt_tokens=4"):
        policy.generate([ids], policy.sampling_from_config(greedy=True, max_new_tokens=3))
    comps = policy.generate([ids[-4:]], policy.sampling_from_config(greedy=True, max_new_tokens=3))
    assert comps[0][0].prompt_ids == ids[-4:] and len(comps[0][0].token_ids) == 3
    policy.tokenizer.chat_template = None
    plain = policy.chat_prompt_ids([{"role": "user", "content": "who"}])
    assert policy.tokenizer.decode(plain) == "user : who assistant :"
    sp = policy.sampling_from_config(n=4)
    assert (sp.temperature, sp.n, sp.max_new_tokens) == (policy.cfg.temperature, 4, policy.cfg.max_new_tokens)


def test_unknown_engine_is_a_clear_error(tiny) -> None:
    model, tok = tiny
    with pytest.raises(ValueError, match="engine='nope'"):
        build_engine(_cfg(engine="nope"), model, tok)


def test_generation_rows_split_hf_generate_calls_greedy_results_unchanged(bpe, monkeypatch) -> None:
    model, tok = bpe
    engine = build_engine(_cfg(generation_rows=2), model, tok)
    assert isinstance(engine, HFEngine) and engine.max_batch_rows == 2
    assert build_engine(_cfg(), model, tok).max_batch_rows is None  # 0: every row in one call
    calls = []
    inner = HFEngine._generate_rows
    monkeypatch.setattr(HFEngine, "_generate_rows",
                        lambda self, rows, *rest: calls.append(len(rows)) or inner(self, rows, *rest))
    prompts = [_ids(tok, "what is the capital"), _ids(tok, "Zürich"), _ids(tok, "the search results say that")]
    split = engine.generate(prompts, GREEDY)
    assert calls == [2, 1]  # 3 rows, at most 2 per generate call
    whole = HFEngine(model, tok).generate(prompts, GREEDY)
    assert [[c.token_ids for c in cs] for cs in split] == [[c.token_ids for c in cs] for cs in whole]


def test_seeded_rows_sample_the_same_in_any_batch(tiny) -> None:
    """Row k = i*n + j of a seeded call draws from its own stream (seed + k, the vLLM engine's rule): a block of the
    prompts from prompt a with seed + a*n samples what those rows sample in the whole call, and so does a call cut
    into generate calls of 2 rows; a different seed samples something else; the global RNG is left untouched."""
    model, tok = tiny
    prompts = [_ids(tok, t) for t in ("what is the answer ?", "who", "the search", "a b c d")]
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=6, n=2, seed=11)
    state = torch.random.get_rng_state()
    whole = HFEngine(model, tok).generate(prompts, sp)
    assert torch.equal(torch.random.get_rng_state(), state)
    parts = HFEngine(model, tok).generate(prompts[:1], sp) + HFEngine(model, tok).generate(
        prompts[1:], SamplingParams(**{**sp.__dict__, "seed": 11 + 1 * sp.n}))
    chunked = HFEngine(model, tok, max_batch_rows=2).generate(prompts, sp)
    for got in (parts, chunked):
        assert [[c.token_ids for c in cs] for cs in got] == [[c.token_ids for c in cs] for cs in whole]
        for a, b in zip((c for cs in got for c in cs), (c for cs in whole for c in cs)):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    samples = [c.token_ids for cs in whole for c in cs]
    assert len({tuple(t) for t in samples}) > len(prompts)  # the n samples of a prompt differ
    other = HFEngine(model, tok).generate(prompts, SamplingParams(**{**sp.__dict__, "seed": 12}))
    assert [c.token_ids for cs in other for c in cs] != samples


# ---- Policy.update ------------------------------------------------------------------------------

def _batch(tok, n: int = 4) -> list[TrainSequence]:  # noqa: ANN001
    prompt = _ids(tok, "what is the answer ?")
    seqs = []
    for i in range(n):
        gen = _ids(tok, ["the answer is 4", "who", "a answer", "search the"][i % 4])
        obs = _ids(tok, "< information > Doc 1 < / information >")
        tail = _ids(tok, "answer 4")
        ids = prompt + gen + obs + tail
        mask = [0] * len(prompt) + [1] * len(gen) + [0] * len(obs) + [1] * len(tail)
        seqs.append(TrainSequence(ids[: len(ids) - i], mask[: len(ids) - i], advantage=[1.0, -1.0, 0.5, -0.5][i % 4]))
    return seqs


def test_update_changes_weights_and_keeps_reference(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(kl_coef=0.1, ppo_epochs=2), model, tok)
    before, ref_before = _params(policy.model), _params(policy.ref_model)
    # AdamW's moments exist from the start (the process is its full size before any update), at step 0
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    assert all(float(policy.optimizer.state[p]["step"]) == 0.0 for p in trainable)
    metrics = policy.update(_batch(tok))
    assert not _same(before, _params(policy.model))
    assert _same(ref_before, _params(policy.ref_model))
    for key in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm", "n_seqs", "n_tokens", "time_s"):
        assert key in metrics
    assert metrics["n_seqs"] == 4 and metrics["grad_norm"] > 0 and metrics["kl"] >= 0
    assert all(float(policy.optimizer.state[p]["step"]) == 2.0 for p in trainable)  # one per ppo epoch
    assert policy.update([TrainSequence([1, 2, 3], [0, 0, 0], 1.0)])["skipped"] is True


class _SleepyEngine:
    """An engine with vLLM's sleep_mode: records when it sleeps and when the update syncs (wakes) it."""

    sleep_mode = True

    def __init__(self) -> None:
        self.events: list[str] = []

    def sleep(self) -> None:
        self.events.append("sleep")

    def sync_weights(self, model) -> None:  # noqa: ANN001
        self.events.append("sync")


def test_an_engine_in_sleep_mode_sleeps_through_the_update_and_the_sync_wakes_it(tiny) -> None:
    model, tok = tiny
    engine = _SleepyEngine()
    policy = Policy(_cfg(), model, tok, engine=engine)
    policy.update(_batch(tok))
    assert engine.events == ["sleep", "sync"]
    assert policy.update([TrainSequence([1, 2, 3], [0, 0, 0], 1.0)])["skipped"] is True
    assert engine.events == ["sleep", "sync"]  # a skipped update leaves the engine awake


def test_update_publishes_its_stages(tiny, tmp_path, monkeypatch) -> None:
    model, tok = tiny
    path = tmp_path / "stages.jsonl"
    monkeypatch.setenv(STAGE_FILE_ENV, str(path))
    Policy(_cfg(), model, tok, role="solver").update(_batch(tok))
    stages = [json.loads(line)["stage"] for line in path.read_text().splitlines()]
    assert stages == ["solver", "solver/logprobs", "solver", "solver/backward", "solver", "solver/sync", "solver", ""]


def test_frozen_policy_never_changes(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(frozen=True, kl_coef=0.1), model, tok)
    before = _params(policy.model)
    assert policy.update(_batch(tok)) == {"skipped": True}
    assert policy.optimizer is None and policy.ref_model is None and _same(before, _params(policy.model))


def test_masked_inputs_and_micro_batching_do_not_change_the_step(tiny) -> None:
    model, tok = tiny
    batch = _batch(tok)
    with torch.no_grad():
        for s in batch:  # on-policy old logprobs, as an engine would return them
            ids = torch.tensor([s.input_ids])
            s.old_logprobs = [0.0] + sequence_token_logprobs(model, ids, torch.ones_like(ids))[0].tolist()
    junk = copy.deepcopy(batch)
    for s in junk:
        s.old_logprobs = [lp if m else 123.0 for lp, m in zip(s.old_logprobs, s.loss_mask)]
    results = []
    for seqs, mbs in ((batch, 1), (junk, 4), ([TrainSequence(b.input_ids, b.loss_mask, b.advantage) for b in batch], 3),
                      (batch + [TrainSequence(batch[0].input_ids, [0] * len(batch[0].input_ids), 5.0)], 2)):
        policy = Policy(_cfg(micro_batch_size=mbs), copy.deepcopy(model), tok)
        # SGD moves weights in proportion to the gradient; Adam's first step is ~lr*sign(g) and
        # would turn float noise on near-zero gradients into visible differences.
        policy.optimizer = torch.optim.SGD(policy.model.parameters(), lr=1.0)
        metrics = policy.update(seqs)
        results.append(_params(policy.model))
        assert metrics["clip_frac"] == 0.0
    for other in results[1:]:
        assert _same(results[0], other, atol=1e-6)


def test_shared_prompt_gives_the_same_step_and_groups_micro_batches_by_prompt(tiny) -> None:
    """Rows with one prompt share its forward; the step equals the unshared one (SGD: gradients compared)."""
    model, tok = tiny
    other = _ids(tok, "who is it ?")
    batch = _batch(tok) + [TrainSequence(other + _ids(tok, "answer 4"), [0] * len(other) + [1, 1], -0.5),
                           TrainSequence(other + _ids(tok, "a answer"), [0] * len(other) + [1, 1], 0.5)]
    results = []
    for shared in (False, True):
        policy = Policy(_cfg(micro_batch_size=4, shared_prompt=shared, kl_coef=0.1), copy.deepcopy(model), tok)
        policy.optimizer = torch.optim.SGD(policy.model.parameters(), lr=1.0)
        chunks = policy.micro_batches(batch)
        prefixes = [policy.micro_batch_tensors(c).prefix for c in chunks]
        policy.update(batch)
        results.append(_params(policy.model))
    assert sorted(len(c) for c in chunks) == [2, 4]  # the 4 rollouts of one prompt, then the 2 of the other
    assert sorted(prefixes) == [len(other) - 1, len(_ids(tok, "what is the answer ?")) - 1]
    assert not _same(_params(model), results[1])
    assert _same(results[0], results[1], atol=1e-6)


@pytest.mark.parametrize("epochs", [1, 3])
def test_missing_old_logprobs_are_the_initial_weights_in_every_epoch(tiny, epochs: int) -> None:
    """One epoch takes them from the trained forward, several from a pass before the first step:
    both equal old log-probs stored from the initial weights, epoch after epoch."""
    model, tok = tiny
    stored = _batch(tok)
    with torch.no_grad():
        for s in stored:
            ids = torch.tensor([s.input_ids])
            s.old_logprobs = [0.0] + sequence_token_logprobs(model, ids, torch.ones_like(ids))[0].tolist()
    missing = [TrainSequence(s.input_ids, s.loss_mask, s.advantage) for s in stored]
    results = []
    for seqs in (stored, missing):
        policy = Policy(_cfg(ppo_epochs=epochs, clip_eps=0.05), copy.deepcopy(model), tok)
        policy.optimizer = torch.optim.SGD(policy.model.parameters(), lr=1.0)
        results.append((_params(policy.model), policy.update(seqs)))
    assert _same(results[0][0], results[1][0], atol=1e-6)
    assert results[0][1]["clip_frac"] == pytest.approx(results[1][1]["clip_frac"])
    if epochs > 1:  # later epochs compare against the initial weights, so some tokens clip
        assert results[1][1]["clip_frac"] > 0


def test_mmap_threshold_is_pinned_on_glibc_only() -> None:
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert pin_mmap_threshold() is glibc


def test_save_load_round_trip(tiny, tiny_dir, tmp_path) -> None:
    model, tok = tiny
    policy = Policy(_cfg(kl_coef=0.1), model, tok)
    policy.update(_batch(tok))
    target = tmp_path / "ckpt" / "solver"
    policy.save(target)
    policy.save(target)  # overwriting an existing checkpoint is atomic too
    assert (target / "optimizer.pt").exists() and (target / "config.json").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == ["solver"]
    fresh = Policy.from_config(_cfg(model=str(tiny_dir), kl_coef=0.1))
    ref_before = _params(fresh.ref_model)
    fresh.load(target)
    assert _same(_params(policy.model), _params(fresh.model))
    assert _same(ref_before, _params(fresh.ref_model))
    state_a, state_b = policy.optimizer.state_dict()["state"], fresh.optimizer.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k]["exp_avg"], state_b[k]["exp_avg"]) for k in state_a)
    prompt = [_ids(tok, "who is")]
    assert policy.generate(prompt, GREEDY)[0][0].token_ids == fresh.generate(prompt, GREEDY)[0][0].token_ids


# ---- Policy.update moves the policy the right way (a sign error anywhere fails these) ------------

def _masked_logprob_sums(model, seqs: list[TrainSequence]) -> list[float]:  # noqa: ANN001
    """Sum of log p over each sequence's loss-masked tokens."""
    out = []
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s.input_ids])
            lp = sequence_token_logprobs(model, ids, torch.ones_like(ids))[0]
            out.append(float((lp * torch.tensor(s.loss_mask[1:], dtype=torch.float32)).sum()))
    return out


def _k3_to_reference(policy: Policy, seqs: list[TrainSequence]) -> float:
    """Token-level mean of the k3 KL estimator over all loss-masked tokens (what the KL term minimizes)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s.input_ids])
            lp = sequence_token_logprobs(policy.model, ids, torch.ones_like(ids))
            ref = sequence_token_logprobs(policy.ref_model, ids, torch.ones_like(ids))
            mask = torch.tensor([s.loss_mask[1:]])
            total += float(k3_kl(lp, ref, mask).sum())
            count += int(mask.sum())
    return total / count


def _use_sgd(policy: Policy, lr: float) -> None:
    # Plain SGD steps along -gradient, so each sequence's first-order change has the sign the
    # loss gives it; Adam's first step (~lr * sign(g) per weight) would blur that.
    policy.optimizer = torch.optim.SGD(policy.model.parameters(), lr=lr)


def _distinct_batch(tok) -> list[TrainSequence]:  # noqa: ANN001
    """Four sequences with their own generated words and lengths, advantages +1, -1, +1, -1."""
    prompt = _ids(tok, "what is the answer ?")
    gens = ["the answer is 4", "who was in Doc", "search ( information ) 5 6", "Title of 7 8 9 and"]
    return [TrainSequence(prompt + _ids(tok, g), [0] * len(prompt) + [1] * len(_ids(tok, g)), a)
            for g, a in zip(gens, [1.0, -1.0, 1.0, -1.0])]


@pytest.mark.parametrize("cpu_bf16", [False, True])
def test_update_raises_positive_and_lowers_negative_advantage_sequences(tiny, cpu_bf16, monkeypatch) -> None:
    model, tok = tiny
    batch = _distinct_batch(tok)
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: True)  # autocast runs (emulated) on any CPU
    # micro-batches of 3 over 4 lengths: sorting must keep each advantage with its sequence
    policy = Policy(_cfg(micro_batch_size=3, grad_clip=0.0, cpu_bf16_autocast=cpu_bf16), model, tok)
    _use_sgd(policy, lr=0.05)
    before = _masked_logprob_sums(policy.model, batch)
    policy.update(batch)
    after = _masked_logprob_sums(policy.model, batch)
    for s, b, a in zip(batch, before, after):
        assert (a - b) * s.advantage > 0, (s.advantage, b, a)


def test_kl_term_alone_pulls_the_policy_back_to_the_reference(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(kl_coef=1.0, grad_clip=0.0, micro_batch_size=3), model, tok)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move the policy away from its reference copy first
        for p in policy.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    batch = [TrainSequence(s.input_ids, s.loss_mask, 0.0) for s in _distinct_batch(tok)]
    kl_before = _k3_to_reference(policy, batch)
    assert kl_before > 1e-3
    _use_sgd(policy, lr=0.05)
    metrics = policy.update(batch)
    assert metrics["pg_loss"] == 0.0 and metrics["kl"] == pytest.approx(kl_before, rel=1e-4)
    assert _k3_to_reference(policy, batch) < kl_before


def test_first_epoch_loss_is_the_token_mean_of_minus_advantage(tiny) -> None:
    model, tok = tiny
    batch = _batch(tok)  # advantages 1, -1, 0.5, -0.5 over sequences of different lengths
    # Old log-probs are recomputed from the same weights, so every ratio is 1 at the first epoch
    # and each masked token contributes -A; the reference equals the policy, so the KL is 0.
    n = [sum(s.loss_mask[1:]) for s in batch]
    expected = -sum(s.advantage * k for s, k in zip(batch, n)) / sum(n)
    assert expected != 0.0
    metrics = Policy(_cfg(kl_coef=0.5, micro_batch_size=3), model, tok).update(batch)
    assert metrics["pg_loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-7) and metrics["loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["n_tokens"] == sum(n) and metrics["clip_frac"] == 0.0


# ---- precision (docs/method.md §5.2): fp32 master weights and optimizer state, bf16 compute on CUDA only -------

def _changed_share(before: dict, after: dict, touched: dict) -> float:
    """Share of the touched elements (nonzero gradient) whose value changed."""
    n_touched = sum(int(t.sum()) for t in touched.values())
    return sum(int(((before[k] != after[k]) & touched[k]).sum()) for k in touched) / n_touched


def test_fp32_master_weights_move_at_paper_lr_where_bf16_would_not(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(lr=1e-6, grad_clip=0.0), model, tok)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    policy.update(_batch(tok))
    params = dict(policy.model.named_parameters())
    state = policy.optimizer.state
    assert all(p.dtype == torch.float32 for p in params.values())
    assert all(state[p]["exp_avg"].dtype == state[p]["exp_avg_sq"].dtype == torch.float32 for p in params.values())
    # Adam's first step moves every element with a gradient by lr x g/(|g| + eps), about 1e-6: fp32 holds that
    # (its step at 1.0, the norm weights, is 1.2e-7); exp_avg = (1 - beta1) g marks the touched elements.
    touched = {n: state[p]["exp_avg"] != 0 for n, p in params.items()}
    after = {n: p.detach() for n, p in params.items()}
    assert _changed_share(before, after, touched) > 0.99
    # The same first step on bf16 weights: a 1e-6 move is below half a bf16 step (2^-8 relative) for all but
    # weights under ~2.6e-4 in size, so nearly nothing changes.
    bf16 = {n: before[n].to(torch.bfloat16).requires_grad_(True) for n in params}
    for n, p in bf16.items():
        p.grad = (state[params[n]]["exp_avg"] / 0.1).to(torch.bfloat16)  # the gradient itself: exp_avg / (1 - 0.9)
    torch.optim.AdamW(list(bf16.values()), lr=1e-6, weight_decay=0.0).step()
    moved = _changed_share({n: before[n].to(torch.bfloat16) for n in params},
                           {n: p.detach() for n, p in bf16.items()}, touched)
    assert moved < 0.05  # 2.0% measured


def test_trainable_bf16_weights_are_refused_frozen_ones_kept(tiny) -> None:
    model, tok = tiny
    half = copy.deepcopy(model).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"config key solver.dtype=bfloat16: a trainable solver keeps fp32 master"):
        Policy(_cfg(), half, tok, role="solver")
    frozen = Policy(_cfg(frozen=True), half, tok, role="solver")
    assert next(frozen.model.parameters()).dtype == torch.bfloat16


def test_cpu_compute_is_plain_fp32(tiny) -> None:
    model, tok = tiny
    policy = Policy(_cfg(bf16_autocast=True), model, tok)
    ids = torch.tensor([_ids(tok, "what is the answer ?")])
    with policy.compute():
        logits = policy.model(input_ids=ids).logits
    assert policy.device.type == "cpu" and logits.dtype == torch.float32 and not torch.is_autocast_enabled()


@pytest.mark.parametrize("native", [True, False])
def test_cpu_bf16_autocast_computes_in_bf16_only_where_the_cpu_has_it(tiny, native, monkeypatch, caplog) -> None:
    model, tok = tiny
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: native)
    precision._warn_no_cpu_bf16.cache_clear()  # the warning is said once per process
    policy = Policy(_cfg(cpu_bf16_autocast=True), model, tok)
    ids = torch.tensor([_ids(tok, "what is the answer ?")])
    for _ in range(2):
        with policy.compute():
            logits = policy.model(input_ids=ids).logits
    assert logits.dtype == (torch.bfloat16 if native else torch.float32)
    assert next(policy.model.parameters()).dtype == torch.float32  # master weights stay fp32
    warnings = [r for r in caplog.records if "cpu_bf16_autocast=true ignored" in r.getMessage()]
    assert len(warnings) == (0 if native else 1)


@pytest.mark.parametrize("engine, cpu_bf16, kept", [("hf", True, True), ("vllm", False, True), ("vllm", True, False)])
def test_engine_logprobs_of_another_precision_are_not_the_old_ones(tiny, engine, cpu_bf16, kept, monkeypatch) -> None:
    """A CPU vLLM engine serves fp32; under cpu_bf16_autocast the update's own bf16 log-probs are the old ones."""
    model, tok = tiny
    monkeypatch.setattr(precision, "cpu_native_bf16", lambda: True)
    policy = Policy(_cfg(engine=engine, cpu_bf16_autocast=cpu_bf16), model, tok, engine=HFEngine(model, tok))
    ids = _ids(tok, "what is the answer ?")
    far_off = [0.0, 0.0] + [-30.0] * (len(ids) - 2)  # ratio e^(logp + 30): every token clipped if used
    seq = TrainSequence(ids, [0, 0] + [1] * (len(ids) - 2), 1.0, far_off)
    [[got]] = policy.micro_batches([seq])
    assert (got.old_logprobs == far_off) if kept else got.old_logprobs is None
    assert seq.old_logprobs == far_off  # the caller's sequence is left as it was
    assert (policy.update([seq])["clip_frac"] == 0.0) == (not kept)


def test_cpu_flags_are_read_from_cpuinfo(tmp_path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert precision.cpu_flags(str(info)) == {"fpu", "avx2", "avx512_bf16"}
    assert precision.cpu_flags(str(tmp_path / "absent")) == frozenset()


def test_proposer_prompt_over_its_budget_fails_naming_the_key(tiny) -> None:
    """A proposer prompt is never cut either: it fits or the call fails, naming the role and the key."""
    from coevo.core.config import ProposerConfig
    from proposer.pipeline import propose_targets

    model, tok = tiny
    policy = Policy(_cfg(frozen=True, max_prompt_tokens=8), model, tok, role="proposer")
    with pytest.raises(PromptBudgetError, match=r"2 proposer prompt\(s\) of up to \d+ tokens exceed config key "
                                                r"proposer.max_prompt_tokens=8"):
        propose_targets(policy, [(0, "who wrote hamlet ?"), (1, "what is the capital ?")],
                        ProposerConfig(preset="t", model="t", group_size=2))
