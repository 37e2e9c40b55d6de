"""Schemas of the three policies (proposer, solver, ranker): model, training and role keys.

Part of the typed configuration (coevo/core/config.py composes them into the roots and
re-exports them); every field is one `key(default, doc, range)` line (coevo/core/ranges.py).
What the ranker's keys imply for its model is derived here once, for every layer above:
`RankerConfig.has_model`, `shares_solver_policy` and `ranker_policy_config`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional

from omegaconf import MISSING

from coevo.core.choices import (
    Correctness,
    DType,
    Engine,
    Grouping,
    GuideQuery,
    OldLogprobs,
    ProposerGeneration,
    ProposerReward,
    RankerMode,
    Relevance,
    WeightSync,
)
from coevo.core.ranges import AT_LEAST_1, FRACTION, NON_NEGATIVE, POSITIVE, UNIT, block, key

# peft's names for the attention and MLP projections of Llama / Qwen2 / Qwen3 / Mistral decoders.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig:
    """A LoRA adapter trained over frozen base weights (peft); rank 0 is full fine-tuning."""

    rank: int = key(0, "adapter rank r (0: full fine-tuning, no adapter)", NON_NEGATIVE)
    alpha: float = key(32.0, "scaling alpha (the update is alpha/r * B A)", POSITIVE)
    target_modules: List[str] = key(LORA_TARGETS, "module names the adapter wraps")


@dataclass
class PolicyConfig:
    """One policy (proposer, solver or ranker): its model and how it is trained."""

    preset: str = key(MISSING, "preset name this block came from (configs/model/<preset>.yaml)")
    model: str = key(MISSING, "embedded preset (smollm2-135m, tiny-random), local HF dir or hub id")
    dtype: DType = key(DType.float32, "parameter dtype: float32 | bfloat16 | float16 (bf16/fp16: frozen policies only)")
    bf16_autocast: bool = key(True, "on a CUDA device with bf16: forward passes in bf16 over fp32 weights (CPU: fp32)")
    cpu_bf16_autocast: bool = key(
        False, "on a CPU with native bf16 (avx512_bf16 / amx_bf16): forward passes in bf16 over fp32 weights")
    cpu_compile: bool = key(False, "on a CPU: each decoder layer's update forward/backward through torch.compile "
                            "(fused kernels; needs gradient_checkpointing or shared_prompt=false, and g++)")
    engine: Engine = key("${rollout.engine}", "generation engine: auto (vllm with num_gpus > 0, else hf) | hf | vllm")
    checkpoint: Optional[str] = key(None, "HF checkpoint dir that replaces the preset weights")
    frozen: bool = key(False, "generate with the initial weights and never update")
    lr: float = key(1e-6, "AdamW learning rate", NON_NEGATIVE)
    weight_decay: float = key(0.0, "AdamW weight decay", NON_NEGATIVE)
    kl_coef: float = key(0.001, "k3 KL coefficient to the frozen reference (0 = no reference copy)", NON_NEGATIVE)
    clip_eps: float = key(0.2, "PPO clip range of the ratio pi/pi_old", POSITIVE)
    scale_std: bool = key(True, "divide group advantages by the group std")
    keep_zero_advantage: bool = key(False, "keep A=0 sequences in the batch: they count in the token mean and get KL")
    grad_clip: float = key(1.0, "max global grad norm", NON_NEGATIVE)
    micro_batch_size: int = key(4, "sequences per forward/backward", AT_LEAST_1)
    shared_prompt: bool = key(True, "rows of a micro-batch with one prompt run it once (same math, less compute)")
    ppo_epochs: int = key(1, "passes over one batch of rollouts per update", AT_LEAST_1)
    old_logprobs: OldLogprobs = key(OldLogprobs.auto, "pi_old: auto (trainer's for vllm on CUDA or of another dtype, "
                                    "else engine's) | engine (rollout's) | trainer (own forward; free at 1 epoch)")
    temperature: float = key(1.0, "sampling temperature during training rollouts", NON_NEGATIVE)
    top_p: float = key(1.0, "nucleus sampling threshold", FRACTION)
    max_new_tokens: int = key(128, "generation budget per call (per turn for the solver)", AT_LEAST_1)
    max_prompt_tokens: int = key(
        2048, "longest prompt, never cut: the solver's episode ends, the ranker shortens passages", AT_LEAST_1)
    generation_rows: int = key(
        0, "HF engine: rows (prompts x samples) per generate call, 0 = all; bounds its KV cache", NON_NEGATIVE)
    num_cpus: float = key(1.0, "CPUs requested by this policy's Ray actor", NON_NEGATIVE)
    num_gpus: float = key(0.0, "GPUs requested by this policy's Ray actor", NON_NEGATIVE)
    cpu_ranks: int = key(
        0, "with num_gpus=0: shard it over this many CPU processes (gloo), the GPU path on a laptop (tests, fault "
        "bench); 0 or 1: one process", NON_NEGATIVE)
    resources: Dict[str, float] = key({}, "custom Ray resources of its actor (node labels)")
    gpu_memory_utilization: float = key(
        0.05, "vLLM share: of RAM (KV cache) on CPU, of GPU memory (+weights) on GPU", FRACTION)
    vllm_enforce_eager: Optional[bool] = key("${rollout.vllm_enforce_eager}", "skip CUDA graph capture")
    weight_sync: WeightSync = key(
        WeightSync.auto, "vLLM gets new weights via: auto (inprocess on CUDA, tmpfs on CPU) | inprocess (engine in "
        "this process, tensors handed over) | tmpfs (a file) | ipc (CUDA)")
    sleep_mode: bool = key(False, "vLLM frees its GPU weights and KV cache during each update (CUDA builds only)")
    gradient_checkpointing: bool = key(False, "recompute each decoder layer's activations in backward (less memory)")
    lora: LoraConfig = block(LoraConfig, "lora.rank > 0: train an adapter, not the weights")


@dataclass
class CurriculumConfig:
    """Hop curriculum (proposer/curriculum.py): each step's path length follows the solver's accuracy (not ZEST)."""

    enabled: bool = key(
        False, "start at 1 hop; the level is the step's fixed evidence.hops (at most evidence.max_hops)")
    window: int = key(
        5, "N: the last N steps played at the current level decide a move (a move needs N fresh steps)", AT_LEAST_1)
    up: float = key(0.6, "one level up when the solver's mean accuracy over the window is at least this", UNIT)
    down: float = key(0.2, "one level down when it is at most this (a collapse); must be below `up`", UNIT)


@dataclass
class ProposerConfig(PolicyConfig):
    """The task writer (docs/method.md §3)."""

    group_size: int = key(4, "target candidates sampled per reference question (its GRPO group)", AT_LEAST_1)
    invalid_penalty: float = key(0.5, "reward -invalid_penalty for a task rejected by validation", NON_NEGATIVE)
    invalid_penalty_by_stage: bool = key(
        False, "rejected: -invalid_penalty*(5-k)/5, k = stages passed (proposer/reward.py)")
    reward: ProposerReward = key(
        ProposerReward.abs, "difficulty reward: abs 1-|2p-1| | quadratic 4p(1-p) | adversarial 1-p")
    max_target_chars: int = key(80, "targets longer than this are rejected (too_long)", AT_LEAST_1)
    questions_per_step: int = key(4, "reference questions consumed per co-evolution step", AT_LEAST_1)
    grounding: int = key(
        0, ">0: call 1 lists the titles of this many passages retrieved for the reference (not ZEST)", NON_NEGATIVE)
    generation: ProposerGeneration = key(ProposerGeneration.path, "call 2 from: path (certified chain) | direct")
    question_stop: bool = key(False, 'call 2 ends at the first "?" (one question per output; small models, not ZEST)')
    curriculum: CurriculumConfig = block(CurriculumConfig, "hop curriculum; off in the paper presets")


@dataclass
class SolverRewardConfig:
    """Tool-aware solver reward (docs/method.md §4.2)."""

    correctness: Correctness = key(Correctness.em, "em | f1 | f1_content (token F1 over content words)")
    echo_guard: bool = key(
        False, "an answer found in the question, or in a query the rollout wrote before an observation "
        "held it, scores 0 (an addition: docs/method.md §9.2)")
    tool_cost: float = key(0.2, "lambda: penalty for extra searches among correct rollouts", NON_NEGATIVE)
    format_penalty: float = key(0.2, "alpha: reward -alpha on a format violation", NON_NEGATIVE)


@dataclass
class SolverConfig(PolicyConfig):
    """The search agent (docs/method.md §4.1-4.2)."""

    group_size: int = key(4, "rollouts per task (G)", AT_LEAST_1)
    max_searches: int = key(3, "valid searches allowed per episode (paper: 6)", AT_LEAST_1)
    max_turns: int = key(4, "generation turns per episode (searches + final answer)", AT_LEAST_1)
    max_episode_tokens: int = key(1536, "total episode tokens (prompt + turns + observations)", AT_LEAST_1)
    prime_tag: bool = key(False, "every turn's prompt ends with \"<\": small models start a tag, still choosing which")
    guided_rollouts: bool = key(
        False, "the last rollout of a task with a path replays it: hop searches, then its target")
    # Not in CoSearch (docs/method.md §4.7, §9.2): the path's heads reach the answer in 44 of run 14's 67 accepted
    # tasks (top 5), the question in all 67 (evidence.retrievable guarantees it), so a question replay trains more.
    guide_query: GuideQuery = key(
        GuideQuery.path, "what a guided rollout searches: path (each hop's head) | question (the question, once)")
    # Not in CoSearch (docs/method.md §4.8, §9.2; off in the paper presets): corpus clozes beside the proposer's tasks.
    extraction_mix: int = key(
        0, "coevo.run: clozes of solver.extraction_data added to each step's solver batch (0: none)", NON_NEGATIVE)
    extraction_data: Optional[str] = key(
        None, "training-split cloze JSONL of python -m evidence.extraction (solver.extraction_mix > 0)")
    reward: SolverRewardConfig = block(SolverRewardConfig)


def check_extraction_mix(solver: SolverConfig, in_solve: bool) -> None:
    """`solver.extraction_mix` > 0 needs its file and guided rollouts, and a co-evolution step to join:
    refused under `coevo.solve` (`in_solve`), whose own tasks are `solve.data` (docs/method.md §4.8)."""
    n = solver.extraction_mix
    if n == 0:
        return
    if in_solve:
        raise ValueError(f"config key solver.extraction_mix={n}: coevo.solve has no proposer tasks to mix clozes "
                         "into; give it the cloze file as solve.data, or set solver.extraction_mix=0")
    if not solver.extraction_data:
        raise ValueError(f"config key solver.extraction_mix={n} needs solver.extraction_data: a cloze JSONL of the "
                         "training page split (python -m evidence.extraction --split train --out FILE)")
    if not solver.guided_rollouts:
        raise ValueError(f"config key solver.extraction_mix={n} needs solver.guided_rollouts=true: each cloze's last "
                         "rollout replays its guide, the one right answer its group starts with")


@dataclass
class RankerConfig(PolicyConfig):
    """The generative listwise re-ranker inside the search tool (docs/method.md §4.3-4.6)."""

    mode: RankerMode = key(RankerMode.trainable, "trainable | frozen | none (first-stage top-K) | oracle")
    num_gpus: Optional[float] = key(None, "GPUs of its Ray actor; None: the GPUs the other roles leave free when "
                                    "they use GPUs, else 0 (config.resolve_placement)", NON_NEGATIVE)
    share_backbone: bool = key(False, "the ranker uses the solver's weights")
    n_candidates: int = key(10, "N: first-stage candidates shown to the ranker (paper 50)", AT_LEAST_1)
    top_k: int = key(3, "K: documents the ranker returns to the solver (paper 5)", AT_LEAST_1)
    passage_chars: int = key(
        300, "candidate texts are cut to this many characters (all to fewer when over budget)", AT_LEAST_1)
    grouping: Grouping = key(Grouping.semantic, "semantic | by_question")
    group_f1: float = key(0.8, "delta: sub-query token-F1 to join a group", UNIT)
    min_group_size: int = key(3, "k_min: smaller groups are dropped", AT_LEAST_1)
    relevance: Relevance = key(Relevance.answer, "pseudo-relevance label: answer | evidence | both")
    gamma: float = key(0.5, "r_rel threshold above which r_main is added", UNIT)
    format_penalty: float = key(0.2, "alpha: reward -alpha for a malformed ranking", NON_NEGATIVE)
    reasoning: bool = key(True, "output <reason>…</reason> before <rerank>; false: <rerank> only (small models)")
    prime_tag: bool = key(
        False, "the prompt ends with the output's opening tag (<reason>, or <rerank> without reasoning)")
    line_stop: bool = key(
        False, "reasoning=false: the ranking ends at its first line break (small models, not CoSearch)")

    @property
    def has_model(self) -> bool:
        """Whether the ranker generates with a policy: its own or the solver's (modes trainable and frozen).

        Modes none and oracle order the candidates without a model, so no ranker model is loaded,
        placed, sized or trained. The one spelling of this question in the code base.
        """
        return self.mode in ("trainable", "frozen")


def shares_solver_policy(ranker: RankerConfig, solver_frozen: bool = False) -> bool:
    """Whether the ranker generates with the solver's policy object itself.

    With `ranker.share_backbone` a trainable ranker does (one set of weights, one update). A
    frozen one does only when the solver is frozen too: on the live weights of a training
    solver the "fixed" ranker would drift with every solver update, so it gets a separate
    frozen copy of the solver's initial weights instead (`ranker_policy_config`).
    """
    return bool(ranker.share_backbone) and (
        ranker.mode == "trainable" or (ranker.mode == "frozen" and solver_frozen))


def ranker_policy_config(ranker: RankerConfig, solver: SolverConfig) -> Optional[RankerConfig]:
    """Config of the ranker's own policy; None when it needs none (modes none/oracle, or it
    shares the solver's policy object). A frozen shared-backbone ranker gets the solver's model
    (preset, weights, start checkpoint, dtype), frozen, with the ranker's own serving settings
    (engine, prompt budget, CPUs/GPUs: what the cluster was sized for)."""
    if not ranker.has_model or shares_solver_policy(ranker, solver.frozen):
        return None
    if not ranker.share_backbone:
        return ranker
    return dataclasses.replace(ranker, preset=solver.preset, model=solver.model, dtype=solver.dtype,
                               checkpoint=solver.checkpoint, frozen=True)
