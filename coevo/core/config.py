"""Typed configuration: the schemas Hydra composes `configs/` into, for all three roots.

Every field is one `key(default, doc, range)` line (coevo/core/ranges.py): its type, default, one line
of documentation (`--help` prints it: coevo/core/schema.py) and, for a number, its valid range.
A key the schema does not know fails with the closest known key (with `+` too), a wrong type
or a value outside an enumeration with an error naming the key (and, for an enumeration, the
valid choices); `to_object` then checks every numeric key against its range. The roots are
`CoevoConfig` (`python -m coevo.run`), `SolveRootConfig` (`coevo.solve`) and
`EvalRootConfig` (`coevo.eval`); the last two are the coevo root plus their own keys.

The enumerated field types live in coevo/core/choices.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from coevo.core.choices import (
    DType,
    Engine,
    EvalMode,
    Logger,
    LogLevel,
    PathLength,
    Placement,
    ProposerGeneration,
    RankerMode,
    Untagged,
    WeightSync,
    path_length,
)
from coevo.core.data_config import (  # noqa: F401  (re-exported: the data schemas are part of this config)
    CorpusConfig,
    EvidenceConfig,
    FaissConfig,
    HttpConfig,
    RetrievalConfig,
)
from coevo.core.ranges import AT_LEAST_1, NON_NEGATIVE, POSITIVE, block, check_ranges, key
from coevo.core.role_config import (  # noqa: F401  (re-exported: the role schemas are part of this config)
    LoraConfig,
    PolicyConfig,
    ProposerConfig,
    RankerConfig,
    SolverConfig,
    SolverRewardConfig,
    check_extraction_mix,
)
from coevo.core.schema import check_known_keys, check_override_keys, config_groups


@dataclass
class RolloutConfig:
    """Generation engine shared by all policies unless a policy overrides it."""

    engine: Engine = key(Engine.auto, "auto (vllm for a role with num_gpus > 0, hf on the CPU) | hf | vllm")
    vllm_enforce_eager: Optional[bool] = key(
        None, "skip CUDA graph capture; None: true on the CPU build of vLLM, false on CUDA (graphs decode 2-3x faster)")


@dataclass
class RunConfig:
    """Where a run writes and how long it lasts."""

    dir: str = key("runs/${now:%Y%m%d-%H%M%S}", "run directory (tasks/, metrics.jsonl, checkpoints/)")
    steps: int = key(2, "co-evolution steps", AT_LEAST_1)
    save_every: Optional[int] = key(
        None, "checkpoint period in steps (and always at the end); None: 10 with a GPU role, else 1", AT_LEAST_1)
    reference_questions: Optional[str] = key(None, "file of reference questions (default: bundled)")
    memory_check: bool = key(True, "refuse to start when the peak RAM estimate exceeds MemAvailable (train/memory.py)")
    plan_check: bool = key(
        True, "with GPU roles: refuse to start when coevo.plan says a role does not fit (train/gpu_plan.py)")
    overwrite: bool = key(
        False, "delete what a non-empty run.dir holds and start over (without it: refused unless resume)")
    logger: Logger = key(Logger.tensorboard, "metrics also go to: tensorboard | wandb | none")
    wandb_project: str = key("coevo", "Weights & Biases project of run.logger=wandb (run name: run.dir's name)")


@dataclass
class RayConfig:
    """Ray cluster connection."""

    address: Optional[str] = key(None, "join this cluster; None starts a local one")
    num_cpus: Optional[int] = key(None, "CPUs of the local cluster (None = all)", AT_LEAST_1)
    local: bool = key(False, "run every role in the driver process without Ray (debugging, tests)")
    ready_timeout_s: float = key(
        1800.0, "actors not started by then (e.g. waiting on busy nodes) stop the run", POSITIVE)
    report_pending_s: float = key(
        5.0, "first report of actors still pending (requests, free resources); then 2x apart", POSITIVE)
    placement: Placement = key(Placement.spread, "actors over nodes: spread (Ray SPREAD, even) | pack (fewest nodes)")


@dataclass
class ClusterConfig:
    """The GPU hardware `coevo.plan` (and the check before a run) sizes each role against."""

    nodes: int = key(1, "nodes of the cluster", AT_LEAST_1)
    gpus_per_node: int = key(8, "GPUs per node", AT_LEAST_1)
    gpu_memory_gb: float = key(
        80.0, "memory of one GPU in GB (10^9 bytes): 80 for an H100/A100-80GB, 141 for an H200", POSITIVE)
    collective_timeout_s: float = key(
        1800.0, "seconds a sharded role's collective may wait before failing: a step's collectives and a checkpoint "
        "write must fit", POSITIVE)


@dataclass
class LogConfig:
    """Terminal output of every entry point (coevo/core/console.py)."""
    level: LogLevel = key(LogLevel.info, "terminal: info (progress, one line per step) | debug (also engine/Ray logs)")


@dataclass
class CoevoConfig:
    """Root config of `python -m coevo.run`."""

    proposer: ProposerConfig = block(ProposerConfig)
    solver: SolverConfig = block(SolverConfig)
    ranker: RankerConfig = block(RankerConfig)
    corpus: CorpusConfig = block(CorpusConfig)
    retrieval: RetrievalConfig = block(RetrievalConfig)
    rollout: RolloutConfig = block(RolloutConfig)
    evidence: EvidenceConfig = block(EvidenceConfig)
    run: RunConfig = block(RunConfig)
    ray: RayConfig = block(RayConfig)
    cluster: ClusterConfig = block(ClusterConfig)
    log: LogConfig = block(LogConfig)
    seed: int = key(0, "seeds python, numpy and torch", NON_NEGATIVE)
    resume: bool = key(False, "continue from the latest complete checkpoint in run.dir")
    dry_run: bool = key(False, "resolve and load the stack, print a summary, exit")
    experiment_name: str = key("default", "label stored with the run")


@dataclass
class SolveConfig:
    """The `solve:` block of `coevo.solve`: which labelled questions, how many steps, whether to train."""

    data: str = key("${oc.env:COEVO_SHARED_DATA,../shared/data}/wiki_mini/questions_dev.jsonl", "labelled JSONL")
    limit: Optional[int] = key(None, "use only the first `limit` questions of the file", AT_LEAST_1)
    steps: int = key(2, "training steps (one question batch each)", AT_LEAST_1)
    batch_questions: int = key(4, "questions per step (each gets solver.group_size rollouts)", AT_LEAST_1)
    train: bool = key(True, "run GRPO updates (false: rollouts and metrics only)")
    shuffle: bool = key(True, "visit questions in a seeded random order")


@dataclass
class SolveRootConfig(CoevoConfig):
    """Root config of `python -m coevo.solve`: the coevo root plus `solve`."""

    solve: SolveConfig = block(SolveConfig)


@dataclass
class EvalRootConfig(CoevoConfig):
    """Root config of `python -m coevo.eval`: the coevo root plus these top-level eval keys."""

    data: str = key("${oc.env:COEVO_SHARED_DATA,../shared/data}/benchmarks/dev.jsonl", "JSONL questions")
    mode: EvalMode = key(EvalMode.agent, "direct | rag | agent")
    out: str = key("runs/eval/${mode}-${now:%Y%m%d-%H%M%S}.json", "result JSON (written atomically)")
    limit: Optional[int] = key(None, "first `limit` questions of EACH dataset (None: all)", AT_LEAST_1)
    batch_size: int = key(
        16, "prompts per generate call (direct/rag: length-sorted; agent: episodes in lockstep)", AT_LEAST_1)
    greedy: bool = key(True, "temperature 0; false samples with the solver's temperature/top_p and `seed`")
    untagged: Untagged = key(
        Untagged.empty, 'a format failure predicts: empty ("", scores 0) | raw (text, tags removed)')


# Hydra config name of each root's schema (the first entry of configs/<root>.yaml's defaults).
SCHEMAS: dict[str, type[CoevoConfig]] = {
    "coevo_schema": CoevoConfig, "solve_schema": SolveRootConfig, "eval_schema": EvalRootConfig,
}


def validate_config(cfg: CoevoConfig) -> None:
    """Check every numeric key against the range on its field, then the rules across keys.

    Call after `resolve_frozen`: whether a role trains decides its minimum group size.
    """
    check_ranges(cfg)
    if cfg.ranker.line_stop and cfg.ranker.reasoning:
        raise ValueError("config key ranker.line_stop=true needs ranker.reasoning=false (a reason block spans lines)")
    if cfg.ranker.top_k > cfg.ranker.n_candidates:
        raise ValueError(f"config key ranker.top_k={cfg.ranker.top_k} exceeds ranker.n_candidates="
                         f"{cfg.ranker.n_candidates}; expected top_k <= n_candidates")
    check_budgets(cfg)
    check_path_length(cfg)
    check_precision(cfg)
    check_lora(cfg)
    for role in ("proposer", "solver", "ranker"):
        policy = getattr(cfg, role)
        if policy.cpu_compile and not policy.frozen:
            compile_needs_no_cache(role, policy.shared_prompt and not policy.gradient_checkpointing)
    solve = getattr(cfg, "solve", None)  # coevo.solve trains no proposer (solve.train=false: nothing, frozen)
    check_extraction_mix(cfg.solver, in_solve=solve is not None)
    trained = {"proposer": solve is None and not cfg.proposer.frozen, "solver": not cfg.solver.frozen}
    for role in ("proposer", "solver"):
        size = getattr(cfg, role).group_size
        if trained[role] and size < 2:
            raise ValueError(f"config key {role}.group_size={size} is out of range for a trained {role}: expected "
                             f"group_size >= 2 (the GRPO advantage of a group of one is 0, nothing learns); "
                             f"or set {role}.frozen=true")


def check_budgets(cfg: CoevoConfig) -> None:
    """Token budgets that hold together (coevo/core/budget.py): no prompt is ever cut.

    Every solver turn's prompt is the episode so far, so the solver's prompt budget must hold
    its longest episode; the ranker and proposer prompts are checked as they are built.
    """
    solver = cfg.solver
    if solver.max_prompt_tokens < solver.max_episode_tokens:
        raise ValueError(f"config key solver.max_prompt_tokens={solver.max_prompt_tokens} is below "
                         f"solver.max_episode_tokens={solver.max_episode_tokens}: every turn's prompt is the episode "
                         "so far; expected solver.max_prompt_tokens >= solver.max_episode_tokens")


def check_path_length(cfg: CoevoConfig) -> None:
    """`evidence.hops` parses, and the hop curriculum (which sets it each step) has one meaning per key."""
    hops, curriculum = path_length(cfg.evidence.hops, cfg.evidence.max_hops), cfg.proposer.curriculum
    if curriculum.down >= curriculum.up:
        raise ValueError(f"config key proposer.curriculum.down={curriculum.down} is not below proposer.curriculum.up="
                         f"{curriculum.up}: a window could call for both moves; expected down < up")
    if not curriculum.enabled:
        return
    if hops != PathLength.longest:
        raise ValueError(f"config key evidence.hops={cfg.evidence.hops} with proposer.curriculum.enabled=true: the "
                         "curriculum's level is each step's path length; leave evidence.hops=longest")
    if cfg.proposer.generation == ProposerGeneration.direct:
        raise ValueError("config key proposer.curriculum.enabled=true with proposer.generation=direct: a direct "
                         "path has one hop, so every level above 1 would reject every candidate")


def check_precision(cfg: CoevoConfig) -> None:
    """A trainable policy holds fp32 master weights (coevo/train/precision.py says why): bf16/fp16 ones are refused."""
    trained = {"solver": cfg.solver, "ranker": cfg.ranker} if not cfg.ranker.share_backbone else {"solver": cfg.solver}
    if getattr(cfg, "solve", None) is None:  # coevo.solve loads no proposer
        trained["proposer"] = cfg.proposer
    for role, policy in trained.items():
        if role == "ranker" and cfg.ranker.mode != RankerMode.trainable:
            continue  # no model (none, oracle) or a frozen one
        if policy.frozen or policy.dtype == DType.float32:
            continue
        # With LoRA the base is never stepped: it may be bf16; the adapter alone keeps fp32 weights.
        if policy.lora.rank > 0 and policy.dtype == DType.bfloat16:
            continue
        raise ValueError(f"config key {role}.dtype={policy.dtype}: a trainable {role} keeps fp32 master weights "
                         f"and optimizer state (at lr 1e-6 bf16 weights barely move); expected {role}.dtype="
                         f"float32 (compute runs in bf16 under autocast on CUDA), {role}.dtype=bfloat16 with "
                         f"{role}.lora.rank > 0 (a frozen bf16 base under an fp32 adapter) or {role}.frozen=true")


def compile_needs_no_cache(role: str, shared_prompt: bool) -> None:
    """`<role>.cpu_compile` is refused for an update that shares a prompt's KV cache (coevo/train/compiled.py)."""
    if shared_prompt:
        raise ValueError(f"config key {role}.cpu_compile=true: the update shares each group's prompt through a KV "
                         f"cache, which recompiles every decoder layer; expected {role}.gradient_checkpointing=true "
                         f"or {role}.shared_prompt=false")


