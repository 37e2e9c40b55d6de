"""Paths every Ray actor needs, resolved by the driver and checked on the actor's own node.

An actor on another host resolves a relative path against its own working directory and
`$COEVO_CACHE` / `$COEVO_SHARED_DATA` against its own environment, so it would read another
file or none. The driver therefore hands its actors a config whose paths are absolute
(`for_workers`) and the two variables as absolute paths (`worker_path_env`); what those
paths name must then be visible on every node at the same place: a shared filesystem or a
copy (README, "On a cluster"). Each actor checks what it needs (`needs`) before it loads
anything (`check_host_paths`); a missing or unreadable path stops the run at start-up with
an error naming the actor, its node and the path, instead of failing mid-step.
"""
from __future__ import annotations

import copy
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from coevo.core.config import CoevoConfig, PolicyConfig
from coevo.core.io import cache_root
from coevo.train.models import EMBEDDED, embedded_path
from evidence.corpus import shared_data_dir

CLUSTER_NOTE = "every node needs it at the same path: a shared filesystem or a copy (README, 'On a cluster')"


class HostPathError(RuntimeError):
    """An actor cannot read or write a path it needs on its node; the message names actor, node, key and path."""


@dataclass(frozen=True)
class Need:
    """One path an actor needs: the config key (or variable) it comes from, and whether it reads or writes there."""

    key: str
    path: str
    write: bool = False


def _absolute(path: Optional[str]) -> Optional[str]:
    return None if path is None else os.path.abspath(os.path.expanduser(path))


def _local_model(name: str) -> bool:
    """Whether `model` names a local directory (not an embedded preset or a hub id)."""
    return name not in EMBEDDED and (name.startswith((".", "/", "~")) or Path(name).expanduser().exists())


def for_workers(cfg: CoevoConfig) -> CoevoConfig:
    """A copy of `cfg` whose paths are absolute on the driver: what the actors get."""
    out = copy.deepcopy(cfg)
    out.corpus.path = _absolute(out.corpus.path)
    out.retrieval.cache_dir = _absolute(out.retrieval.cache_dir or str(cache_root() / "indexes"))
    out.run.dir = _absolute(out.run.dir) or out.run.dir
    for role in ("proposer", "solver", "ranker"):
        policy: PolicyConfig = getattr(out, role)
        if _local_model(policy.model):
            policy.model = _absolute(policy.model) or policy.model
        policy.checkpoint = _absolute(policy.checkpoint)
    return out


def worker_path_env() -> dict[str, str]:
    """`$COEVO_CACHE` and `$COEVO_SHARED_DATA` as the driver resolves them, absolute, for every actor."""
    return {"COEVO_CACHE": str(cache_root().resolve()), "COEVO_SHARED_DATA": str(shared_data_dir().resolve())}


def _corpus_file(cfg: CoevoConfig) -> Optional[str]:
    if cfg.corpus.name == "jsonl":
        return cfg.corpus.path
    if cfg.corpus.name == "wiki_mini":
        return str(shared_data_dir() / "wiki_mini" / "corpus.jsonl.gz")
    return None  # vital_articles: inside an installed package, found (or not) by load_corpus on each node


def needs(cfg: CoevoConfig, actor: str, policy: Optional[PolicyConfig] = None) -> list[Need]:
    """What actor `actor` (a role, `retrieval` or `evidence`) reads and writes, from the config it got."""
    if policy is not None:
        out = []
        if policy.model in EMBEDDED:  # built once into the cache on first use
            out.append(Need("$COEVO_CACHE", str(embedded_path(policy.model)), write=True))
        elif _local_model(policy.model):
            out.append(Need(f"{actor}.model", policy.model))
        if policy.checkpoint:
            out.append(Need(f"{actor}.checkpoint", policy.checkpoint))
        if not policy.frozen:  # the driver asks trainable policies to save into run.dir/checkpoints
            out.append(Need("run.dir", cfg.run.dir, write=True))
        return out
    corpus = _corpus_file(cfg)
    out = [Need("corpus.path" if cfg.corpus.name == "jsonl" else "$COEVO_SHARED_DATA", corpus)] if corpus else []
    out.append(Need("retrieval.cache_dir", cfg.retrieval.cache_dir or str(cache_root() / "indexes"), write=True))
    if actor == "evidence":
        out.append(Need("$COEVO_CACHE", str(cache_root() / "entities"), write=True))
    return out


def _problem(need: Need) -> Optional[str]:
    """Why this node cannot use `need`, or None. A path to write may not exist yet: its nearest existing
    parent must then be writable (the cache builds it)."""
    path = Path(need.path)
    if not need.write:
        if not path.exists():
            return "does not exist"
        mode = os.R_OK | (os.X_OK if path.is_dir() else 0)
        return None if os.access(path, mode) else "is not readable"
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "has no existing parent directory"
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot be created: {probe} is not a directory"
    return None if os.access(probe, os.W_OK | os.X_OK) else f"is not writable ({probe})"


def node_name() -> str:
    """This process's Ray node (id prefix) and host, as errors and the placement log name it."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "-"
    return f"node {node[:12]} (host {socket.gethostname()})"


def check_host_paths(actor: str, wanted: list[Need]) -> None:
    """Raise HostPathError for the paths this node cannot use as `actor` needs them (all of them, one line each)."""
    problems = [f"{n.key}: {n.path} {why}" for n in wanted if (why := _problem(n)) is not None]
    if problems:
        raise HostPathError(f"the {actor} actor on {node_name()} cannot use what it needs: " + "; ".join(problems)
                            + f"; {CLUSTER_NOTE}")
