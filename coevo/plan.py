"""`python -m coevo.plan <the overrides of coevo.run>`: each GPU role's memory on one of its GPUs.

    python -m coevo.plan proposer=qwen3-4b solver=qwen2.5-7b ranker=qwen2.5-3b
    python -m coevo.plan experiment=paper_cosearch cluster.gpu_memory_gb=141 solver.lora.rank=64

Prints one JSON line per role with `num_gpus > 0` (coevo/train/gpu_plan.py and gpu_terms.py; GB
of 10^9 bytes, per GPU, rank 0 for a sharded role): the steady terms (weights, grads, optimizer,
reference, engine, engine_context, cuda_context, generation_copy) and transients (update,
generation, weight_sync), total_per_gpu_gb, gpu_budget_gb; `startup_peak_gb` and `startup_gb` (what
a rank holds while the trainer state is built, before any engine); `vllm_start` (engine=vllm:
free_gb when the engine starts, requested_gb, ok, and the rule: vLLM's own `request_memory`, or
the same inequality computed here when vLLM cannot be called, which `notes` also says; null for
the HF engine); `sync_gb` and `checkpoint_gb` (device and host of one weight sync and one save);
`host_gb` (rank 0's host RAM at start-up, sync, save); `generating_ranks` (the ranks that generate
rollouts, each its share: every rank of a sharded role but with vLLM in its own process; 1 for an
unsharded role); fits, would_fit, notes. From the models'
configs alone: nothing is loaded or downloaded (the shipped hub presets' public config values are
built in). Exit status 0 when every role fits (steady, at start-up, and vLLM would start) and the
cluster (`cluster.*`) has the GPUs they ask for, 1 when not (stderr says what would fit), 2 for a
configuration that does not compose.
The roles are placed as `coevo.run` places them on the GPU node (coevo/core/config.py
`resolve_placement`), whatever machine the plan is made on: `rollout.engine=auto` (the default) plans
vLLM for every role with a GPU, and an unset `ranker.num_gpus` takes the GPUs the other roles leave
(`ranker.num_gpus=0` keeps it on the CPU). stderr's `placement:` line, the one `coevo.run` says at
start, names each role's GPUs and engine and the GPUs taken of the cluster's.
`coevo.run` makes the same check before it starts anything (`run.plan_check`).
"""
from __future__ import annotations

import json
import sys
from typing import Optional, Sequence

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from coevo.core.config import compose, to_object
from coevo.train.gpu_plan import PlanError, plan_message, plan_roles
from coevo.train.preflight import placement_line


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The planner's command line; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__.strip())
        return 0
    try:
        cfg = to_object(compose(args, "coevo"))
        plans = plan_roles(cfg)
    except (ValueError, FileNotFoundError, HydraException, OmegaConfBaseException, PlanError) as e:
        print(f"coevo.plan: error: {e}", file=sys.stderr)
        return 2
    for plan in plans:
        print(json.dumps(plan.to_record()), flush=True)
    line = placement_line(cfg)
    if line:
        print(f"coevo.plan: {line}", file=sys.stderr)
    if not plans:
        print("coevo.plan: no role asks for a GPU (<role>.num_gpus > 0): coevo.run's RAM estimate applies instead",
              file=sys.stderr)
    message = plan_message(plans, cfg)
    if message:
        print(message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
