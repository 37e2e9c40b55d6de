"""Benchmark scripts, each run as `python -m bench.<name>` from the repo root; each prints one JSON line."""
from __future__ import annotations

from typing import Sequence


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the bench's own options, the Hydra overrides after the first `--`); no `--`: no overrides."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]
