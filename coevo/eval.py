"""`python -m coevo.eval`: evaluate a solver on QA benchmarks (body: `coevo.evaluate.harness`).

    python -m coevo.eval solver=smollm2-135m data=../shared/data/benchmarks/dev.jsonl mode=rag out=rag.json
    python -m coevo.eval --compare a.json b.json                         # side by side, deltas B - A
"""
from __future__ import annotations

import sys
from typing import Optional

import hydra
from omegaconf import DictConfig

from coevo.core.config import register_schema
from coevo.core.console import report_error, setup_logging
from coevo.evaluate.harness import check_override_keys, run_eval, to_eval_object
from coevo.evaluate.metrics import compare_files, format_table, result_title
from coevo.train.preflight import PreflightError, check_models

register_schema()


@hydra.main(config_path="../configs", config_name="eval", version_base="1.3")
def _hydra_main(dcfg: DictConfig) -> None:
    try:
        cfg = to_eval_object(dcfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"coevo.eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    setup_logging(cfg.log.level)  # no run directory: the terminal only
    try:
        check_models(cfg, with_proposer=False)  # every model located before any loads
    except PreflightError as e:
        report_error("coevo.eval", e)
        sys.exit(2)
    if cfg.mode == "direct" and cfg.ranker.checkpoint:
        print("coevo.eval: note: mode=direct uses no ranker; ranker.checkpoint is ignored", file=sys.stderr)
    result = run_eval(cfg)
    print(format_table(result["metrics"], result_title(result)))
    print(f"wrote {cfg.out}")


def main(argv: Optional[list[str]] = None) -> None:
    """CLI: `--compare A B`, or Hydra overrides (checked for unknown keys first)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--compare"]:
        if len(args) != 3:
            sys.exit("usage: python -m coevo.eval --compare A.json B.json")
        try:
            print(compare_files(args[1], args[2]))
        except (OSError, ValueError) as e:  # a missing or foreign file: say which, no traceback
            print(f"coevo.eval: error: --compare: {e}", file=sys.stderr)
            sys.exit(2)
        return
    try:
        check_override_keys(args)
    except ValueError as e:
        print(f"coevo.eval: error: {e}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
