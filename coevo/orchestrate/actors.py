"""Ray actors (docs/method.md §5.2) and the thin driver-side proxies that make them look local.

Roles live in their own modules (coevo/policy.py, evidence/, solver/); this module only
creates the actors and wires them: one actor per trainable policy, `retrieval.replicas`
retrieval actors (corpus + index, each mapping the same files: evidence/corpus_store.py and
bm25s's mmap), one evidence actor (spaCy + entity index). A policy with `num_gpus = n > 1`
is a group of n worker actors, one GPU each, sharing one torch.distributed process group
(coevo/train/sharded.py), behind a proxy with the single actor's interface (`RemoteShardedPolicy`).
The actors start together, except the roles serving with vLLM on GPUs: one at a time (`start_policies`).
The proxies expose the same methods the episode code calls (a policy's `RolePolicy` of coevo/core/types.py, the
retriever's `search` and `corpus[pid]`), so `solver.agent.run_episodes` runs unchanged against remote actors;
`ranker_and_trainable` wires the ranker alike under Ray and in one process.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import ray

from coevo.core.choices import Engine
from coevo.core.config import CoevoConfig, PolicyConfig
from coevo.core.role_config import ranker_policy_config
from coevo.core.types import EvidencePath, RolePolicy, Verdict
from coevo.orchestrate.cluster import (  # noqa: F401  init_ray: imported from here by tests and tools
    ActorFailure,
    check_schedulable,
    init_ray,
    placement_options,
    request_of,
    wait_until_ready,
)
from coevo.orchestrate.data_actors import EvidenceWorker, RetrievalWorker
from coevo.orchestrate.hostpaths import for_workers, needs
from coevo.orchestrate.policy_actors import (  # noqa: F401  re-exported: tests and tools import them from here
    PolicyWorker,
    RemotePolicy,
    rank_names,
)
from coevo.orchestrate.remote import call
from coevo.orchestrate.sharded_actors import RemoteShardedPolicy
from coevo.train.policy import Policy
from coevo.train.sharded import shard_count
from evidence.build_index import build_command
from evidence.corpus_store import open_corpus
from evidence.retrieval import build_retriever


class RemoteEvidence:
    """Driver-side stand-in for the evidence pipeline's batch methods."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def validate_targets(self, targets: list[str], references: list[str]) -> list[Verdict]:
        return call(self.actor.validate_targets.remote(targets, references), "evidence: target validation")

    def build_paths(self, targets: list[str], seed: int) -> list[list[EvidencePath]]:
        return call(self.actor.build_paths.remote(targets, seed), "evidence: paths")

    def direct_paths(self, targets: list[str], support_ids: list[list[str]]) -> list[list[EvidencePath]]:
        return call(self.actor.direct_paths.remote(targets, support_ids), "evidence: direct paths")

    def validate_questions(self, questions: list[str], targets: list[str],
                           paths: list[EvidencePath]) -> list[Verdict]:
        return call(self.actor.validate_questions.remote(questions, targets, paths), "evidence: question validation")


class RemoteCorpus:
    """Passages the driver has seen so far, filled by `RemoteRetriever.search`."""

    def __init__(self) -> None:
        self.passages: dict[str, Any] = {}

    def __getitem__(self, passage_id: str) -> Any:
        return self.passages[passage_id]


