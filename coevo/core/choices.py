"""The enumerated choices of config fields (the `StrEnum` types of coevo/core/config.py's schema).

Member names equal their values: members compare equal to, hash like and format as their
strings (`cfg.ranker.mode == "frozen"`, f-strings and json.dumps keep working), and OmegaConf
writes them back as the plain strings. Hydra refuses any other value, naming the choices.
"""
from __future__ import annotations

from enum import StrEnum


class Engine(StrEnum):
    """Generation engine."""

    auto = "auto"  # vllm for a role with num_gpus > 0, hf on the CPU (decided at validation: config.resolve_placement)
    hf = "hf"
    vllm = "vllm"


class WeightSync(StrEnum):
    """How a vLLM engine gets the weights after an update (coevo/train/engines/vllm.py)."""

    auto = "auto"  # inprocess on a CUDA build of vLLM, tmpfs on the CPU build
    inprocess = "inprocess"  # engine in the policy's process: (name, tensor) pairs handed over, no file, no copy
    tmpfs = "tmpfs"  # a safetensors file under /dev/shm, reloaded in place (any platform)
    ipc = "ipc"  # CUDA IPC handles of the live parameters (CUDA, trainer on the engine's GPU)


class OldLogprobs(StrEnum):
    """Whose log-probs are an update's old ones, pi_old (`<role>.old_logprobs`, coevo/train/precision.py)."""

    auto = "auto"  # trainer where the engine is vLLM on CUDA or serves another dtype than the update's, else engine
    engine = "engine"  # the rollout engine's, wherever it gave them
    trainer = "trainer"  # the trainer's own forward before the step (free at one ppo epoch)


class DType(StrEnum):
    """Parameter dtype."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class ProposerGeneration(StrEnum):
    """How proposer call 2 is grounded."""

    path = "path"  # a certified multi-hop evidence path (ZEST)
    direct = "direct"  # the target's answer-side passage only (ZEST's comparison for path guidance)


class PathLength(StrEnum):
    """Which certified evidence path a candidate gets (`evidence.hops`, proposer/hops.py).

    A number k is a valid value too (1 <= k <= evidence.max_hops): a path of exactly k hops.
    """

    longest = "longest"  # the longest certified path, greedy branch first (ZEST: the hop budget is used)
    sampled = "sampled"  # a length drawn uniformly among those available, with the step's seed


def path_length(value: object, max_hops: int) -> PathLength | int:
    """`evidence.hops` as a choice: a `PathLength`, or the number of hops k (1 <= k <= max_hops).

    The key is a string (OmegaConf has no union of an enumeration and an int); a value that is
    neither raises ValueError naming the key and what it accepts.
    """
    text = str(value).strip()
    if text in PathLength.__members__:
        return PathLength(text)
    if text.isdigit() and 1 <= int(text) <= max_hops:
        return int(text)
    raise ValueError(f"config key evidence.hops={value!r} is not a path length: expected one of "
                     f"{', '.join(PathLength)} or a number of hops 1..{max_hops} (evidence.max_hops)")


class ProposerReward(StrEnum):
    """Difficulty reward of a task solved by a share p of the solver's rollouts."""

    abs = "abs"  # 1 - |2p - 1|
    quadratic = "quadratic"  # 4p(1 - p)
    adversarial = "adversarial"  # 1 - p: monotonic, the harder the better (ZEST's comparison)


class Correctness(StrEnum):
    """How a solver answer is scored against the gold answers."""

    em = "em"
    f1 = "f1"
    f1_content = "f1_content"  # token F1 over content words (coevo.core.scoring.content_f1)


class RankerMode(StrEnum):
    """What the search tool does after first-stage retrieval."""

    trainable = "trainable"  # the ranker model re-ranks and is trained
    frozen = "frozen"  # the ranker model re-ranks with its initial weights (loaded frozen)
    none = "none"  # no ranker: the first-stage top-K
    oracle = "oracle"  # answer-containing candidates promoted to the top (upper bound)


class Grouping(StrEnum):
    """How ranker calls are grouped for GRPO."""

    semantic = "semantic"
    by_question = "by_question"


class GuideQuery(StrEnum):
    """What a guided rollout (`solver.guided_rollouts`) searches before it states the target."""

    path = "path"  # each hop's head entity, the name the hop's passage is found by
    question = "question"  # the task's question itself, as a solver that copies it would search


class Relevance(StrEnum):
    """Pseudo-relevance label of a ranked passage."""

    answer = "answer"
    evidence = "evidence"
    both = "both"


class RetrievalBackend(StrEnum):
    """First-stage retriever implementation."""

    bm25s = "bm25s"
    rank_bm25 = "rank_bm25"
    dense_minilm = "dense_minilm"
    dense_faiss = "dense_faiss"
    http = "http"


class FaissIndex(StrEnum):
    """FAISS index structure of `retrieval=dense_faiss` (evidence/dense_faiss.py)."""

    flat = "flat"
    hnsw = "hnsw"
    ivf_pq = "ivf_pq"


class EvalMode(StrEnum):
    """How `coevo.eval` asks the solver (see coevo/evaluate/harness.py)."""

    direct = "direct"
    rag = "rag"
    agent = "agent"


class LogLevel(StrEnum):
    """What the terminal shows; run.log in run.dir always gets every record at DEBUG."""
    info = "info"  # start line, progress bars, one line per step, our warnings, anyone's errors
    debug = "debug"  # also every record run.log gets: libraries, engines (vLLM), Ray


class Untagged(StrEnum):
    """What `coevo.eval` predicts on a format failure."""

    empty = "empty"
    raw = "raw"


class Logger(StrEnum):
    """Where a run's per-step metrics go besides metrics.jsonl."""

    tensorboard = "tensorboard"  # event files in <run.dir>/tensorboard
    wandb = "wandb"  # Weights & Biases (optional package); offline unless WANDB_MODE is set
    none = "none"  # metrics.jsonl only


class Placement(StrEnum):
    """How the actors' placement group lays them out over the cluster's nodes (same on one node)."""

    spread = "spread"  # Ray's SPREAD: across distinct nodes, as evenly as possible
    pack = "pack"  # Ray's PACK: on as few nodes as possible


class Annotation(StrEnum):
    """When the evidence stage runs spaCy over the corpus (evidence/entities.py, evidence/lazy_entities.py)."""

    eager = "eager"  # every passage, before the evidence actor is ready (cached; hours at wiki-18 size)
    lazy = "lazy"  # a passage the first time retrieval reaches it; records shared on disk by every process
