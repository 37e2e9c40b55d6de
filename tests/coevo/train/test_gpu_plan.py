"""The GPU memory planner (coevo/train/gpu_plan.py, `python -m coevo.plan`) on hand-computed numbers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from coevo.core.config import compose, to_object
from coevo.core.role_config import LoraConfig
from coevo.plan import main as plan_main
from coevo.train.gpu_plan import (
    CUDA_CONTEXT,
    GB,
    PlanError,
    check_gpu_plan,
    gpus_needed,
    plan_message,
    plan_roles,
)
from coevo.train.memory import activation_bytes
from coevo.train.shapes import ModelShape, adapter_parameters, meta_model, shape_of

ROOT = Path(__file__).resolve().parents[3]
SHAPE = ModelShape(params=1000, hidden=64, intermediate=128, layers=2, vocab=100, tied=True, kv_heads=1, head_dim=32)


def _tiny_meta():
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _cfg(*overrides):
    return to_object(compose(["experiment=smoke", "rollout=hf", *overrides]))


def test_adapter_parameters_are_rank_times_in_plus_out_of_each_target():
    model = _tiny_meta()
    # per layer: q 64+64, k 64+32, v 64+32, o 64+64, gate 64+128, up 64+128, down 128+64 = 1024
    assert adapter_parameters(model, LoraConfig(rank=8)) == 8 * 1024 * 2
    assert adapter_parameters(model, LoraConfig(rank=8, target_modules=["q_proj", "v_proj"])) == 8 * (128 + 96) * 2
    assert adapter_parameters(model, LoraConfig(rank=0)) == 0


def test_activations_with_and_without_checkpointing():
    layer = (18 * 64 + 3 * 128) * 2  # bf16 elements of one layer, per token
    no_logits = dict(logit_tokens=0)
    assert activation_bytes(SHAPE, 10, 2, False, 4, **no_logits) == 10 * 2 * layer
    assert activation_bytes(SHAPE, 10, 2, True, 4, **no_logits) == 10 * (2 * 64 * 4 + layer)


def test_trained_role_terms_by_hand():
    cfg = _cfg("solver.num_gpus=1", "solver.kl_coef=0.1", "solver.micro_batch_size=2", "solver.max_episode_tokens=100",
               "solver.max_turns=2", "solver.max_new_tokens=16", "cluster.gpu_memory_gb=1")
    (plan,) = plan_roles(cfg, shapes={"solver": (SHAPE, _tiny_meta())})
    assert plan.role == "solver" and plan.budget == int(1 * GB)
    assert plan.terms == {"weights": 4000, "reference": 2000, "grads": 4000, "optimizer": 8000,
                          "cuda_context": CUDA_CONTEXT}
    acts = activation_bytes(SHAPE, 2 * 100, 2, logit_tokens=0)
    logits = 2 * 32 * 100 * 4  # micro-batch 2 x (2 turns x 16 new tokens) x vocab x 4 B
    assert plan.transient["update"] == acts + logits + 1000 * 2  # + the autocast bf16 copy of the fp32 weights
    assert plan.total == sum(plan.terms.values()) + max(plan.transient.values())
    assert plan.fits is False  # the CUDA context alone is over 95 % of 1 GB
    record = plan.to_record()
    assert record["fits"] is False and record["total_per_gpu_gb"] == round(plan.total / GB, 2)


def test_lora_drops_the_reference_and_trains_only_the_adapter():
    cfg = _cfg("solver.num_gpus=1", "solver.kl_coef=0.1", "solver.lora.rank=8")
    (plan,) = plan_roles(cfg, shapes={"solver": (SHAPE, _tiny_meta())})
    adapter = 8 * 1024 * 2
    assert "reference" not in plan.terms
    assert plan.terms["weights"] == 4000 + 4 * adapter and plan.terms["grads"] == 4 * adapter
    assert plan.terms["optimizer"] == 8 * adapter


def test_a_sharded_role_divides_weights_grads_optimizer_and_reference_by_its_gpus():
    """solver.num_gpus=2 (FSDP2): the tiny Llama by hand. 80448 parameters: embeddings 100 x 64 (tied) = 6400,
    final norm 64, each layer q 4096 + k 2048 + v 2048 + o 4096 + gate/up/down 3 x 8192 + 2 norms 128 = 36992."""
    model = _tiny_meta()
    shape = shape_of(model)
    assert shape.params == 80448
    args = ("solver.kl_coef=0.1", "solver.micro_batch_size=2", "solver.max_episode_tokens=100", "solver.max_turns=2",
            "solver.max_new_tokens=16")
    (one,) = plan_roles(_cfg("solver.num_gpus=1", *args), shapes={"solver": (shape, model)})
    (two,) = plan_roles(_cfg("solver.num_gpus=2", *args), shapes={"solver": (shape, model)})
    assert one.terms == {"weights": 321792, "reference": 160896, "grads": 321792, "optimizer": 643584,
                         "cuda_context": CUDA_CONTEXT}
    # halves of each sharded term; rank 0 keeps a bf16 copy to generate with (engine=hf)
    assert two.terms == {"weights": 160896, "reference": 80448, "grads": 160896, "optimizer": 321792,
                         "cuda_context": CUDA_CONTEXT, "generation_copy": 160896}
    # the autocast copy of every weight (80448 x 2) becomes what FSDP gathers: root 6464 + 2 layers in bf16,
    # plus fp32 gradients of the root and one layer
    gathered = (6464 + 2 * 36992) * 2 + (6464 + 36992) * 4
    assert two.transient["update"] - one.transient["update"] == gathered - 80448 * 2
    assert two.transient["generation"] == one.transient["generation"]  # activations and KV cache stay per GPU
    assert "FSDP2 shards" in two.notes[0] and "no sharding" not in " ".join(two.notes)
    with pytest.raises(ValueError, match=r"solver.num_gpus=1.5: .*expected an integer"):
        plan_roles(_cfg("solver.num_gpus=1.5", *args), shapes={"solver": (shape, model)})
    with pytest.raises(ValueError, match=r"solver.lora.rank=8 with solver.num_gpus=2"):
        plan_roles(_cfg("solver.num_gpus=2", "solver.lora.rank=8", *args), shapes={"solver": (shape, model)})


def test_roles_on_the_cpu_are_not_planned_and_the_run_check_is_off_without_gpus():
    cfg = _cfg()
    assert plan_roles(cfg) == [] and check_gpu_plan(cfg) is None


def test_more_gpus_than_the_cluster_has_names_the_cluster_keys():
    cfg = _cfg("proposer.num_gpus=1", "solver.num_gpus=2", "ranker.num_gpus=0.5", "cluster.gpus_per_node=2")
    assert gpus_needed(cfg) == 4
    message = plan_message([], cfg)
    assert "ask for 4 GPUs" in message and "cluster.nodes x cluster.gpus_per_node = 1 x 2 = 2" in message


def test_headline_command_full_fine_tuning_does_not_fit_and_says_what_would():
    cfg = to_object(compose(["proposer=qwen3-4b", "solver=qwen2.5-7b", "ranker=qwen2.5-3b", "proposer.lora.rank=0",
                             "solver.lora.rank=0", "ranker.lora.rank=0", "proposer.gradient_checkpointing=false",
                             "solver.gradient_checkpointing=false", "ranker.gradient_checkpointing=false",
                             "proposer.num_gpus=1", "solver.num_gpus=1", "ranker.num_gpus=1"]))
    plans = {p.role: p for p in plan_roles(cfg)}
    solver = plans["solver"]
    # 7.616 B parameters: fp32 weights + fp32 grads + two fp32 moments = 16 B each; bf16 reference 2 B
    assert solver.terms["weights"] == 7_615_616_512 * 4 and solver.terms["optimizer"] == 7_615_616_512 * 8
    assert solver.terms["reference"] == 7_615_616_512 * 2 and not solver.fits
    assert any("solver.lora.rank=64" in w for w in solver.would_fit)
    with pytest.raises(PlanError, match="solver needs .* GB on one GPU"):
        check_gpu_plan(cfg)


SHIPPED_GPU_COMMANDS = [
    ["proposer=qwen3-4b", "solver=qwen2.5-7b"],  # the README's headline command
    ["proposer=qwen3-4b", "solver=qwen2.5-7b", "rollout=vllm"],
    ["experiment=paper_cosearch"],
    ["experiment=paper_zest"],
    # the two-node, full fine-tuning CoSearch placement of configs/experiment/paper_cosearch.yaml and docs/scale.md
    ["experiment=paper_cosearch", "cluster.nodes=2", "solver.num_gpus=8", "ranker.num_gpus=6", "ranker.lora.rank=0",
     "ranker.dtype=float32"],
]


@pytest.mark.parametrize("overrides", SHIPPED_GPU_COMMANDS, ids=lambda o: " ".join(o))
def test_shipped_gpu_commands_fit_the_default_node_as_written(overrides):
    cfg = to_object(compose(overrides))
    plans = plan_roles(cfg)
    assert plans and plan_message(plans, cfg) is None, plan_message(plans, cfg)
    assert gpus_needed(cfg) <= cfg.cluster.nodes * cfg.cluster.gpus_per_node


def test_generation_rows_bound_the_hf_kv_cache_and_sleep_mode_frees_the_engine_for_the_update():
    args = ("proposer=qwen3-4b", "solver=qwen2.5-7b", "proposer.num_gpus=0")
    every = {p.role: p for p in plan_roles(to_object(compose([*args, "solver.generation_rows=0"])))}["solver"]
    some = {p.role: p for p in plan_roles(to_object(compose([*args, "solver.generation_rows=8"])))}["solver"]
    # 4 questions x 4 candidates x G = 4 rollouts = 64 rows generated at once; 8 of them per call: an eighth
    assert every.transient["generation"] == 8 * some.transient["generation"]
    vllm = ("rollout=vllm", "proposer.num_gpus=0", "proposer=qwen3-4b", "solver=qwen2.5-7b")
    awake = {p.role: p for p in plan_roles(to_object(compose(list(vllm))))}["solver"]
    asleep = {p.role: p for p in plan_roles(to_object(compose([*vllm, "solver.sleep_mode=true"])))}["solver"]
    assert awake.terms["engine"] == asleep.transient["engine"] == int(0.35 * 80e9) and "engine" not in asleep.terms
    # the engine and the update no longer add up: the larger of the two counts
    assert awake.total - asleep.total == min(awake.terms["engine"], awake.transient["update"])


def test_public_configs_count_the_presets_parameters_offline():
    assert shape_of(meta_model("Qwen/Qwen2.5-7B-Instruct")).params == 7_615_616_512
    assert shape_of(meta_model("Qwen/Qwen2.5-3B-Instruct")).params == 3_085_938_688
    assert shape_of(meta_model("Qwen/Qwen3-4B")).params == 4_022_468_096


def test_plan_command_prints_one_json_line_per_gpu_role_and_exits_by_fit(capsys):
    assert plan_main(["experiment=smoke", "solver.num_gpus=1", "cluster.gpu_memory_gb=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["role"] for line in lines] == ["solver"] and json.loads(lines[0])["fits"] is True
    assert plan_main(["experiment=smoke", "solver.num_gpus=1", "cluster.gpu_memory_gb=0.5"]) == 1
    assert "Skip this check with run.plan_check=false" in capsys.readouterr().err
    assert plan_main(["experiment=smoke", "solver.model=no-such/model-xyz", "solver.num_gpus=1"]) == 2
    err = capsys.readouterr().err
    # asked the preflight way (one hub request, no retries): its message, with the local-copy override
    assert "solver.model=no-such/model-xyz" in err and "Use a local copy with solver.model=/local/dir" in err
    assert plan_main(["solver.nmu_gpus=1"]) == 2


@pytest.mark.slow
def test_run_refuses_a_plan_that_does_not_fit_before_anything_loads(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "coevo.run", "experiment=smoke", "ray.local=true", "solver.num_gpus=1",
           "cluster.gpu_memory_gb=0.5", f"run.dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "the GPU plan does not fit" in done.stderr and "solver needs" in done.stderr
    assert "asks for a GPU" not in done.stderr  # planned before the device check: no GPU is needed to be told
    assert not (tmp_path / "run" / "checkpoints").exists()
