"""Valid range of every numeric config key, checked before a run loads anything.

One table beside the schema (coevo/core/config.py), keyed by schema class and field; a
subclass inherits its bases' entries (ProposerConfig gets PolicyConfig's `lr`). Rules that
involve several keys (`ranker.top_k <= ranker.n_candidates`, `group_size >= 2` for a trained
role) live in `config.validate_config`. tests/coevo/core/test_ranges.py walks the schema and
fails on any numeric field without an entry here, so a new field cannot skip its check.

Every value must also be finite: `inf` and `nan` parse as floats but are never a setting.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval; None leaves that side unbounded."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False  # the bound `low` itself is outside the range
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self, name: str) -> str:
        """The range as a condition on `name`: `top_p` → "0 < top_p <= 1", `steps` → "steps >= 1"."""
        low = "" if self.low is None else f"{_num(self.low)} {'<' if self.low_open else '<='} "
        high = "" if self.high is None else f" {'<' if self.high_open else '<='} {_num(self.high)}"
        if low and not high:  # one-sided: the key first reads better ("steps >= 1")
            return f"{name} {'>' if self.low_open else '>='} {_num(self.low)}"
        return f"{low}{name}{high}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


AT_LEAST_1 = Range(1)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
UNIT = Range(0, 1)  # a share or threshold in [0, 1]
FRACTION = Range(0, 1, low_open=True)  # 0 < x <= 1

# Schema class name -> field -> range. Names, not classes: config.py imports this module.
RANGES: dict[str, dict[str, Range]] = {
    "PolicyConfig": {
        "lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE, "kl_coef": NON_NEGATIVE,
        "clip_eps": POSITIVE,  # 0 clips every ratio: no gradient at all
        "grad_clip": NON_NEGATIVE,  # 0 = no clipping
        "micro_batch_size": AT_LEAST_1, "ppo_epochs": AT_LEAST_1,
        "generation_rows": NON_NEGATIVE,  # 0 = every row in one generate call
        "temperature": NON_NEGATIVE,  # 0 = greedy
        "top_p": FRACTION, "max_new_tokens": AT_LEAST_1, "max_prompt_tokens": AT_LEAST_1,
        "num_cpus": NON_NEGATIVE, "num_gpus": NON_NEGATIVE, "gpu_memory_utilization": FRACTION,
    },
    "ProposerConfig": {
        "group_size": AT_LEAST_1,  # >= 2 when the proposer trains (validate_config)
        "invalid_penalty": NON_NEGATIVE, "max_target_chars": AT_LEAST_1, "questions_per_step": AT_LEAST_1,
        "grounding": NON_NEGATIVE,  # 0 = off (ZEST's prompt)
    },
    "CurriculumConfig": {"window": AT_LEAST_1, "up": UNIT, "down": UNIT},  # and down < up (validate_config)
    "SolverRewardConfig": {"tool_cost": NON_NEGATIVE, "format_penalty": NON_NEGATIVE},
    "SolverConfig": {
        "group_size": AT_LEAST_1,  # >= 2 when the solver trains (validate_config)
        "max_searches": AT_LEAST_1, "max_turns": AT_LEAST_1, "max_episode_tokens": AT_LEAST_1,
    },
    "RankerConfig": {
        "n_candidates": AT_LEAST_1, "top_k": AT_LEAST_1,  # and top_k <= n_candidates (validate_config)
        "passage_chars": AT_LEAST_1, "group_f1": UNIT, "min_group_size": AT_LEAST_1, "gamma": UNIT,
        "format_penalty": NON_NEGATIVE,
    },
    "EvidenceConfig": {"max_hops": AT_LEAST_1, "branching": AT_LEAST_1, "retrieve_k": AT_LEAST_1,
                       "max_question_chars": AT_LEAST_1, "retrievable_k": AT_LEAST_1,
                       "build_in_run_max_passages": NON_NEGATIVE,
                       "shard_passages": AT_LEAST_1, "build_workers": AT_LEAST_1, "stats_sample": AT_LEAST_1},
    "RetrievalConfig": {
        "encode_batch_size": AT_LEAST_1, "hnsw_m": Range(2), "hnsw_ef_construction": AT_LEAST_1,
        "hnsw_ef_search": AT_LEAST_1, "ivf_nlist": AT_LEAST_1, "ivf_nprobe": AT_LEAST_1, "pq_m": AT_LEAST_1,
        "pq_bits": Range(1, 16),  # FAISS's PQ codes hold at most 16 bits
        "timeout_s": POSITIVE, "retries": NON_NEGATIVE, "backoff_s": NON_NEGATIVE, "replicas": AT_LEAST_1,
    },
    "LoraConfig": {"rank": NON_NEGATIVE, "alpha": POSITIVE},  # rank 0 = full fine-tuning
    "ClusterConfig": {"nodes": AT_LEAST_1, "gpus_per_node": AT_LEAST_1, "gpu_memory_gb": POSITIVE},
    "RunConfig": {"steps": AT_LEAST_1, "save_every": AT_LEAST_1},
    "RayConfig": {"num_cpus": AT_LEAST_1, "ready_timeout_s": POSITIVE, "report_pending_s": POSITIVE},
    "CoevoConfig": {"seed": NON_NEGATIVE},
    "SolveConfig": {"limit": AT_LEAST_1, "steps": AT_LEAST_1, "batch_questions": AT_LEAST_1},
    "EvalRootConfig": {"limit": AT_LEAST_1, "batch_size": AT_LEAST_1},
}


def range_of(schema: type, name: str) -> Optional[Range]:
    """The declared range of field `name` of `schema` (or of the nearest base class declaring it)."""
    for cls in schema.__mro__:
        found = RANGES.get(cls.__name__, {}).get(name)
        if found is not None:
            return found
    return None


def check_ranges(node: Any, prefix: str = "") -> None:
    """Raise ValueError naming key, value and valid range for the first numeric value out of range.

    `node` is a typed config (a dataclass instance); nested blocks are walked; None (an unset
    optional key) is not checked.
    """
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, key + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            valid = range_of(type(node), f.name)
            if valid is None:  # a schema change without its range: a bug, never a silent pass
                raise LookupError(f"config key {key} has no valid range declared in coevo/core/ranges.py RANGES")
            if value not in valid:
                finite = "" if math.isfinite(value) else "a finite "
                raise ValueError(f"config key {key}={value} is out of range: expected {finite}{valid.describe(f.name)}")