def check_lora(cfg: CoevoConfig) -> None:
    """`ranker.share_backbone=true` trains the solver's weights with the ranker's calls: no LoRA on either.

    A shared backbone under one adapter would make `ranker.lora` a second, ignored description
    of the solver's adapter; refusing keeps one meaning per key. Frozen roles ignore `lora`
    (evaluation freezes all), and ranker modes none/oracle use no backbone.
    """
    if not cfg.ranker.share_backbone or not cfg.ranker.has_model:
        return
    for role in ("solver", "ranker"):
        policy = getattr(cfg, role)
        rank = policy.lora.rank
        if rank > 0 and not policy.frozen:
            raise ValueError(f"config key {role}.lora.rank={rank} with ranker.share_backbone=true: a shared backbone "
                             "trains full weights only; set ranker.share_backbone=false (each role its own adapter) "
                             f"or {role}.lora.rank=0")


def resolve_frozen(cfg: CoevoConfig) -> None:
    """Mark every policy that is never updated `frozen` (loaded without optimizer or reference copy).

    This is the one place that decides it: ranker.mode=frozen (the fixed-ranker baseline)
    freezes the ranker, `coevo.solve solve.train=false` the solver and the ranker, and evaluation
    every policy.
    """
    if cfg.ranker.mode == RankerMode.frozen:
        cfg.ranker.frozen = True
    if isinstance(cfg, SolveRootConfig) and not cfg.solve.train:
        cfg.solver.frozen = cfg.ranker.frozen = True
    if isinstance(cfg, EvalRootConfig):
        for policy in (cfg.proposer, cfg.solver, cfg.ranker):
            policy.frozen = True