def split_evenly(items: list[Any], parts: int) -> list[list[Any]]:
    """`items` in at most `parts` contiguous chunks whose sizes differ by at most one (no empty chunk,
    except the one chunk of an empty list)."""
    parts = max(1, min(parts, len(items)))
    base, extra = divmod(len(items), parts)
    bounds = [i * base + min(i, extra) for i in range(parts + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(parts)]


class RemoteRetriever:
    """Driver-side stand-in for a retriever: `search` and `corpus[pid]`, backed by its replica actors.

    A batch of queries is split into contiguous chunks, one per replica, searched at once; the
    hits come back in query order, so the result is the single actor's whatever the replica count.
    """

    def __init__(self, actors: list[Any]) -> None:
        if not actors:
            raise ValueError("RemoteRetriever needs at least one retrieval actor")
        self.actors = actors
        self.corpus = RemoteCorpus()

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        chunks = split_evenly(list(queries), len(self.actors))
        refs = [actor.search_with_passages.remote(chunk, k) for actor, chunk in zip(self.actors, chunks)]
        hits: list[list[Any]] = []
        for ref in refs:
            part, passages = call(ref, "retrieval")
            hits += part
            self.corpus.passages.update(passages)
        return hits


@dataclass
class Actors:
    """Every actor of a run plus the driver-side proxies the loop uses."""

    proposer: Optional[RolePolicy]  # None in `coevo.solve` (labelled questions, no proposer)
    solver: RolePolicy
    ranker: Optional[RolePolicy]  # None when ranker.mode is none/oracle; the solver's when shared
    retrieval: RemoteRetriever
    evidence: Optional[RemoteEvidence]  # None in `coevo.solve`
    trainable: dict[str, RolePolicy]  # role -> policy whose weights change and are checkpointed
    placement: dict[str, dict] = field(default_factory=dict)  # actor -> node, host, pid, resources (Ray only)
    handles: dict[str, Any] = field(default_factory=dict)  # actor name -> its Ray handle (Ray only)

    def check_alive(self) -> None:
        """Raise ActorFailure naming the first actor that no longer answers (Ray runs; none in one process).

        A dead actor is otherwise noticed only when next called, and a step need not call every
        actor (no accepted task: no search), so a run could go on without one; the loop asks each step.
        """
        refs = {name: handle.ready.remote() for name, handle in self.handles.items()}
        ranks = {name: f"{role} rank {r}" for role in ("proposer", "solver", "ranker")
                 if isinstance(proxy := getattr(self, role), RemoteShardedPolicy)
                 for r, name in enumerate(rank_names(role, len(proxy.workers)))}
        for name, ref in refs.items():
            call(ref, f"{ranks.get(name, name)} (alive check)")  # a sharded role's rank by role and rank


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
            out[name] = request_of(p.num_cpus / ranks, 1 if p.num_gpus else 0, p.resources) if ranks else request_of(
                p.num_cpus, p.num_gpus, p.resources)
    # One core each: BM25 search and spaCy are single-threaded (limit_threads(1)).
    for name in retrieval_names(cfg.retrieval.replicas):
        out[name] = request_of(1, 0, cfg.retrieval.resources)
    out["evidence"] = request_of(1, 0, cfg.evidence.resources)
    return out


def retrieval_names(replicas: int) -> list[str]:
    """Actor names of the retrieval replicas: `retrieval`, then `retrieval.1`, ... (as a sharded role's ranks)."""
    return rank_names("retrieval", replicas)


def start_notes(cfg: CoevoConfig) -> dict[str, str]:
    """Actor name -> what its constructor does (the readiness timeout names it for the actors not ready)."""
    build = (f"an index not in the cache is built here, inside the readiness window; build indexes once, before "
             f"the run, with `{build_command(cfg)}` (resumable)")
    return {**{role: f"loads the {role} model" for role in ("proposer", "solver", "ranker")},
            **{name: f"loads the corpus and its {cfg.retrieval.backend} index; {build}"
               for name in retrieval_names(cfg.retrieval.replicas)},
            "evidence": f"loads the corpus, the retriever and the entity index (spaCy over every passage); {build}"}


def _policy_actor(cfg: CoevoConfig, policy: PolicyConfig, role: str, seed: int, opts: dict) -> RemotePolicy:
    """One actor, or a sharded role's workers (`opts`: actor name -> options, every rank's among them)."""
    wanted = tuple(needs(cfg, role, policy))
    ranks = shard_count(policy, role)
    if ranks:
        return RemoteShardedPolicy(policy, role, seed, [opts[n] for n in rank_names(role, ranks)], wanted,
                                   "nccl" if policy.num_gpus else "gloo", cfg.cluster.collective_timeout_s)
    actor = ray.remote(PolicyWorker).options(**opts[role]).remote(policy, role, seed, wanted)
    return RemotePolicy(actor, policy, role)


def _handles(proxies: dict[str, Optional[RemotePolicy]]) -> dict[str, Any]:
    """Actor name -> handle of every policy actor, each rank of a sharded role by its own name."""
    out = {}
    for role, proxy in proxies.items():
        workers = proxy.workers if isinstance(proxy, RemoteShardedPolicy) else [proxy.actor] if proxy else []
        out.update(zip(rank_names(role, len(workers)), workers))
    return out


def one_at_a_time(policies: dict[str, Optional[PolicyConfig]]) -> list[str]:
    """The roles whose actors start one after the other: those serving with vLLM on GPUs, when two or more do.

    A GPU vLLM engine takes its memory (weights, KV cache, CUDA graphs) as it starts and checks it
    against what the device has free then: two starting together on one device (fractional
    `num_gpus`) would count each other's allocations, or both claim the same bytes, and a start that
    fails is then one role's, named. HF and CPU roles start together, as before (CI's start-up time).
    """
    gpu = [role for role, p in policies.items() if p is not None and p.num_gpus > 0 and p.engine == Engine.vllm]
    return gpu if len(gpu) > 1 else []


def start_policies(policies: dict[str, Optional[PolicyConfig]], make: Callable[[str, PolicyConfig], RemotePolicy],
                   ready: Callable[[dict[str, Any]], dict[str, dict]],
                   others: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict]]:
    """Create and start the policy actors in role order: (role -> proxy or None, actor name -> where it runs).

    `make(role, config)` creates a role's actor(s); `ready(handles)` waits until they answer
    (`wait_until_ready`); `others`: the data actors, created before, waited for with the policies.
    Each role of `one_at_a_time` is created, waited for and, when sharded, started (process group,
    model, engine) before the next role is created. The other roles are created at once, their
    constructors running together, waited for with `others`, then the sharded ones started.
    """
    serial = one_at_a_time(policies)
    proxies: dict[str, Any] = {}
    placed: dict[str, dict] = {}
    for role, policy in policies.items():
        proxies[role] = None if policy is None else make(role, policy)
        if role in serial:
            placed.update(ready(_handles({role: proxies[role]})))
            _start_sharded(proxies[role])
    placed.update(ready({**{n: h for n, h in _handles(proxies).items() if n not in placed}, **others}))
    for role, proxy in proxies.items():  # every rank placed: the process groups can form
        if role not in serial:
            _start_sharded(proxy)
    return proxies, placed


