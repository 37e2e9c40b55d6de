"""The Ray cluster a run uses: joining it, placing the actors, and a start-up that says what it waits for.

- `init_ray` joins `ray.address` or starts a local cluster sized for the actors.
- `unschedulable` decides, from the nodes' total resources (`ray.nodes()`), whether the
  actors' requests can ever be placed together; `create_actors` stops at once when they
  cannot, naming the actor left over, instead of waiting `ray.ready_timeout_s` for nothing.
- `placement_options` puts every actor in one placement group, one bundle per actor, with
  Ray's SPREAD or PACK strategy (`ray.placement`); custom resources (`<role>.resources`)
  pin an actor to the nodes that offer them.
- `wait_until_ready` prints, every `ray.report_pending_s`, the actors still pending, what each
  requests and what each node has free; it returns where each actor runs, which
  `record_placement` writes to run.log and config.yaml.
"""
from __future__ import annotations

import logging
import math
import os
import time
from typing import Any, Callable, Optional

import ray
import yaml

from coevo.core.config import CoevoConfig, RayConfig
from coevo.core.console import WORKER_SETUP_HOOK, route_library_loggers, say, worker_env
from coevo.core.io import atomic_write_text
from coevo.core.stopping import install_stop_handlers
from coevo.orchestrate.hostpaths import worker_path_env

LOG = logging.getLogger(__name__)
Requests = dict[str, dict[str, float]]  # actor name -> Ray resources it asks for (zeros left out)
SEARCH_BUDGET = 200_000  # assignments `unschedulable` tries before it stops deciding (then the run waits)
# Ray's switch (ray/_private/accelerators/accelerator.py) that hides every GPU from an actor given none.
ZERO_GPUS_HIDE_ALL = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"


class ActorFailure(RuntimeError):
    """A Ray actor died, raised or could not start; the run stops with this message and keeps its checkpoints."""


class SchedulingError(ActorFailure):
    """The actors can never all be placed on this cluster; the message names the actor and the nodes."""


def request_of(num_cpus: float, num_gpus: float = 0.0,
               resources: Optional[dict[str, float]] = None) -> dict[str, float]:
    """One actor's request as Ray resources, without zero entries (Ray refuses all-zero bundles)."""
    full = {"CPU": float(num_cpus), "GPU": float(num_gpus), **{k: float(v) for k, v in (resources or {}).items()}}
    return {k: v for k, v in full.items() if v > 0}


def fmt(resources: dict[str, float]) -> str:
    """`CPU 1, GPU 0.5, node_a 0.1`: the resources a request or a node names (Ray's internal ones left out)."""
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU") or not _internal(k)}
    order = sorted(shown.items(), key=lambda kv: (kv[0] not in ("CPU", "GPU"), kv[0]))
    return ", ".join(f"{k} {v:g}" for k, v in order) or "nothing"


def _internal(key: str) -> bool:
    return key in ("memory", "object_store_memory") or key.startswith("node:") or "_group_" in key \
        or key.startswith("accelerator_type:")


