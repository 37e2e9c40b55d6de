"""Ray actors (SPEC §5.2) and the thin driver-side proxies that make them look local.

Roles live in their own modules (coevo/policy.py, evidence/, solver/); this module only
creates the actors and wires them: one actor per trainable policy, one retrieval actor
(corpus + index), one evidence actor (spaCy + entity index). A policy with `num_gpus = n > 1`
is a group of n worker actors, one GPU each, sharing one torch.distributed process group
(coevo/train/sharded.py), behind a proxy with the single actor's interface (`RemoteShardedPolicy`).
The proxies expose the same methods the episode code calls (`generate`, `chat_prompt_ids`, `tokenizer`, `search`,
`corpus[pid]`), so `solver.agent.run_episodes` runs unchanged against remote actors.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Optional

import ray
from ray.exceptions import RayActorError, RayTaskError

from coevo.core.config import CoevoConfig, PolicyConfig
from coevo.core.types import Completion, EvidencePath, SamplingParams, Verdict
from coevo.orchestrate.cluster import (  # noqa: F401  init_ray: imported from here by tests and tools
    ActorFailure,
    check_schedulable,
    init_ray,
    placement_options,
    request_of,
    wait_until_ready,
)
from coevo.orchestrate.hostpaths import HostPathError, Need, check_host_paths, for_workers, needs
from coevo.train.models import resolve_model_path
from coevo.train.policy import Policy
from coevo.train.sharded import ShardedPolicy, shard_count
from evidence.corpus import corpus_source, load_corpus
from evidence.pipeline import EvidencePipeline
from evidence.retrieval import build_retriever
from solver.ranker import ranker_policy_config


def call(ref: Any, what: str) -> Any:
    """`ray.get` that turns actor crashes into one clear `ActorFailure`.

    A path an actor's node lacks (`HostPathError`, raised as it starts) is reported by its own
    message, without Ray's traceback around it.
    """
    try:
        return ray.get(ref)
    except (RayActorError, RayTaskError) as e:
        marker = f"{HostPathError.__name__}: "
        text = str(e)
        if marker in text:
            raise ActorFailure(text.split(marker, 1)[1].splitlines()[0]) from e
        raise ActorFailure(f"{what} failed in its Ray actor: {e}") from e


def where() -> dict:
    """Where this actor runs: the placement record of run.log and config.yaml."""
    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


def _limit_threads(num_cpus: float) -> None:
    # Each actor gets its share of the cores; torch would otherwise use them all in every actor.
    import torch

    torch.set_num_threads(max(1, int(num_cpus)))


class PolicyWorker:
    """Actor body for one policy: generation and GRPO updates on its own process."""

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, wanted: tuple[Need, ...] = ()) -> None:
        import torch

        check_host_paths(role, list(wanted))  # before anything loads: a missing path names node and key
        _limit_threads(cfg.num_cpus)
        torch.manual_seed(seed)
        self.policy = Policy.from_config(cfg, role)

    def ready(self) -> dict:
        return where()

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


class ShardedWorker:
    """Actor body for one rank of a sharded policy (`RemoteShardedPolicy`): built in two steps,
    because every rank must be alive before any of them can join the process group."""

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, rank: int, world: int,
                 wanted: tuple[Need, ...] = ()) -> None:
        import torch

        check_host_paths(role, list(wanted))
        _limit_threads(max(1.0, cfg.num_cpus / world))
        torch.manual_seed(seed)  # the same on every rank: the ranks must start from the same weights
        self.cfg, self.role, self.rank, self.world = cfg, role, rank, world
        self.policy: Optional[ShardedPolicy] = None

    def ready(self) -> dict:
        return where()

    def endpoint(self) -> tuple[str, int]:
        """Rank 0's address and a free port on it: where the process group meets."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def setup(self, address: str, port: int, backend: str) -> dict:
        """Join the process group (every rank at once), then load and shard the policy."""
        import torch.distributed as dist

        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=self.rank,
                                world_size=self.world)
        self.policy = ShardedPolicy.from_config(self.cfg, self.role)
        return self.info()

    def _policy(self) -> ShardedPolicy:
        if self.policy is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: setup() has not run")
        return self.policy

    def info(self) -> dict:
        policy = self._policy()
        return {"params": policy.num_parameters(), "frozen": policy.frozen, "device": str(policy.policy.device),
                "rank": self.rank, "world": self.world}

    def chat_prompt_ids(self, messages_batch: list[list[dict]]) -> list[list[int]]:
        return [self._policy().chat_prompt_ids(m) for m in messages_batch]

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        return self._policy().generate(prompts, sampling)

    def update(self, batch: list) -> dict:
        return self._policy().update(batch)

    def save(self, directory: str) -> str:
        return str(self._policy().save(directory))

    def load(self, directory: str) -> None:
        self._policy().load(directory)


