"""The one start-up path of `coevo.run`, `coevo.solve` and `coevo.eval`: `start(command, dcfg)`.

In this order, for every command:
1. the reaper (coevo/core/lifetime.py) first: every process the command starts carries its token;
2. the config validated (`command.validate`): an invalid one is `<prog>: error: ...`, exit 2;
3. the checks a real run makes before it would start a model (`command.checks`; `startup_checks.run_checks`
   for the training commands: every model located, the GPU plan, visible GPUs, a large corpus's indexes,
   the memory estimate; their dry runs first ask whether run.dir could be claimed,
   `startup_checks.dry_run_checks`), then
4. `dry_run=true`: the plan, i.e. the loaded stack (`format_summary`), printed; exit 0.
   Otherwise: the real run, `command.run(cfg, dcfg)`; a command that owns a run directory runs it inside
   `startup_checks.run_and_report` (its done report, its exit codes).
A failed check ends the command as the real run ends on it (`startup_checks.exit_on_failed_check`): one
line `<prog>: error: ...`, exit 2 (run.dir, the model preflight, GPUs, a missing index), or the memory
budget's message, exit 1; the codes are coevo/orchestrate/startup_checks.py's. No model, tokenizer or hub
download starts before the checks pass, dry run or not.

A command that owns a run directory (`owns_run_dir`: coevo.run, coevo.solve) makes the checks of
step 3 inside its real run, once it holds run.dir's lock, so they are logged in run.log
(`coevo.orchestrate.startup_checks.open_run`, through the same `run_checks`); its dry run makes them here
and writes nothing. Every other command sets up terminal logging and makes them here in both cases.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

import hydra
from omegaconf import DictConfig

from coevo.core.cli import EXIT_REFUSED
from coevo.core.config import CONFIG_DIR, CoevoConfig
from coevo.core.console import setup_logging
from coevo.core.lifetime import ensure_reaper
from coevo.orchestrate.stack import format_summary, load_stack_summary
from coevo.orchestrate.startup_checks import exit_on_failed_check, run_and_report

C = TypeVar("C", bound=CoevoConfig)


@dataclass(frozen=True)
class Command(Generic[C]):
    """What differs between the entry points; `start` does the rest.

    prog: `coevo.<command>`, the prefix of its error lines.
    validate: composed DictConfig -> typed, validated config (ValueError / FileNotFoundError when invalid).
    checks: every check the real run makes before it would start a model (raises PreflightError,
        IndexNotBuilt or MemoryBudgetError); loads nothing and downloads nothing.
    roles: the roles whose models the dry run's plan loads, for a config.
    run: the real run (it ends the process with its own exit code on failure).
    owns_run_dir: the real run claims run.dir and makes `checks` itself once it holds it (see the module doc);
        `start` runs it inside `run_and_report` (the done report, the exit codes of a stopped run).
    """

    prog: str
    validate: Callable[[DictConfig], C]
    checks: Callable[[C], Any]
    roles: Callable[[C], tuple[str, ...]]
    run: Callable[[C, DictConfig], object]
    owns_run_dir: bool = False


def checked(prog: str, checks: Callable[[C], Any], cfg: C) -> None:
    """`checks(cfg)`; on a failed check, end the process as the real run does (see the module doc)."""
    with exit_on_failed_check(prog):
        checks(cfg)


def dry_run_plan(cfg: CoevoConfig, roles: tuple[str, ...]) -> str:
    """What `dry_run=true` prints once the checks pass: the roles' models, the corpus and the index, loaded."""
    return format_summary(load_stack_summary(cfg, roles))


def start(command: Command[C], dcfg: DictConfig) -> None:
    """Start `command` from its composed config `dcfg`: reaper, validation, checks, then dry-run plan or real run.

    Returns after a dry run that passed its checks (the caller's exit code 0) and after a real run that
    returned; exits with EXIT_REFUSED (2) on an invalid config, and as described in the module doc on a failed
    check.
    """
    ensure_reaper()  # first: Ray's processes and the engines inherit its token and die with this process
    try:
        cfg = command.validate(dcfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"{command.prog}: error: {e}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    if cfg.dry_run or not command.owns_run_dir:
        setup_logging(cfg.log.level)  # the terminal only: a dry run writes no run.log, eval has no run directory
        checked(command.prog, command.checks, cfg)
    if cfg.dry_run:
        print(dry_run_plan(cfg, command.roles(cfg)), flush=True)
        return
    if command.owns_run_dir:
        run_and_report(command.prog, Path(cfg.run.dir), lambda: command.run(cfg, dcfg))
    else:
        command.run(cfg, dcfg)


def hydra_main(command: Command[C], config_name: str) -> Callable[[], None]:
    """The `@hydra.main` function of `command` over `configs/<config_name>.yaml`: it calls `start`."""

    @hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base="1.3")
    def main(dcfg: DictConfig) -> None:
        start(command, dcfg)

    return main