def node_totals() -> dict[str, dict[str, float]]:
    """Node id -> total resources, of the live nodes (`ray.nodes()`)."""
    return {n["NodeID"]: dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")}


def node_free() -> dict[str, dict[str, float]]:
    """Node id -> resources free now (a developer API of Ray; stale by up to a heartbeat)."""
    from ray._private.state import available_resources_per_node

    return available_resources_per_node()


def _fits(request: dict[str, float], room: dict[str, float]) -> bool:
    return all(room.get(k, 0.0) >= v - 1e-9 for k, v in request.items())


def _take(room: dict[str, float], request: dict[str, float], sign: float) -> None:
    for k, v in request.items():
        room[k] = room.get(k, 0.0) - sign * v


def _assignable(items: list[dict[str, float]], rooms: list[dict[str, float]], budget: list[int]) -> Optional[bool]:
    """Whether `items` fit into `rooms` together (depth-first, nodes with equal room tried once); None: undecided."""
    if not items:
        return True
    budget[0] -= 1
    if budget[0] < 0:
        return None
    first, rest = items[0], items[1:]
    tried: set = set()
    undecided = False
    for room in rooms:
        key = tuple(sorted(room.items()))
        if key in tried or not _fits(first, room):
            continue
        tried.add(key)
        _take(room, first, 1)
        found = _assignable(rest, rooms, budget)
        _take(room, first, -1)
        if found:
            return True
        undecided |= found is None
    return None if undecided else False


def _first_fit_leftover(requests: Requests, totals: dict[str, dict[str, float]]) -> list[str]:
    """The actors that do not fit when placed in start order on the first node with room (as they queue)."""
    rooms = [dict(t) for t in totals.values()]
    left = []
    for name, request in requests.items():
        room = next((r for r in rooms if _fits(request, r)), None)
        if room is None:
            left.append(name)
        else:
            _take(room, request, 1)
    return left


def unschedulable(requests: Requests, totals: dict[str, dict[str, float]]) -> Optional[str]:
    """Why `requests` can never run together on nodes with `totals` (None: they can, or it is undecided)."""
    nodes = "; ".join(f"node {nid[:12]}: {fmt(t)}" for nid, t in totals.items()) or "none"
    for name, request in requests.items():
        if not any(_fits(request, t) for t in totals.values()):
            return (f"the {name} actor requests {fmt(request)}, more than any node of the cluster has "
                    f"({len(totals)} nodes: {nodes})")
    items = sorted(requests.values(), key=lambda r: -sum(r.values()))
    if _assignable(items, [dict(t) for t in totals.values()], [SEARCH_BUDGET]) is not False:
        return None
    left = _first_fit_leftover(requests, totals) or list(requests)[-1:]
    placed = [n for n in requests if n not in left]
    asked = _sum(list(requests.values()))
    return (f"the {', '.join(left)} actor{'s' if len(left) > 1 else ''} ({'; '.join(fmt(requests[n]) for n in left)}) "
            f"cannot be placed beside {', '.join(placed) or 'the others'}: the actors request {fmt(asked)} in all, "
            f"the cluster's {len(totals)} nodes have {fmt(_sum(list(totals.values())))} ({nodes})")


def _sum(resources: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in resources:
        for k, v in r.items():
            out[k] = out.get(k, 0.0) + v
    return out


def check_schedulable(requests: Requests) -> None:
    """Raise SchedulingError when the actors can never all run on the live nodes, with the overrides that help."""
    why = unschedulable(requests, node_totals())
    if why is not None:
        raise SchedulingError(f"cannot start the run's actors: {why}. Lower <role>.num_cpus / <role>.num_gpus "
                              "(e.g. proposer.num_cpus=0.5), drop a <role>.resources label, or add nodes")


def placement_options(requests: Requests, placement: str) -> tuple[Any, dict[str, dict[str, Any]]]:
    """(the placement group or None, actor name -> Ray options): one bundle per actor that requests anything."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = {"spread": "SPREAD", "pack": "PACK"}[str(placement)]
    bundled = [name for name, r in requests.items() if r]
    pg = placement_group([requests[n] for n in bundled], strategy=strategy) if bundled else None
    out: dict[str, dict[str, Any]] = {}
    for name, request in requests.items():
        opts: dict[str, Any] = {"num_cpus": request.get("CPU", 0.0), "num_gpus": request.get("GPU", 0.0),
                                "resources": {k: v for k, v in request.items() if k not in ("CPU", "GPU")}}
        if name in bundled:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, bundled.index(name))
        else:  # requests nothing: outside the group (Ray refuses empty bundles), by the same strategy
            opts["scheduling_strategy"] = "SPREAD" if strategy == "SPREAD" else "DEFAULT"
        out[name] = opts
    return pg, out


def pending_report(pending: list[str], requests: Requests, waited_s: float, placed: bool) -> str:
    """The line start-up prints while actors wait: who, what each asks for, what each node has free.

    placed: the placement group holds every actor's resources, so the pending ones are loading
    (a first-use build shows its own progress), not waiting for the cluster.
    """
    asked = "; ".join(f"{n} ({fmt(requests.get(n, {}))})" for n in pending)
    if placed:
        return f"ray: after {waited_s:.0f}s {len(pending)} actors are placed and still starting (loading): {asked}"
    free = "; ".join(f"node {nid[:12]}: {fmt(r)}" for nid, r in node_free().items()) or "no live node"
    return (f"ray: after {waited_s:.0f}s {len(pending)} actors wait for resources: {asked}. Free now: {free} "
            "(other jobs may hold the rest)")


def timeout_message(pending: list[str], requests: Requests, timeout_s: float, waited_s: float, placed: bool,
                    starting: dict[str, str]) -> str:
    """Why the actors `pending` are not ready after `ray.ready_timeout_s`.

    Placed (their resources held), they are still in their constructors: the cluster is not short
    of anything, so the message names what each one is doing instead of the free resources.
    """
    if not placed:
        return (f"actors {pending} did not start within ray.ready_timeout_s={timeout_s}s; "
                + pending_report(pending, requests, waited_s, placed))
    doing = "; ".join(f"{n}: {starting.get(n, 'its constructor')}" for n in pending)
    return (f"actors {pending} are placed (the cluster holds their resources) but their constructors had not "
            f"returned after ray.ready_timeout_s={timeout_s}s: still loading or building, not waiting for "
            f"CPUs/GPUs. Not ready: {doing}")


def _placed(pg: Any) -> bool:
    from ray.util.placement_group import placement_group_table

    return pg is not None and placement_group_table(pg).get("state") == "CREATED"


def wait_until_ready(handles: dict[str, Any], requests: Requests, ray_cfg: RayConfig,
                     call: Callable[[Any, str], Any], pg: Any = None,
                     starting: Optional[dict[str, str]] = None) -> dict[str, dict]:
    """Each actor's `ready()` (where it runs), reporting what is pending; fail when it cannot or did not start.

    The first report comes after `ray.report_pending_s`, the next ones twice as far apart each
    time (at most a minute). An actor that fails at start (a path its node lacks) fails the
    wait at once, and so does a request the live nodes can no longer hold (a node left);
    otherwise the wait ends after `ray.ready_timeout_s` (`timeout_message` says why).
    `starting`: actor name -> what its constructor does, for that message.
    """
    refs = {name: h.ready.remote() for name, h in handles.items()}
    t0, where, gap = time.monotonic(), {}, ray_cfg.report_pending_s
    next_report = t0 + gap
    while True:
        left = ray_cfg.ready_timeout_s - (time.monotonic() - t0)
        done, _ = ray.wait([r for n, r in refs.items() if n not in where], num_returns=1,
                           timeout=max(0.0, min(next_report - time.monotonic(), left, 1.0)))
        for name, ref in refs.items():
            if ref in done and name not in where:
                where[name] = call(ref, f"{name} start-up")
        pending = [n for n in refs if n not in where]
        if not pending:
            return where
        waited = time.monotonic() - t0
        if waited >= ray_cfg.ready_timeout_s:
            raise SchedulingError(timeout_message(pending, requests, ray_cfg.ready_timeout_s, waited, _placed(pg),
                                                  starting or {}))
        if time.monotonic() >= next_report:
            check_schedulable({n: requests.get(n, {}) for n in refs})
            placed = _placed(pg)  # loading is the normal start (run.log); waiting for the cluster is news
            (LOG.info if placed else say)(pending_report(pending, requests, waited, placed))
            gap = min(2 * gap, 60.0)
            next_report = time.monotonic() + gap


def record_placement(run_dir: Optional[os.PathLike | str], placement: dict[str, dict]) -> None:
    """Log each actor's node and resources (`Actors.placement`) and append them to run.dir/config.yaml
    as `placement:` (not an experiment key: a resume on other nodes is the same run)."""
    if not placement:  # ray.local=true: everything in the driver
        return
    for name, p in placement.items():
        LOG.info("actor %s on node %s (host %s, %s, pid %s): %s", name, p["node_id"], p["host"], p["ip"], p["pid"],
                 fmt(p["resources"]))
    nodes = sorted({p["node_id"] for p in placement.values()})
    by_node = "; ".join(f"node {nid[:12]}: {', '.join(n for n, p in placement.items() if p['node_id'] == nid)}"
                        for nid in nodes)
    # On one machine there is nothing to see; across nodes the terminal says where each role runs.
    (say if len(nodes) > 1 else LOG.info)(f"ray: {len(placement)} actors on {len(nodes)} node(s): {by_node}")
    if run_dir is not None:
        path = os.path.join(run_dir, "config.yaml")
        with open(path, encoding="utf-8") as f:
            text = f.read().split("\nplacement:\n")[0].rstrip("\n") + "\n"  # a resumed run records its own
        atomic_write_text(path, text + yaml.safe_dump({"placement": placement}, sort_keys=False))


def worker_runtime_env() -> dict[str, Any]:
    """The runtime env of every worker of the run (`init_ray`, on a new or a joined cluster alike).

    `RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`: by default Ray (ray/_private/utils.py,
    `set_visible_accelerator_ids`) leaves an actor that asks for no GPU with the CUDA_VISIBLE_DEVICES
    its node started with, every GPU of the node; the CPU actors (a ranker with `num_gpus=0`,
    retrieval, evidence) and the engines they start would then see, and may allocate on, the
    trainers' GPUs. With it Ray sets each actor's visible devices to its own GPUs, none for none
    (`.options(num_gpus=0)` included). Blanking CUDA_VISIBLE_DEVICES here instead would not do: a
    worker maps its GPU ids through the variable it started with, so a GPU actor would get none.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {"env_vars": {"PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
                         "TOKENIZERS_PARALLELISM": "false",
                         # Ray SIGKILLs an exiting worker's children, multiprocessing's resource tracker
                         # among them, and the engines' shared memory (~160 MB each) stays in /dev/shm;
                         # the actors' reapers end those children instead (coevo/core/lifetime.py).
                         "RAY_kill_child_processes_on_worker_exit": "0",
                         ZERO_GPUS_HIDE_ALL: "1",
                         **worker_env(), **worker_path_env(),
                         **{k: os.environ[k] for k in ("HF_HUB_OFFLINE",) if k in os.environ}},
            "worker_process_setup_hook": WORKER_SETUP_HOOK}


def init_ray(cfg: CoevoConfig) -> None:
    """Join `ray.address` or start a local cluster; the repo is importable in every worker.

    Logging (coevo/core/console.py): each worker first runs `setup_worker_logging`, which sends
    its output to run.log; Ray still forwards worker stderr to the driver (`log_to_driver`), which
    then carries only build progress (everything with log.level=debug). Ray's own driver-side
    records go to run.log, and a hub found unreachable by the preflight stays offline in workers.
    Caches and shared data reach the workers as the driver's absolute paths (hostpaths.py); an
    actor sees only the GPUs it asked for (`worker_runtime_env`).
    """
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"runtime_env": worker_runtime_env(), "include_dashboard": False, "log_to_driver": True,
                              "configure_logging": False}
    if cfg.ray.address:
        kwargs["address"] = cfg.ray.address
    else:
        # A new local cluster, never one already running on this machine (`ray start`, RAY_ADDRESS),
        # which ray.init() would otherwise join, and which refuses num_cpus.
        kwargs["address"] = "local"
        # Policies declare their CPU share; a local cluster must admit all actors even on 2 cores.
        need = math.ceil(sum(getattr(cfg, r).num_cpus for r in ("proposer", "solver", "ranker"))
                         + cfg.retrieval.replicas + 1)
        if cfg.ray.num_cpus is not None and cfg.ray.num_cpus < need:
            raise ValueError(f"config key ray.num_cpus={cfg.ray.num_cpus} is too small: the actors request {need} "
                             "CPUs (proposer/solver/ranker num_cpus + one per retrieval replica + evidence)")
        kwargs["num_cpus"] = cfg.ray.num_cpus or max(need, os.cpu_count() or 1)
    ray.init(**kwargs)
    route_library_loggers()  # ray.init's own records (cluster started, ...) to run.log, not the terminal
    install_stop_handlers()  # ray.init replaced our SIGTERM handler with one that aborts the driver
