"""Schemas of the three policies (proposer, solver, ranker): model, training and role keys.

Part of the typed configuration (coevo/core/config.py composes them into the roots and
re-exports them); one line of documentation per field, printed by `--help`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from omegaconf import MISSING

from coevo.core.choices import (
    Correctness,
    DType,
    Engine,
    Grouping,
    ProposerGeneration,
    ProposerReward,
    RankerMode,
    Relevance,
    WeightSync,
)

# peft's names for the attention and MLP projections of Llama / Qwen2 / Qwen3 / Mistral decoders.
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig:
    """A LoRA adapter trained over frozen base weights (peft); rank 0 is full fine-tuning."""

    rank: int = 0  # adapter rank r (0: full fine-tuning, no adapter)
    alpha: float = 32.0  # scaling alpha (the update is alpha/r * B A)
    target_modules: List[str] = field(default_factory=lambda: list(LORA_TARGETS))  # module names the adapter wraps


@dataclass
class PolicyConfig:
    """One policy (proposer, solver or ranker): its model and how it is trained."""

    preset: str = MISSING  # preset name this block came from (configs/model/<preset>.yaml)
    model: str = MISSING  # embedded preset (smollm2-135m, tiny-random), local HF dir or hub id
    dtype: DType = DType.float32  # parameter dtype: float32 | bfloat16 | float16 (bf16/fp16: frozen policies only)
    bf16_autocast: bool = True  # on a CUDA device with bf16: forward passes in bf16 over fp32 weights (CPU: fp32)
    engine: Engine = "${rollout.engine}"  # type: ignore[assignment]  # generation engine: hf | vllm
    checkpoint: Optional[str] = None  # HF checkpoint dir that replaces the preset weights
    frozen: bool = False  # generate with the initial weights and never update
    lr: float = 1e-6  # AdamW learning rate
    weight_decay: float = 0.0  # AdamW weight decay
    kl_coef: float = 0.001  # k3 KL coefficient to the frozen reference (0 = no reference copy)
    clip_eps: float = 0.2  # PPO clip range of the ratio pi/pi_old
    scale_std: bool = True  # divide group advantages by the group std
    keep_zero_advantage: bool = False  # keep A=0 sequences in the batch: they count in the token mean and get KL
    grad_clip: float = 1.0  # max global grad norm
    micro_batch_size: int = 4  # sequences per forward/backward
    shared_prompt: bool = True  # rows of a micro-batch with one prompt run it once (same math, less compute)
    ppo_epochs: int = 1  # passes over one batch of rollouts per update
    temperature: float = 1.0  # sampling temperature during training rollouts
    top_p: float = 1.0  # nucleus sampling threshold
    max_new_tokens: int = 128  # generation budget per call (per turn for the solver)
    max_prompt_tokens: int = 2048  # longest prompt, never cut: the solver's episode ends, the ranker shortens passages
    generation_rows: int = 0  # HF engine: rows (prompts x samples) per generate call, 0 = all; bounds its KV cache
    num_cpus: float = 1.0  # CPUs requested by this policy's Ray actor
    num_gpus: float = 0.0  # GPUs requested by this policy's Ray actor
    resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources of its actor (node labels)
    gpu_memory_utilization: float = 0.05  # vLLM share: of RAM (KV cache) on CPU, of GPU memory (+weights) on GPU
    vllm_enforce_eager: bool = "${rollout.vllm_enforce_eager}"  # type: ignore[assignment]  # skip CUDA graph capture
    weight_sync: WeightSync = WeightSync.tmpfs  # vLLM gets new weights via: tmpfs (any platform) | ipc (CUDA)
    sleep_mode: bool = False  # vLLM frees its GPU weights and KV cache during each update (CUDA builds only)
    gradient_checkpointing: bool = False  # recompute each decoder layer's activations in backward (less memory)
    lora: LoraConfig = field(default_factory=LoraConfig)  # lora.rank > 0: train an adapter, not the weights


@dataclass
class CurriculumConfig:
    """Hop curriculum (proposer/curriculum.py): each step's path length follows the solver's accuracy (not ZEST)."""

    enabled: bool = False  # start at 1 hop; the level is the step's fixed evidence.hops (at most evidence.max_hops)
    window: int = 5  # N: the last N steps played at the current level decide a move (a move needs N fresh steps)
    up: float = 0.6  # one level up when the solver's mean accuracy over the window is at least this
    down: float = 0.2  # one level down when it is at most this (a collapse); must be below `up`


@dataclass
class ProposerConfig(PolicyConfig):
    """The task writer (SPEC §3)."""

    group_size: int = 4  # target candidates sampled per reference question (its GRPO group)
    invalid_penalty: float = 0.5  # reward -invalid_penalty for a task rejected by validation
    invalid_penalty_by_stage: bool = False  # rejected: -invalid_penalty*(5-k)/5, k = stages passed (proposer/reward.py)
    reward: ProposerReward = ProposerReward.abs  # difficulty reward: abs 1-|2p-1| | quadratic 4p(1-p) | adversarial 1-p
    max_target_chars: int = 80  # targets longer than this are rejected (too_long)
    questions_per_step: int = 4  # reference questions consumed per co-evolution step
    grounding: int = 0  # >0: call 1 lists the titles of this many passages retrieved for the reference (not ZEST)
    generation: ProposerGeneration = ProposerGeneration.path  # call 2 from: path (certified chain) | direct
    question_stop: bool = False  # call 2 ends at the first "?" (one question per output; small models, not ZEST)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)  # hop curriculum; off in the paper presets


@dataclass
class SolverRewardConfig:
    """Tool-aware solver reward (SPEC §4.2)."""

    correctness: Correctness = Correctness.em  # em | f1 | f1_content (token F1 over content words)
    echo_guard: bool = False  # an answer found in the question or the rollout's own queries scores 0 (not SPEC)
    tool_cost: float = 0.2  # lambda: penalty for extra searches among correct rollouts
    format_penalty: float = 0.2  # alpha: reward -alpha on a format violation


@dataclass
class SolverConfig(PolicyConfig):
    """The search agent (SPEC §4.1-4.2)."""

    group_size: int = 4  # rollouts per task (G)
    max_searches: int = 3  # valid searches allowed per episode (paper: 6)
    max_turns: int = 4  # generation turns per episode (searches + final answer)
    max_episode_tokens: int = 1536  # total episode tokens (prompt + turns + observations)
    prime_tag: bool = False  # every turn's prompt ends with "<": small models start a tag, still choosing which
    guided_rollouts: bool = False  # the last rollout of a task with a path replays it: hop searches, then its target
    reward: SolverRewardConfig = field(default_factory=SolverRewardConfig)


@dataclass
class RankerConfig(PolicyConfig):
    """The generative listwise re-ranker inside the search tool (SPEC §4.3-4.6)."""

    mode: RankerMode = RankerMode.trainable  # trainable | frozen | none (first-stage top-K) | oracle
    share_backbone: bool = False  # the ranker uses the solver's weights
    n_candidates: int = 10  # N: first-stage candidates shown to the ranker (paper 50)
    top_k: int = 3  # K: documents the ranker returns to the solver (paper 5)
    passage_chars: int = 300  # candidate texts are cut to this many characters (all to fewer when over budget)
    grouping: Grouping = Grouping.semantic  # semantic | by_question
    group_f1: float = 0.8  # delta: sub-query token-F1 to join a group
    min_group_size: int = 3  # k_min: smaller groups are dropped
    relevance: Relevance = Relevance.answer  # pseudo-relevance label: answer | evidence | both
    gamma: float = 0.5  # r_rel threshold above which r_main is added
    format_penalty: float = 0.2  # alpha: reward -alpha for a malformed ranking
    reasoning: bool = True  # output <reason>…</reason> before <rerank>; false: <rerank> only (small models)
    prime_tag: bool = False  # the prompt ends with the output's opening tag (<reason>, or <rerank> without reasoning)
    line_stop: bool = False  # reasoning=false: the ranking ends at its first line break (small models, not CoSearch)
