"""What coevo.run and coevo.solve keep and report: checkpoint period, the done report.

How a run ends (its exit codes): tests/coevo/orchestrate/test_startup_checks.py."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from coevo.orchestrate.persist import GPU_SAVE_EVERY, checkpoint_due, done_report, save_period, save_step
from coevo.train.checkpoint import complete_checkpoints


class SavedPolicy:
    def save(self, directory):
        Path(directory).mkdir(parents=True)
        (Path(directory) / "model.safetensors").write_text("w")
        (Path(directory) / "optimizer.pt").write_text("o")


def _run_dir(tmp_path: Path, steps: int) -> Path:
    run = tmp_path / "run"
    run.mkdir()  # a run's directory exists (claimed) before its first save
    actors = SimpleNamespace(trainable={"solver": SavedPolicy(), "ranker": SavedPolicy()})
    for step in range(steps):
        save_step(run, step, 4 * (step + 1), actors)
    (run / "metrics.jsonl").write_text("".join(f'{{"step": {n}}}\n' for n in range(steps)))
    (run / "config.yaml").write_text("seed: 0\n")
    return run


@pytest.mark.parametrize("save_every,steps,due", [
    (1, 3, [0, 1, 2]), (2, 5, [1, 3, 4]), (3, 3, [2]), (10, 4, [3]),  # always the last step
])
def test_checkpoint_period(save_every, steps, due):
    assert [s for s in range(steps) if checkpoint_due(s, steps, save_every)] == due


@pytest.mark.parametrize("overrides,with_proposer,period", [
    ([], True, 1),  # tiny models on the CPU: every step
    (["solver.num_gpus=1"], True, GPU_SAVE_EVERY),
    (["proposer.num_gpus=2"], True, GPU_SAVE_EVERY),  # a sharded role counts as a GPU role
    (["proposer.num_gpus=1", "ranker.num_gpus=0"], False, 1),  # coevo.solve loads no proposer
    (["ranker.num_gpus=1"], True, GPU_SAVE_EVERY),  # the smoke ranker is its own model
    (["solver.num_gpus=1", "run.save_every=3"], True, 3),  # an explicit value always wins
    (["run.save_every=1", "solver.num_gpus=1"], True, 1),
])
def test_the_checkpoint_period_default_depends_on_gpu_roles(overrides, with_proposer, period):
    from coevo.core.config import compose, to_object

    cfg = to_object(compose(["experiment=smoke", *overrides]))
    assert save_period(cfg, with_proposer) == period


def test_done_report_lists_what_the_run_dir_holds(tmp_path):
    run = _run_dir(tmp_path, 3)
    assert [c.name for c in complete_checkpoints(run)] == ["step_1", "step_2"]  # the two newest are kept
    ckpt = run / "checkpoints" / "step_2"
    assert done_report(run).splitlines() == [
        f"done: {run}",
        f"  metrics      3 steps in {run / 'metrics.jsonl'}",
        f"  checkpoints  step_1, step_2 in {run / 'checkpoints'} (resume=true continues from the newest)",
        f"  evaluate     python -m coevo.eval solver.checkpoint={ckpt / 'solver'} ranker.mode=trainable "
        f"ranker.checkpoint={ckpt / 'ranker'}",
        f"  config       {run / 'config.yaml'}",
    ]
    empty = tmp_path / "empty"
    assert done_report(empty, "stopped by SIGTERM") == f"done: {empty} (stopped by SIGTERM)\n  checkpoints  none"
