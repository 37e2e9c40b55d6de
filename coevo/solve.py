"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (SPEC §4).

The body is `coevo.orchestrate.solve`; config `configs/solve.yaml`.

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from coevo.core.config import register_schema
from coevo.core.lifetime import ensure_reaper
from coevo.orchestrate.solve import run_solve, to_solve_object
from coevo.train.memory import MemoryBudgetError, check_run_memory

register_schema()


@hydra.main(config_path="../configs", config_name="solve", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    ensure_reaper()  # first: the engines inherit its token and die with this process, however it ends
    cfg = to_solve_object(dcfg)
    try:
        check_run_memory(cfg, with_proposer=False)
    except MemoryBudgetError as e:
        sys.exit(str(e))
    run_solve(cfg)


if __name__ == "__main__":
    main()
