"""What every actor body and driver-side proxy shares: `call`, `where`, `limit_threads`.

Imports neither torch nor a model library: an actor process imports the module its class lives
in, and the retrieval actor (coevo/orchestrate/data_actors.py) should not pay seconds of start-up
and hundreds of MB for torch it never uses.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from coevo.orchestrate.cluster import ActorFailure
from coevo.orchestrate.hostpaths import HostPathError

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read by torch / numpy's BLAS when they first load


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


def limit_threads(num_cpus: float) -> int:
    """Give this actor process `num_cpus` compute threads (at least one); returns the count.

    Each actor gets its share of the cores; torch would otherwise use them all in every actor.
    A torch already imported (policy actors) is set directly, and the environment is left alone
    for the engine processes it starts; a torch imported later (a dense retriever's encoder,
    spaCy's thinc) reads the environment variables set here.
    """
    n = max(1, int(num_cpus))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    else:
        os.environ.update({key: str(n) for key in THREAD_ENV})
    return n
