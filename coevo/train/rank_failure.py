"""Errors of one rank of a sharded role, named: which role, which rank, doing what.

A rank's collective (an FSDP all-gather in `update`, the gathered weight sync, a checkpoint's
barrier) waits for every other rank of the role's process group. When one of them dies (killed,
out of memory, its node lost) the others do not hang: each collective fails, at once when the
backend sees the peer's connection close (gloo), else after `cluster.collective_timeout_s` (the
group's timeout, `join_process_group`); NCCL's watchdog then ends the process itself. Such an
error says only "Timed out waiting 60000ms" or "Connection closed by peer": `named_rank` puts the
role and rank in front of it, with what it means, so that the run stops with a message a person
can act on (the driver names the dead rank: coevo/orchestrate/sharded_actors.py).
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator, Optional

# Words of a failed collective in torch's gloo and NCCL errors (DistError, or RuntimeError from gloo's transport).
COLLECTIVE = re.compile(r"timed out|timeout|connection (closed|reset)|broken pipe|gloo|nccl|peer", re.IGNORECASE)


class RankFailure(RuntimeError):
    """A sharded role's rank failed; the message starts with `<role> rank <r> of <n>, <what>:`."""


def describe(role: str, rank: int, world: int, what: str, error: BaseException, timeout_s: Optional[float]) -> str:
    """The message of `RankFailure` for `error`, raised on `rank` while doing `what`."""
    text = f"{role} rank {rank} of {world}, {what}: {type(error).__name__}: {error}"
    if COLLECTIVE.search(str(error)) or type(error).__name__.startswith("Dist"):
        wait = f"up to {timeout_s:g} s, cluster.collective_timeout_s" if timeout_s else "up to the group's timeout"
        text += (f". A collective of the {role}'s process group failed (it waits {wait}, on the other ranks): "
                 f"another rank of the {role} most likely died (killed, out of memory, its node lost)")
    return text


@contextmanager
def named_rank(role: str, rank: int, world: int, what: str, timeout_s: Optional[float] = None) -> Iterator[None]:
    """Raise whatever fails inside again as a `RankFailure` naming the role and rank (the cause kept)."""
    try:
        yield
    except RankFailure:
        raise
    except Exception as e:  # noqa: BLE001  re-raised, named: every failure of a rank is reported by its rank
        raise RankFailure(describe(role, rank, world, what, e, timeout_s)) from e
