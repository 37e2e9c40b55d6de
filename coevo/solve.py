"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (SPEC §4).

The body is `coevo.orchestrate.solve`; config `configs/solve.yaml`.

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates
"""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from coevo.core.config import register_schema
from coevo.core.console import report_error, say, setup_logging
from coevo.core.lifetime import Stopped, ensure_reaper, stop_on_signals
from coevo.core.rundir import RunDirError, claim_run_dir, hydra_entries, remove_temp_files
from coevo.orchestrate.outputs import start_line
from coevo.orchestrate.solve import run_solve, to_solve_object
from coevo.train.memory import MemoryBudgetError, check_run_memory
from coevo.train.preflight import PreflightError, check_models

register_schema()


@hydra.main(config_path="../configs", config_name="solve", version_base="1.3")
def main(dcfg: DictConfig) -> None:
    ensure_reaper()  # first: the engines inherit its token and die with this process, however it ends
    try:
        cfg = to_solve_object(dcfg)
    except ValueError as e:
        print(f"coevo.solve: error: {e}", file=sys.stderr)
        sys.exit(2)
    run_dir = Path(cfg.run.dir)
    try:
        # Held throughout: metrics.jsonl of two runs would interleave. No resume here: no checkpoints.
        with stop_on_signals(), claim_run_dir(run_dir, resume=False, overwrite=cfg.run.overwrite,
                                              keep=hydra_entries(run_dir)):
            remove_temp_files(run_dir)
            setup_logging(cfg.log.level, run_dir)  # run.log, once the run owns run.dir
            sources = check_models(cfg, with_proposer=False)  # before any model loads
            say(start_line("coevo.solve", cfg, sources, check_run_memory(cfg, with_proposer=False)))
            run_solve(cfg)
    except (RunDirError, PreflightError) as e:
        report_error("coevo.solve", e)
        sys.exit(2)
    except MemoryBudgetError as e:
        sys.exit(str(e))
    except Stopped as e:
        print(f"coevo.solve: stopped by {e}; metrics of the finished steps are in {run_dir / 'metrics.jsonl'}",
              file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