def gpus_asked(asks: list[float]) -> int:
    """GPUs that roles asking `asks` GPUs take together: whole GPUs for asks >= 1, fractional shares summed."""
    whole = sum(math.ceil(a) for a in asks if a >= 1)
    return whole + math.ceil(sum(a for a in asks if 0 < a < 1) - 1e-9)


def loads_proposer(cfg: CoevoConfig) -> bool:
    """Whether the root's command loads a proposer (`coevo.solve` and `coevo.eval` do not)."""
    return not isinstance(cfg, (SolveRootConfig, EvalRootConfig))


def auto_ranker_gpus(cfg: CoevoConfig) -> float:
    """`ranker.num_gpus` when unset: the whole GPUs `cluster.nodes x cluster.gpus_per_node` has left after the
    other loaded roles, when they ask for GPUs (else 0: a CPU run stays one); at most one per solver GPU (the
    ranker's calls come from the solver's episodes: data-parallel, each of its ranks serves a share) and one
    where it cannot be sharded (frozen, LoRA, `weight_sync=ipc`: coevo/train/sharded.py). A ranker without
    a model of its own (modes none and oracle, `share_backbone`) is not placed."""
    ranker = cfg.ranker
    if not ranker.has_model or ranker.share_backbone:
        return 0.0
    asks = [p.num_gpus for p in ([cfg.proposer] if loads_proposer(cfg) else []) + [cfg.solver] if p.num_gpus > 0]
    if not asks:
        return 0.0
    free = cfg.cluster.nodes * cfg.cluster.gpus_per_node - gpus_asked(asks)
    shardable = not ranker.frozen and ranker.lora.rank == 0 and ranker.weight_sync != WeightSync.ipc
    return float(max(0, min(free, max(1, math.ceil(cfg.solver.num_gpus)) if shardable else 1)))


