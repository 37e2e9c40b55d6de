"""`num_gpus > 0` never runs on the CPU: refused at start (entry points) and at load (`Policy.from_config`)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coevo.core.config import PolicyConfig, compose, to_object
from coevo.train import policy as policy_mod
from coevo.train.policy import Policy
from coevo.train.preflight import PreflightError, check_devices, cuda_devices, require_gpus

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as a CPU-only one, also where the suite runs on a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_devices() == 0


def test_num_gpus_without_a_visible_gpu_is_refused_at_start_naming_the_key(no_cuda):
    check_devices(to_object(compose()))  # the CPU defaults: num_gpus 0 everywhere
    with pytest.raises(PreflightError, match=r"config key solver.num_gpus=4 asks for a GPU but this machine shows no "
                                             r"CUDA device.*expected a visible GPU or solver.num_gpus=0"):
        check_devices(to_object(compose(["solver=qwen2.5-7b"])))
    with pytest.raises(PreflightError, match="config key ranker.num_gpus=0.5 asks for a GPU"):
        check_devices(to_object(compose(["ranker.num_gpus=0.5"])), with_proposer=False)
    # An external Ray cluster's GPUs are not this machine's: the actors' own load refuses there instead.
    check_devices(to_object(compose(["solver=qwen2.5-7b", "ray.address=auto"])))
    with pytest.raises(PreflightError, match="solver.num_gpus=4"):  # coevo.solve loads everything here
        check_devices(to_object(compose(["solver=qwen2.5-7b", "ray.address=auto"])), with_proposer=False)


def test_more_gpus_than_visible_are_refused():
    require_gpus("solver", 1, visible=1)
    require_gpus("solver", 0, visible=0)
    with pytest.raises(PreflightError, match=r"config key ranker.num_gpus=2 asks for more GPUs than the 1 visible "
                                             r"here; expected ranker.num_gpus <= 1"):
        require_gpus("ranker", 2, visible=1)


def test_from_config_never_keeps_a_gpu_policy_on_the_cpu(no_cuda, monkeypatch, tiny_dir):
    def no_load(*args, **kwargs):
        raise AssertionError("weights read before the device check")

    monkeypatch.setattr(policy_mod, "load_model_and_tokenizer", no_load)
    cfg = PolicyConfig(preset="t", model=str(tiny_dir), engine="hf", kl_coef=0.0, num_gpus=1)
    with pytest.raises(PreflightError, match="config key solver.num_gpus=1 asks for a GPU"):
        Policy.from_config(cfg, "solver")


def test_run_with_num_gpus_on_a_cpu_machine_stops_at_start(tmp_path):
    if cuda_devices():
        pytest.skip("this machine has a GPU")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "coevo.run", "experiment=smoke", "ray.local=true",
                           "solver.num_gpus=1", f"run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("coevo.run: error: config key solver.num_gpus=1 asks for a GPU")
    assert proc.stderr.count("\n") == 1  # one line, no traceback
