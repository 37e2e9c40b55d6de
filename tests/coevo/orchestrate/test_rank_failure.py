"""A rank of a sharded role dies inside a collective: the other rank raises within the group's timeout, with an
error naming the role, its rank and the call (coevo/train/rank_failure.py), never hanging past it."""
from __future__ import annotations

import json
import multiprocessing
import signal
import socket
import sys
from pathlib import Path

import pytest

from coevo.train.rank_failure import RankFailure, describe, named_rank

sys.path.insert(0, str(Path(__file__).parent))  # spawned ranks import their bodies from rank_death_ranks.py
import rank_death_ranks  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_rank_killed_mid_update_makes_the_other_raise_within_the_timeout_naming_role_and_rank(
        tiny_dir, tmp_path) -> None:
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=rank_death_ranks.rank_main, args=(r, port, str(tiny_dir), str(tmp_path)))
             for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=rank_death_ranks.TIMEOUT_S + 120)  # start-up, then at most the timeout
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        p.kill()
    assert not alive, f"ranks {alive} still ran: the survivor hung past the collective timeout"
    assert procs[1].exitcode == -signal.SIGKILL  # rank 1 died inside its update, as the OOM killer would end it
    survivor = json.loads((tmp_path / "rank0.json").read_text())
    assert survivor["seconds"] <= rank_death_ranks.TIMEOUT_S + 5, survivor
    assert survivor["error"].startswith("RankFailure: solver rank 0 of 2, update: "), survivor
    assert "another rank of the solver most likely died" in survivor["error"], survivor


def test_a_rank_error_is_named_and_a_collective_failure_explained() -> None:
    with pytest.raises(RankFailure) as caught:
        with named_rank("proposer", 1, 4, "save", 60):
            raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Connection closed by peer [10.0.0.2]:4711")
    assert str(caught.value) == (
        "proposer rank 1 of 4, save: RuntimeError: [gloo/transport/tcp/pair.cc:537] Connection closed by peer "
        "[10.0.0.2]:4711. A collective of the proposer's process group failed (it waits up to 60 s, "
        "cluster.collective_timeout_s, on the other ranks): another rank of the proposer most likely died (killed, "
        "out of memory, its node lost)")
    assert isinstance(caught.value.__cause__, RuntimeError)
    # Not a collective: named, not explained as one; a RankFailure passes through unchanged.
    assert describe("solver", 0, 2, "generate", ValueError("prompt too long"), 60) == (
        "solver rank 0 of 2, generate: ValueError: prompt too long")
    with pytest.raises(RankFailure, match="^inner$"):
        with named_rank("solver", 0, 2, "update"):
            raise RankFailure("inner")