def resolve_placement(cfg: CoevoConfig) -> None:
    """Decide an unset `ranker.num_gpus` (`auto_ranker_gpus`), then every `<role>.engine=auto`: vllm for a role
    with num_gpus > 0, hf otherwise.

    The one place that decides them, at validation (`to_object`), so the GPU plan, the memory estimate, the
    checks and the actors all read the decided values; coevo/train/preflight.py says them at start. The rule
    reads the config alone: a role on a GPU runs only where torch and vLLM are GPU builds (preflight refuses
    it elsewhere), so `coevo.plan` on a CPU machine plans what the GPU node runs, and a CPU run (no role on a
    GPU) keeps HF and the CPU. `rollout.engine` itself stays `auto`: it is what the user chose.
    """
    if cfg.ranker.num_gpus is None:
        cfg.ranker.num_gpus = auto_ranker_gpus(cfg)
    for policy in (cfg.proposer, cfg.solver, cfg.ranker):
        if policy.engine == Engine.auto:
            policy.engine = Engine.vllm if policy.num_gpus > 0 else Engine.hf


def to_object(cfg: DictConfig, schema: type[CoevoConfig] = CoevoConfig) -> CoevoConfig:
    """Turn a composed DictConfig into the typed root `schema` (interpolations resolved), validated, with the
    frozen roles (`resolve_frozen`), the ranker's GPUs and the engines (`resolve_placement`) decided."""
    check_known_keys(cfg, schema)
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    assert isinstance(obj, schema)
    resolve_frozen(obj)
    resolve_placement(obj)  # after resolve_frozen: a frozen ranker is not sharded
    validate_config(obj)
    return obj