def _start_sharded(proxy: Optional[RemotePolicy]) -> None:
    if isinstance(proxy, RemoteShardedPolicy):
        proxy.start()


def ranker_and_trainable(cfg: CoevoConfig, proposer: Optional[RolePolicy], solver: RolePolicy,
                         own_ranker: Optional[RolePolicy]) -> tuple[Optional[RolePolicy], dict[str, RolePolicy]]:
    """(the ranker's policy, role -> policy whose weights change and are checkpointed), under Ray and in one process.

    `own_ranker`: the policy built from `ranker_policy_config` (None when that is None). Without
    one the ranker generates with the solver's object (`ranker.share_backbone`) or has no model
    (modes none and oracle). mode=frozen already set ranker.frozen (coevo.core.config.resolve_frozen),
    so a frozen ranker, its own or a frozen copy of the solver's start, is never trained.
    """
    ranker = (solver if own_ranker is None else own_ranker) if cfg.ranker.has_model else None
    roles = (("proposer", proposer), ("solver", solver), ("ranker", own_ranker))
    return ranker, {role: p for role, p in roles if p is not None and not p.frozen}


def create_actors(cfg: CoevoConfig) -> Actors:
    """Start every actor the configuration needs and return the wired proxies.

    The actors get the config with the driver's absolute paths (hostpaths.py); a cluster that
    can never hold them all fails here, before any actor starts (cluster.py). The data actors
    start first, the policies then as `start_policies` says (GPU vLLM roles one at a time).
    """
    init_ray(cfg)
    cfg = for_workers(cfg)
    own = ranker_policy_config(cfg.ranker, cfg.solver)
    requests = _requests(cfg, own)
    check_schedulable(requests)
    pg, opts = placement_options(requests, cfg.ray.placement)
    notes = start_notes(cfg)
    retrieval = RemoteRetriever([ray.remote(RetrievalWorker).options(**opts[name]).remote(cfg)
                                 for name in retrieval_names(cfg.retrieval.replicas)])
    evidence = RemoteEvidence(ray.remote(EvidenceWorker).options(**opts["evidence"]).remote(cfg))
    data = {**dict(zip(retrieval_names(len(retrieval.actors)), retrieval.actors)), "evidence": evidence.actor}
    seeds = {"proposer": cfg.seed + 1, "solver": cfg.seed + 2, "ranker": cfg.seed + 3}
    policies, placed = start_policies(
        {"proposer": cfg.proposer, "solver": cfg.solver, "ranker": own},
        lambda role, p: _policy_actor(cfg, p, role, seeds[role], opts),
        lambda handles: wait_until_ready(handles, requests, cfg.ray, call, pg, starting=notes), data)
    proposer, solver = policies["proposer"], policies["solver"]
    ranker, trainable = ranker_and_trainable(cfg, proposer, solver, policies["ranker"])
    handles = {**_handles(policies), **data}
    placement = {name: {**placed[name], "resources": requests[name]} for name in handles}
    return Actors(proposer, solver, ranker, retrieval, evidence, trainable, placement, handles)


def create_local_actors(cfg: CoevoConfig, with_proposer: bool = True) -> Actors:
    """The same wiring in one process, without Ray (tests and debugging; `ray.local=true`).

    `with_proposer=False` (`coevo.solve`) loads neither the proposer nor the evidence stage.
    A sharded role (`num_gpus > 1`) needs its Ray worker group: refused here, never run on one GPU.
    """
    for role in ("proposer", "solver", "ranker") if with_proposer else ("solver", "ranker"):
        if ranks := shard_count(getattr(cfg, role), role):
            key = "num_gpus" if getattr(cfg, role).num_gpus > 1 else "cpu_ranks"
            raise ValueError(f"config key {role}.{key}={ranks} shards the {role} over a Ray worker group, which "
                             f"ray.local=true (one process) cannot hold; expected ray.local=false or "
                             f"{role}.{key} <= 1")
    proposer = Policy.from_config(cfg.proposer, "proposer") if with_proposer else None
    solver = Policy.from_config(cfg.solver, "solver")
    own = ranker_policy_config(cfg.ranker, cfg.solver)
    own_ranker = Policy.from_config(own, "ranker") if own is not None else None
    ranker, trainable = ranker_and_trainable(cfg, proposer, solver, own_ranker)
    retriever = build_retriever(open_corpus(cfg.corpus), cfg.retrieval)
    evidence = EvidenceWorker(cfg, own_process=False) if with_proposer else None
    return Actors(proposer, solver, ranker, retriever, evidence, trainable)  # type: ignore[arg-type]