class RetrievalWorker:
    """Actor body holding the corpus and the first-stage index."""

    def __init__(self, cfg: CoevoConfig) -> None:
        check_host_paths("retrieval", needs(cfg, "retrieval"))  # it only runs as an actor
        _limit_threads(1)
        self.corpus = load_corpus(corpus_source(cfg.corpus))
        self.retriever = build_retriever(self.corpus, cfg.retrieval)

    def ready(self) -> dict:
        return where()

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
            check_host_paths("evidence", needs(cfg, "evidence"))
            _limit_threads(1)
        corpus = load_corpus(corpus_source(cfg.corpus))
        retriever = build_retriever(corpus, cfg.retrieval)
        self.pipeline = EvidencePipeline.from_config(corpus, retriever, cfg.evidence,
                                                     max_target_chars=cfg.proposer.max_target_chars)

    def ready(self) -> dict:
        return where()

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

    # Absolute: the actor's working directory (on another node) is not the driver's.
    def save(self, directory: str) -> str:
        return call(self.actor.save.remote(os.path.abspath(directory)), f"{self.role} save")

    def load(self, directory: str) -> None:
        call(self.actor.load.remote(os.path.abspath(directory)), f"{self.role} load")


def gather(refs: list[Any], what: str) -> list[Any]:
    """Every result of `refs`, failing at the first that fails: the other ranks of a sharded
    policy may then wait forever in a collective, so waiting for all of them in order would hang."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            call(ref, what)
    return [call(ref, what) for ref in refs]


class RemoteShardedPolicy(RemotePolicy):
    """Driver-side stand-in for a sharded policy: `RemotePolicy`'s interface over one worker per rank.

    `update`, `save` and `load` go to every rank (they are collectives; the batch is put in the
    object store once); generation and prompts go to rank 0, which generates with its own copy
    of the weights (coevo/train/sharded.py). `actor` is rank 0, `workers` all of them. Each worker
    gets `options[rank]` (its bundle); `backend` is NCCL for GPUs, gloo for CPU workers (tests).
    `start()` joins the process group and loads the model once every worker is placed.
    """

    def __init__(self, cfg: PolicyConfig, role: str, seed: int, options: list[dict], wanted: tuple[Need, ...] = (),
                 backend: str = "nccl") -> None:
        remote = ray.remote(ShardedWorker)
        self.workers = [remote.options(**opts).remote(cfg, role, seed, rank, len(options), wanted)
                        for rank, opts in enumerate(options)]
        self.backend = backend
        super().__init__(self.workers[0], cfg, role)

    def start(self) -> list[dict]:
        """Every rank's `info()` once the process group is up and the sharded model loaded."""
        address, port = call(self.workers[0].endpoint.remote(), f"{self.role} rank 0 endpoint")
        return gather([w.setup.remote(address, port, self.backend) for w in self.workers], f"{self.role} start-up")

    def update(self, batch: list) -> dict:
        ref = ray.put(batch)
        return gather([w.update.remote(ref) for w in self.workers], f"{self.role} update")[0]

    def save(self, directory: str) -> str:
        path = os.path.abspath(directory)
        return gather([w.save.remote(path) for w in self.workers], f"{self.role} save")[0]

    def load(self, directory: str) -> None:
        path = os.path.abspath(directory)
        gather([w.load.remote(path) for w in self.workers], f"{self.role} load")


def rank_names(role: str, ranks: int) -> list[str]:
    """Actor names of a role's workers: the role itself for rank 0, `<role>.<rank>` for the others."""
    return [role] + [f"{role}.{r}" for r in range(1, ranks)]


@dataclass
class Actors:
    """Every actor of a run plus the driver-side proxies the loop uses."""

    proposer: Optional[RemotePolicy]  # None in `coevo.solve` (labelled questions, no proposer)
    solver: RemotePolicy
    ranker: Optional[RemotePolicy]  # None when ranker.mode is none/oracle; the solver's when shared
    retrieval: RemoteRetriever
    evidence: Optional[RemoteEvidence]  # None in `coevo.solve`
    trainable: dict[str, RemotePolicy]  # role -> policy whose weights change and are checkpointed
    placement: dict[str, dict] = field(default_factory=dict)  # actor -> node, host, pid, resources (Ray only)