CONFIG_DIR = str(Path(__file__).resolve().parent.parent.parent / "configs")


def register_schema() -> None:
    """Register the typed roots (`coevo_schema`, `solve_schema`, `eval_schema`) for the defaults lists."""
    from hydra.core.config_store import ConfigStore

    for name, schema in SCHEMAS.items():
        ConfigStore.instance().store(name=name, node=schema)


def compose(overrides: list[str] | None = None, config_name: str = "coevo",
            return_hydra_config: bool = False) -> DictConfig:
    """Compose the Hydra config outside `@hydra.main` (tests, notebooks, benchmarks, the CLI's checks).

    A key the schema does not know (`ranker.topk=5`, `+ranker.topk=5`) or a value it rejects
    (`ranker.mode=best`) raises ValueError naming the key and the closest key or the choices.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import ValidationError

    schema = SCHEMAS[f"{config_name}_schema"]
    check_override_keys(list(overrides or []), schema, config_groups(CONFIG_DIR))
    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        try:
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides or []),
                                return_hydra_config=return_hydra_config)
        except ConfigCompositionException as e:
            # Hydra's own message names only the override; its cause holds the key and the choices.
            if isinstance(e.__cause__, ValidationError):
                raise ValueError(f"{e}: {e.__cause__}") from e
            raise
    check_known_keys(cfg, schema)
    return cfg
