"""Ray actors (SPEC §5.2) and the thin driver-side proxies that make them look local.

Roles live in their own modules (coevo/policy.py, evidence/, solver/); this module only
creates the actors and wires them: one actor per trainable policy, one retrieval actor
(corpus + index), one evidence actor (spaCy + entity index). The proxies expose the same
methods the episode code calls (`generate`, `chat_prompt_ids`, `tokenizer`, `search`,
`corpus[pid]`), so `solver.agent.run_episodes` runs unchanged against remote actors.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import ray
from ray.exceptions import RayActorError, RayTaskError

from coevo.core.config import CoevoConfig, PolicyConfig
from coevo.core.console import WORKER_SETUP_HOOK, route_library_loggers, worker_env
from coevo.core.lifetime import install_stop_handlers
from coevo.core.types import Completion, EvidencePath, SamplingParams, Verdict
from coevo.train.models import resolve_model_path
from coevo.train.policy import Policy
from evidence.corpus import corpus_source, load_corpus
from evidence.pipeline import EvidencePipeline
from evidence.retrieval import build_retriever
from solver.ranker import ranker_policy_config


class ActorFailure(RuntimeError):
    """A Ray actor died or raised; the run stops with this message and keeps its checkpoints."""


def call(ref: Any, what: str) -> Any:
    """`ray.get` that turns actor crashes into one clear `ActorFailure`."""
    try:
        return ray.get(ref)
    except (RayActorError, RayTaskError) as e:
        raise ActorFailure(f"{what} failed in its Ray actor: {e}") from e


def _limit_threads(num_cpus: float) -> None:
    # Each actor gets its share of the cores; torch would otherwise use them all in every actor.
    import torch

    torch.set_num_threads(max(1, int(num_cpus)))


class PolicyWorker:
    """Actor body for one policy: generation and GRPO updates on its own process."""

    def __init__(self, cfg: PolicyConfig, role: str, seed: int) -> None:
        import torch


        _limit_threads(cfg.num_cpus)
        torch.manual_seed(seed)
        self.policy = Policy.from_config(cfg, role)

    def ready(self) -> bool:
        return True

    def info(self) -> dict:
        return {"params": self.policy.num_parameters(), "frozen": self.policy.frozen,
                "device": str(self.policy.device)}

    def chat_prompt_ids(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return [self.policy.chat_prompt_ids(m) for m in messages_batch]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self.policy.generate(prompts, sampling)

    def update(self, batch: list) -> dict:
        return self.policy.update(batch)

    def save(self, directory: str) -> str:
        return str(self.policy.save(directory))

    def load(self, directory: str) -> None:
        self.policy.load(directory)


class RetrievalWorker:
    """Actor body holding the corpus and the first-stage index."""

    def __init__(self, cfg: CoevoConfig) -> None:
        _limit_threads(1)
        self.corpus = load_corpus(corpus_source(cfg.corpus))
        self.retriever = build_retriever(self.corpus, cfg.retrieval)

    def ready(self) -> bool:
        return True

    def info(self) -> dict:
        return {"corpus": self.corpus.name, "passages": len(self.corpus), "hash": self.corpus.content_hash,
                "backend": self.retriever.backend, "build_s": self.retriever.build_s,
                "from_cache": self.retriever.from_cache}

    def search_with_passages(self, queries: list[str], k: int) -> tuple[list[list[Any]], dict[str, Any]]:
        """Hits per query plus the passages they point to (one round trip per batch)."""
        hits = self.retriever.search(queries, k)
        passages = {h.passage_id: self.corpus[h.passage_id] for row in hits for h in row}
        return hits, passages


class EvidenceWorker:
    """Actor body holding spaCy, the entity index and its own retriever (loaded from cache)."""

    def __init__(self, cfg: CoevoConfig, own_process: bool = True) -> None:
        if own_process:  # in the driver (`ray.local=true`) the policies need every thread
            _limit_threads(1)
        corpus = load_corpus(corpus_source(cfg.corpus))
        retriever = build_retriever(corpus, cfg.retrieval)
        self.pipeline = EvidencePipeline.from_config(corpus, retriever, cfg.evidence,
                                                     max_target_chars=cfg.proposer.max_target_chars)

    def ready(self) -> bool:
        return True

    # Verdicts and paths cross the Ray boundary as the dataclasses themselves (Ray pickles
    # them), so the driver never reads them back by key.
    def validate_targets(self, targets: list[str], references: list[str]) -> list[Verdict]:
        return self.pipeline.validate_targets(targets, references)

    def build_paths(self, targets: list[str], seed: int) -> list[list[EvidencePath]]:
        import random

        return self.pipeline.build_paths(targets, random.Random(seed))

    def direct_paths(self, targets: list[str], support_ids: list[list[str]]) -> list[list[EvidencePath]]:
        return self.pipeline.direct_paths(targets, support_ids)

    def validate_questions(self, questions: list[str], targets: list[str],
                           paths: list[EvidencePath]) -> list[Verdict]:
        return self.pipeline.validate_questions(questions, targets, paths)


class RemoteEvidence:
    """Driver-side stand-in for the evidence pipeline's batch methods."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def validate_targets(self, targets: list[str], references: list[str]) -> list[Verdict]:
        return call(self.actor.validate_targets.remote(targets, references), "target validation")

    def build_paths(self, targets: list[str], seed: int) -> list[list[EvidencePath]]:
        return call(self.actor.build_paths.remote(targets, seed), "evidence paths")

    def direct_paths(self, targets: list[str], support_ids: list[list[str]]) -> list[list[EvidencePath]]:
        return call(self.actor.direct_paths.remote(targets, support_ids), "direct evidence")

    def validate_questions(self, questions: list[str], targets: list[str],
                           paths: list[EvidencePath]) -> list[Verdict]:
        return call(self.actor.validate_questions.remote(questions, targets, paths), "question validation")