def _requests(cfg: CoevoConfig, ranker: Optional[PolicyConfig]) -> dict[str, dict[str, float]]:
    """Actor name -> the Ray resources it requests, in start order.

    A sharded role (`num_gpus = n > 1`) is n workers, each one bundle of {GPU 1, CPU num_cpus / n}
    in the run's placement group: the role asks for what it did as one actor, and Ray may place
    its ranks on several nodes (NCCL reaches them) when `ray.placement=spread`.
    """
    out: dict[str, dict[str, float]] = {}
    for role, p in (("proposer", cfg.proposer), ("solver", cfg.solver), ("ranker", ranker)):
        if p is None:
            continue
        ranks = shard_count(p, role)
        for name in rank_names(role, ranks) if ranks else [role]:
            out[name] = request_of(p.num_cpus / ranks, 1, p.resources) if ranks else request_of(
                p.num_cpus, p.num_gpus, p.resources)
    # One core each: BM25 search and spaCy are single-threaded (_limit_threads(1)).
    out["retrieval"] = request_of(1, 0, cfg.retrieval.resources)
    out["evidence"] = request_of(1, 0, cfg.evidence.resources)
    return out


def _policy_actor(cfg: CoevoConfig, policy: PolicyConfig, role: str, seed: int, opts: dict) -> RemotePolicy:
    """One actor, or a sharded role's workers (`opts`: actor name -> options, every rank's among them)."""
    wanted = tuple(needs(cfg, role, policy))
    ranks = shard_count(policy, role)
    if ranks:
        return RemoteShardedPolicy(policy, role, seed, [opts[n] for n in rank_names(role, ranks)], wanted)
    actor = ray.remote(PolicyWorker).options(**opts[role]).remote(policy, role, seed, wanted)
    return RemotePolicy(actor, policy, role)


def _handles(proxies: dict[str, Optional[RemotePolicy]]) -> dict[str, Any]:
    """Actor name -> handle of every policy actor, each rank of a sharded role by its own name."""
    out = {}
    for role, proxy in proxies.items():
        workers = proxy.workers if isinstance(proxy, RemoteShardedPolicy) else [proxy.actor] if proxy else []
        out.update(zip(rank_names(role, len(workers)), workers))
    return out


def create_actors(cfg: CoevoConfig) -> Actors:
    """Start every actor the configuration needs and return the wired proxies.

    The actors get the config with the driver's absolute paths (hostpaths.py); a cluster that
    can never hold them all fails here, before any actor starts (cluster.py).
    """
    init_ray(cfg)
    cfg = for_workers(cfg)
    # mode=frozen already set ranker.frozen (coevo.core.config.resolve_frozen): never trained. None:
    # the solver's own object (shared backbone); frozen + shared: a frozen copy of the solver's start.
    own = ranker_policy_config(cfg.ranker, cfg.solver) if cfg.ranker.mode in ("trainable", "frozen") else None
    requests = _requests(cfg, own)
    check_schedulable(requests)
    pg, opts = placement_options(requests, cfg.ray.placement)
    proposer = _policy_actor(cfg, cfg.proposer, "proposer", cfg.seed + 1, opts)
    solver = _policy_actor(cfg, cfg.solver, "solver", cfg.seed + 2, opts)
    ranker: Optional[RemotePolicy] = None
    if cfg.ranker.mode in ("trainable", "frozen"):
        ranker = solver if own is None else _policy_actor(cfg, own, "ranker", cfg.seed + 3, opts)
    retrieval = RemoteRetriever(ray.remote(RetrievalWorker).options(**opts["retrieval"]).remote(cfg))
    evidence = RemoteEvidence(ray.remote(EvidenceWorker).options(**opts["evidence"]).remote(cfg))
    trainable = {r: p for r, p in (("proposer", proposer), ("solver", solver)) if not p.frozen}
    if ranker is not None and ranker is not solver and not ranker.frozen:
        trainable["ranker"] = ranker
    policies = {"proposer": proposer, "solver": solver, "ranker": ranker if own is not None else None}
    handles = {**_handles(policies), "retrieval": retrieval.actor, "evidence": evidence.actor}
    placed = wait_until_ready(handles, requests, cfg.ray, call, pg)
    for proxy in policies.values():  # every rank placed: the process groups can form
        if isinstance(proxy, RemoteShardedPolicy):
            proxy.start()
    placement = {name: {**info, "resources": requests[name]} for name, info in placed.items()}
    return Actors(proposer, solver, ranker, retrieval, evidence, trainable, placement)


def create_local_actors(cfg: CoevoConfig, with_proposer: bool = True) -> Actors:
    """The same wiring in one process, without Ray (tests and debugging; `ray.local=true`).

    `with_proposer=False` (`coevo.solve`) loads neither the proposer nor the evidence stage.
    A sharded role (`num_gpus > 1`) needs its Ray worker group: refused here, never run on one GPU.
    """
    for role in ("proposer", "solver", "ranker") if with_proposer else ("solver", "ranker"):
        n = getattr(cfg, role).num_gpus
        if n > 1:
            raise ValueError(f"config key {role}.num_gpus={n:g} shards the {role} over a Ray worker group, which "
                             f"ray.local=true (one process) cannot hold; expected ray.local=false or "
                             f"{role}.num_gpus <= 1")
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
