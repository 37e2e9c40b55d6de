"""`python -m coevo.solve`: CoSearch training of solver + ranker on labelled questions (docs/method.md §4).

The body is `coevo.orchestrate.solve_loop`; config `configs/solve.yaml`. The run directory, its
checkpoints and `resume=true` follow `coevo.run`'s rules; it ends with `done: <run dir>` and
what the directory holds. Start-up (checks first, then `dry_run=true`'s plan or the run) is
coevo/startup.py's, shared with coevo.run and coevo.eval.

    python -m coevo.solve                                       # SmolLM2 solver+ranker, wiki_mini dev
    python -m coevo.solve experiment=smoke solve.steps=1        # tiny random models
    python -m coevo.solve ranker.mode=oracle solve.train=false  # evaluate a baseline, no updates
    python -m coevo.solve run.dir=<run> solve.steps=10 resume=true  # continue a run from its newest checkpoint
"""
from __future__ import annotations

from coevo.core.cli import hydra_entry
from coevo.core.config import SolveRootConfig, register_schema
from coevo.orchestrate.solve_loop import run_solve, to_solve_object
from coevo.orchestrate.stack import model_roles
from coevo.orchestrate.startup_checks import dry_run_checks
from coevo.startup import Command, hydra_main

register_schema()


def _checks(cfg: SolveRootConfig) -> None:
    """coevo.run's dry-run checks without the proposer (and its evidence stage)."""
    dry_run_checks(cfg, with_proposer=False)


def _roles(cfg: SolveRootConfig) -> tuple[str, ...]:
    """The solver, and the ranker when it has a model."""
    return model_roles(cfg, proposer=False)


COMMAND: Command[SolveRootConfig] = Command(
    prog="coevo.solve", validate=to_solve_object, checks=_checks, roles=_roles, run=run_solve, owns_run_dir=True)
main = hydra_main(COMMAND, "solve")

if __name__ == "__main__":
    hydra_entry(main, "solve", to_solve_object)
