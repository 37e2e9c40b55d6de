"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (SPEC §4).

The body is `coevo.orchestrate.solve`; config `configs/solve.yaml`.

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from coevo.core.config import register_schema
from coevo.orchestrate.solve import run_solve, to_solve_object

register_schema()


@hydra.main(config_path="../configs", config_name="solve", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    run_solve(to_solve_object(dcfg))


if __name__ == "__main__":
    main()
