"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (SPEC §4).

The body is `coevo.orchestrate.solve`; config `configs/solve.yaml`. The run directory, its
checkpoints and `resume=true` follow `coevo.run`'s rules; it ends with `done: <run dir>` and
what the directory holds.

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates
    python -m coevo.solve run.dir=<run> solve.steps=10 resume=true  # continue a run from its newest checkpoint
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from coevo.core.cli import hydra_entry
from coevo.core.config import register_schema
from coevo.core.console import setup_logging
from coevo.core.lifetime import ensure_reaper
from coevo.orchestrate.persist import run_and_report
from coevo.orchestrate.solve import run_solve, to_solve_object
from coevo.orchestrate.stack import format_summary, load_stack_summary, model_roles

register_schema()


@hydra.main(config_path="../configs", config_name="solve", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    ensure_reaper()  # first: the engines inherit its token and die with this process, however it ends
    try:
        cfg = to_solve_object(dcfg)
    except ValueError as e:
        print(f"coevo.solve: error: {e}", file=sys.stderr)
        sys.exit(2)
    if cfg.dry_run:
        setup_logging(cfg.log.level)  # terminal only: a dry run writes no run.log
        print(format_summary(load_stack_summary(cfg, model_roles(cfg, proposer=False))), flush=True)
        return
    # run_solve: the lock on run.dir, run.log, the models located and the memory estimated, then the steps.
    run_and_report("coevo.solve", Path(cfg.run.dir), lambda: run_solve(cfg, dcfg))


if __name__ == "__main__":
    hydra_entry(main, "solve", to_solve_object)