class RemoteCorpus:
    """Passages the driver has seen so far, filled by `RemoteRetriever.search`."""

    def __init__(self) -> None:
        self.passages: dict[str, Any] = {}

    def __getitem__(self, passage_id: str) -> Any:
        return self.passages[passage_id]


class RemoteRetriever:
    """Driver-side stand-in for a retriever: `search` and `corpus[pid]`, backed by the actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.corpus = RemoteCorpus()

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        hits, passages = call(self.actor.search_with_passages.remote(queries, k), "retrieval")
        self.corpus.passages.update(passages)
        return hits


class RemotePolicy:
    """Driver-side stand-in for a `Policy`: same generation surface, work done in the actor."""

    def __init__(self, actor: Any, cfg: PolicyConfig, role: str) -> None:
        from transformers import AutoTokenizer


        self.actor, self.cfg, self.role = actor, cfg, role
        self.frozen = cfg.frozen
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.checkpoint or resolve_model_path(cfg.model))

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.chat_prompt_ids_batch([messages])[0]

    def chat_prompt_ids_batch(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return call(self.actor.chat_prompt_ids.remote(messages_batch), f"{self.role} prompt")

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return call(self.actor.generate.remote(prompts, sampling), f"{self.role} generate")

    def update(self, batch: list) -> dict:
        return call(self.actor.update.remote(batch), f"{self.role} update")

    def save(self, directory: str) -> str:
        return call(self.actor.save.remote(str(directory)), f"{self.role} save")

    def load(self, directory: str) -> None:
        call(self.actor.load.remote(str(directory)), f"{self.role} load")


@dataclass
class Actors:
    """Every actor of a run plus the driver-side proxies the loop uses."""

    proposer: Optional[RemotePolicy]  # None in `coevo.solve` (labelled questions, no proposer)
    solver: RemotePolicy
    ranker: Optional[RemotePolicy]  # None when ranker.mode is none/oracle; the solver's when shared
    retrieval: RemoteRetriever
    evidence: Optional[RemoteEvidence]  # None in `coevo.solve`
    trainable: dict[str, RemotePolicy]  # role -> policy whose weights change and are checkpointed


def _policy_actor(cfg: PolicyConfig, role: str, seed: int) -> RemotePolicy:
    opts = {"num_cpus": cfg.num_cpus, "num_gpus": cfg.num_gpus, "name": None}
    actor = ray.remote(PolicyWorker).options(**{k: v for k, v in opts.items() if v is not None}).remote(cfg, role, seed)
    return RemotePolicy(actor, cfg, role)


def init_ray(cfg: CoevoConfig) -> None:
    """Join `ray.address` or start a local cluster; the repo is importable in every worker.

    Logging (coevo/core/console.py): each worker first runs `setup_worker_logging`, which sends
    its output to run.log; Ray still forwards worker stderr to the driver (`log_to_driver`), which
    then carries only build progress (everything with log.level=debug). Ray's own driver-side
    records go to run.log, and a hub found unreachable by the preflight stays offline in workers.
    """
    if ray.is_initialized():
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        "TOKENIZERS_PARALLELISM": "false",
                        # Ray SIGKILLs an exiting worker's children, multiprocessing's resource tracker
                        # among them, and the engines' shared memory (~160 MB each) stays in /dev/shm;
                        # the actors' reapers end those children instead (coevo/core/lifetime.py).
                        "RAY_kill_child_processes_on_worker_exit": "0",
                        **worker_env(),
                        **{k: os.environ[k] for k in ("HF_HUB_OFFLINE",) if k in os.environ}},
           "worker_process_setup_hook": WORKER_SETUP_HOOK}
    kwargs: dict[str, Any] = {"runtime_env": env, "include_dashboard": False, "log_to_driver": True,
                              "configure_logging": False}
    if cfg.ray.address:
        kwargs["address"] = cfg.ray.address
    else:
        # Policies declare their CPU share; a local cluster must admit all actors even on 2 cores.
        need = math.ceil(sum(getattr(cfg, r).num_cpus for r in ("proposer", "solver", "ranker")) + 2)
        if cfg.ray.num_cpus is not None and cfg.ray.num_cpus < need:
            raise ValueError(f"config key ray.num_cpus={cfg.ray.num_cpus} is too small: the actors request {need} "
                             "CPUs (proposer/solver/ranker num_cpus + retrieval + evidence)")
        kwargs["num_cpus"] = cfg.ray.num_cpus or max(need, os.cpu_count() or 1)
    ray.init(**kwargs)
    route_library_loggers()  # ray.init's own records (cluster started, ...) to run.log, not the terminal
    install_stop_handlers()  # ray.init replaced our SIGTERM handler with one that aborts the driver


def create_actors(cfg: CoevoConfig) -> Actors:
    """Start every actor the configuration needs and return the wired proxies."""
    init_ray(cfg)
    proposer = _policy_actor(cfg.proposer, "proposer", cfg.seed + 1)
    solver = _policy_actor(cfg.solver, "solver", cfg.seed + 2)
    ranker: Optional[RemotePolicy] = None
    if cfg.ranker.mode in ("trainable", "frozen"):
        # mode=frozen already set ranker.frozen (coevo.core.config.resolve_frozen): never trained. None:
        # the solver's own object (shared backbone); frozen + shared: a frozen copy of the solver's start.
        own = ranker_policy_config(cfg.ranker, cfg.solver)
        ranker = solver if own is None else _policy_actor(own, "ranker", cfg.seed + 3)
    retrieval = RemoteRetriever(ray.remote(RetrievalWorker).options(num_cpus=1).remote(cfg))
    evidence = RemoteEvidence(ray.remote(EvidenceWorker).options(num_cpus=1).remote(cfg))
    trainable = {r: p for r, p in (("proposer", proposer), ("solver", solver)) if not p.frozen}
    if ranker is not None and ranker is not solver and not ranker.frozen:
        trainable["ranker"] = ranker
    handles = {"proposer": proposer.actor, "solver": solver.actor, "retrieval": retrieval.actor,
               "evidence": evidence.actor, **({"ranker": ranker.actor} if ranker is not None else {})}
    wait_until_ready(handles, cfg.ray.ready_timeout_s)
    return Actors(proposer, solver, ranker, retrieval, evidence, trainable)


def wait_until_ready(handles: dict[str, Any], timeout_s: float) -> None:
    """Fail clearly when an actor cannot start or cannot be scheduled (instead of hanging)."""
    refs = {name: h.ready.remote() for name, h in handles.items()}
    done, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    for name, ref in refs.items():
        if ref in done:
            call(ref, f"{name} start-up")
    if pending:
        late = [n for n, r in refs.items() if r in pending]
        raise ActorFailure(f"actors {late} did not start within ray.ready_timeout_s={timeout_s}s; the cluster may lack "
                           f"the CPUs/GPUs they request ({ray.available_resources()} available)")


def create_local_actors(cfg: CoevoConfig, with_proposer: bool = True) -> Actors:
    """The same wiring in one process, without Ray (tests and debugging; `ray.local=true`).

    `with_proposer=False` (`coevo.solve`) loads neither the proposer nor the evidence stage.
    """
    proposer = Policy.from_config(cfg.proposer, "proposer") if with_proposer else None
    solver = Policy.from_config(cfg.solver, "solver")
    ranker = None
    if cfg.ranker.mode in ("trainable", "frozen"):
        own = ranker_policy_config(cfg.ranker, cfg.solver)  # None: shares the solver's object
        ranker = solver if own is None else Policy.from_config(own, "ranker")
    retriever = build_retriever(load_corpus(corpus_source(cfg.corpus)), cfg.retrieval)
    trainable = {r: p for r, p in (("proposer", proposer), ("solver", solver)) if p is not None and not p.frozen}
    if ranker is not None and ranker is not solver and not ranker.frozen:
        trainable["ranker"] = ranker
    evidence = EvidenceWorker(cfg, own_process=False) if with_proposer else None
    return Actors(proposer, solver, ranker, retriever, evidence, trainable)  # type: ignore[arg-type]
