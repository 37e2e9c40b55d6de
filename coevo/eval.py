"""`python -m coevo.eval`: evaluate a solver on QA benchmarks (body: `coevo.evaluate.harness`).

    python -m coevo.eval solver=smollm2-135m data=../shared/data/benchmarks/dev.jsonl mode=rag out=rag.json
    python -m coevo.eval --compare a.json b.json                         # side by side, deltas B - A
    python -m coevo.eval --help [group | block | key]                    # every key, documented

Ends with `done: <out>` and what the result holds. Start-up (checks first, then `dry_run=true`'s
plan or the evaluation) is coevo/startup.py's, shared with coevo.run and coevo.solve.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from omegaconf import DictConfig

from coevo.core.cli import EXIT_FAILED, EXIT_REFUSED, hydra_entry
from coevo.core.config import EvalRootConfig, register_schema
from coevo.evaluate.harness import run_eval, to_eval_object
from coevo.evaluate.metrics import compare_files, format_table, result_title
from coevo.orchestrate.stack import model_roles
from coevo.orchestrate.startup_checks import error_line
from coevo.startup import Command, hydra_main
from coevo.train.preflight import check_devices, check_models

register_schema()
log = logging.getLogger(__name__)


def _done(cfg: EvalRootConfig, result: dict[str, Any]) -> str:
    datasets = {name: m["n"] for name, m in result["metrics"].items() if name != "average"}
    counts = ", ".join(f"{name} {n}" for name, n in datasets.items())
    return (f"done: {cfg.out}\n  results      {sum(datasets.values())} questions ({counts}), mode {cfg.mode}, "
            f"ranker {cfg.ranker.mode}\n  compare with python -m coevo.eval --compare {cfg.out} <other result>.json")


def _checks(cfg: EvalRootConfig) -> None:
    """What eval checks before a model loads: every model located, and every num_gpus > 0 has a visible GPU."""
    if cfg.mode == "direct" and cfg.ranker.checkpoint:
        print("coevo.eval: note: mode=direct uses no ranker; ranker.checkpoint is ignored", file=sys.stderr)
    check_models(cfg, with_proposer=False)
    check_devices(cfg, with_proposer=False)


def _roles(cfg: EvalRootConfig) -> tuple[str, ...]:
    """The solver, and the ranker when it has a model and the mode retrieves."""
    return model_roles(cfg, proposer=False, ranker=cfg.mode != "direct")


def _real_run(cfg: EvalRootConfig, dcfg: DictConfig) -> None:
    """`run_eval`, then the metrics table and the done lines; exit 1 (traceback logged) when it fails."""
    try:
        result = run_eval(cfg)
    except Exception as e:  # noqa: BLE001  the traceback is logged; the last line still says what happened
        log.exception("coevo.eval stopped on an error")
        print(f"done: {cfg.out} (stopped on an error: {error_line(e)}; nothing written)", file=sys.stderr)
        sys.exit(EXIT_FAILED)
    print(format_table(result["metrics"], result_title(result)))
    print(_done(cfg, result), flush=True)


COMMAND: Command[EvalRootConfig] = Command(
    prog="coevo.eval", validate=to_eval_object, checks=_checks, roles=_roles, run=_real_run)


_hydra_main = hydra_main(COMMAND, "eval")


def main(argv: Optional[list[str]] = None) -> None:
    """CLI: `--compare A B`, or Hydra overrides (checked, composed and validated before Hydra runs)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--compare"]:
        if len(args) != 3:
            sys.exit("usage: python -m coevo.eval --compare A.json B.json")
        try:
            print(compare_files(args[1], args[2]))
        except (OSError, ValueError) as e:  # a missing or foreign file: say which, no traceback
            print(f"coevo.eval: error: --compare: {e}", file=sys.stderr)
            sys.exit(EXIT_REFUSED)
        return
    hydra_entry(_hydra_main, "eval", to_eval_object, args)


if __name__ == "__main__":
    main()
