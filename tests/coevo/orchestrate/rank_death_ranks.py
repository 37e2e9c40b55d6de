"""Rank bodies for test_rank_failure.py (a module of its own: spawned processes import it by name)."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from coevo.core.config import PolicyConfig
from coevo.core.types import TrainSequence
from coevo.orchestrate.sharded_actors import ShardedWorker
from coevo.train.compiled import decoder_layers

TIMEOUT_S = 20.0  # cluster.collective_timeout_s of the test's process group


def batch() -> list[TrainSequence]:
    gen = torch.Generator().manual_seed(0)
    return [TrainSequence(torch.randint(5, 50, (9,), generator=gen).tolist(), [0] * 5 + [1] * 4, advantage=a)
            for a in (1.0, -1.0)]


def rank_main(rank: int, port: int, model_dir: str, out: str) -> None:
    """Both ranks start a `ShardedWorker` of the solver and update; rank 1 SIGKILLs itself as its second decoder
    layer starts its forward, i.e. inside the update, after the collectives of the first layer. Rank 0 records
    how long its update took to fail, and the error."""
    torch.manual_seed(0)
    cfg = PolicyConfig(preset="test", model=model_dir, engine="hf", lr=1e-2, micro_batch_size=2)
    worker = ShardedWorker(cfg, "solver", 0, rank, 2)
    worker.setup("127.0.0.1", port, "gloo", TIMEOUT_S)
    if rank == 1:
        layer = decoder_layers(worker._policy().policy.model)[1]
        layer.register_forward_pre_hook(lambda *_: os.kill(os.getpid(), signal.SIGKILL))
    started = time.monotonic()
    record: dict = {"error": None}
    try:
        worker.update(batch())
    except Exception as e:  # noqa: BLE001  what the survivor raises is the test's subject
        record = {"error": f"{type(e).__name__}: {e}"}
    record["seconds"] = time.monotonic() - started
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    sys.stdout.flush()
    os._exit(0)  # the group is broken on purpose: skip its teardown
