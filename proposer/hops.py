"""Which certified evidence path a candidate's question is written from (`evidence.hops`).

The evidence stage returns a target's certified paths longest first, the greedy branch first
within a length (evidence/paths.py `build_evidence_paths`); ZEST writes from the first one, and
so does `longest`. `sampled` draws a length uniformly among those available, and a number k asks
for exactly k hops (the hop curriculum sets k each step: proposer/curriculum.py).

Shorter paths come from longer ones: the last k hops of a certified path are a certified k-hop
path to the same target (the same sentences, a subset of its entities, each hop still starting
where the previous one ended). The builder itself keeps a 1-hop path only when a branch dies
after one hop, so without this a 1-hop level would have almost nothing to ask about.

A fixed k with no path of k hops or more rejects the candidate (`NO_PATH_OF_K_HOPS`, counted
with the other reasons) rather than falling back to a shorter path: a fallback would put
shorter tasks into a step that the curriculum reads as level k, and the proposer learns from
the penalty that its target cannot carry k hops.
"""
from __future__ import annotations

import random
from typing import Optional, Sequence

from coevo.core.choices import PathLength
from coevo.core.types import EvidencePath

NO_PATH_OF_K_HOPS = "no_path_of_k_hops"  # reason code: certified paths exist, none of the fixed k hops


def paths_of_length(found: Sequence[EvidencePath], k: int) -> list[EvidencePath]:
    """The distinct k-hop paths in `found`: each path of at least k hops cut to its last k, in `found`'s order."""
    out: list[EvidencePath] = []
    seen: set[tuple] = set()
    for path in found:
        if k < 1 or len(path) < k:
            continue
        cut = path if len(path) == k else EvidencePath(path.target, tuple(path.hops[-k:]))
        if cut.hops not in seen:  # two branches can share their last hops
            seen.add(cut.hops)
            out.append(cut)
    return out


def choose_path(found: Sequence[EvidencePath], hops: PathLength | int,
                rand: random.Random) -> Optional[EvidencePath]:
    """The path call 2 writes from, or None when `found` holds nothing of the length asked for.

    `rand` is drawn from only for `sampled` with at least one path, so a step's other choices
    do not shift the draws.
    """
    if not found:
        return None
    if isinstance(hops, int):
        k = hops
    elif hops == PathLength.sampled:
        k = rand.randint(1, max(len(p) for p in found))  # every length up to the longest is available
    else:
        return found[0]
    chosen = paths_of_length(found, k)
    return chosen[0] if chosen else None
