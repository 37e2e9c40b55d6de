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
from coevo.train import gpu_terms
from coevo.train.gpu_plan import (
    CUDA_CONTEXT,
    GB,
    GpuPlan,
    PlanError,
    check_gpu_plan,
    gpus_needed,
    plan_message,
    plan_roles,
)
from coevo.train.gpu_terms import VLLM_RULE, engine_start
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
    """The smoke config with HF rollouts and the ranker kept on the CPU: the solver alone is planned."""
    return to_object(compose(["experiment=smoke", "rollout=hf", "ranker.num_gpus=0", *overrides]))


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
    ["proposer=qwen3-4b", "solver=qwen2.5-7b"],  # the README's headline command: vLLM, the ranker on 2 GPUs
    ["proposer=qwen3-4b", "solver=qwen2.5-7b", "rollout=hf"],
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
    args = ("proposer=qwen3-4b", "solver=qwen2.5-7b", "proposer.num_gpus=0", "rollout=hf")
    every = {p.role: p for p in plan_roles(to_object(compose([*args, "solver.generation_rows=0"])))}["solver"]
    some = {p.role: p for p in plan_roles(to_object(compose([*args, "solver.generation_rows=8"])))}["solver"]
    # 4 questions x 4 candidates x G = 4 rollouts = 64 rows generated at once; 8 of them per call: an eighth
    assert every.transient["generation"] == 8 * some.transient["generation"]
    vllm = ("rollout=vllm", "proposer.num_gpus=0", "proposer=qwen3-4b", "solver=qwen2.5-7b")
    awake = {p.role: p for p in plan_roles(to_object(compose(list(vllm))))}["solver"]
    asleep = {p.role: p for p in plan_roles(to_object(compose([*vllm, "solver.sleep_mode=true"])))}["solver"]
    assert awake.terms["engine"] == asleep.transient["engine"] == int(0.35 * 80e9) and "engine" not in asleep.terms
    # the engine and the update no longer add up: the larger of the two counts; but the engine wakes around the
    # sync's gather (weight_sync), which is then the largest transient
    sync = awake.sync["device"]
    assert awake.transient["weight_sync"] == sync and asleep.transient["weight_sync"] == sync + int(0.35 * 80e9)
    assert awake.total - asleep.total == awake.transient["update"] - sync


def test_public_configs_count_the_presets_parameters_offline():
    assert shape_of(meta_model("Qwen/Qwen2.5-7B-Instruct")).params == 7_615_616_512
    assert shape_of(meta_model("Qwen/Qwen2.5-3B-Instruct")).params == 3_085_938_688
    assert shape_of(meta_model("Qwen/Qwen3-4B")).params == 4_022_468_096


def test_plan_command_prints_one_json_line_per_gpu_role_and_exits_by_fit(capsys):
    assert plan_main(["experiment=smoke", "solver.num_gpus=1", "ranker.num_gpus=0", "cluster.gpu_memory_gb=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["role"] for line in lines] == ["solver"] and json.loads(lines[0])["fits"] is True
    assert plan_main(["experiment=smoke", "solver.num_gpus=1", "ranker.num_gpus=0", "cluster.gpu_memory_gb=0.5"]) == 1
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


# ---- start-up, vLLM's precondition, weight sync and checkpoints (coevo/train/gpu_terms.py) -----------------------

SOLVER_7B = 7_615_616_512
EMBED_7B = 152064 * 3584  # vocab x hidden: the 7B's largest parameter (untied: embeddings and LM head each)


def test_a_sharded_vllm_role_at_start_up_sync_and_save_by_hand():
    """The tiny Llama (80448 parameters, tied; largest parameter an MLP projection 64 x 128 = 8192) on 2 ranks."""
    model = _tiny_meta()
    shape = shape_of(model)
    args = ["experiment=smoke", "rollout=vllm", "solver.num_gpus=2", "solver.kl_coef=0.1", "cluster.gpu_memory_gb=4",
            "solver.gpu_memory_utilization=0.5", "ranker.num_gpus=0"]
    (plan,) = plan_roles(to_object(compose(args)), shapes={"solver": (shape, model)})
    # shards of fp32 weights (80448 x 4 / 2), bf16 reference (x 2 / 2), AdamW moments (x 8 / 2), no gradients;
    # the broadcast holds two of the largest parameter in fp32
    assert plan.startup == {"weights": 160896, "reference": 80448, "optimizer": 321792, "cuda_context": CUDA_CONTEXT,
                            "broadcast": 2 * 8192 * 4}
    assert plan.startup_peak == 628672 + CUDA_CONTEXT
    assert plan.sync == {"device": 2 * 8192 * 2, "host": 0}  # weight_sync=auto is inprocess on CUDA: no file
    assert plan.transient["weight_sync"] == 32768 and "engine_context" not in plan.terms  # the engine is in-process
    assert plan.checkpoint == {"device": 0, "host": 80448 * 12 // 2}  # each rank stages its own shards
    served = (80448 + 100 * 64) * 2  # untied (lm_head explicit) in bf16: what a tmpfs engine is staged
    # the loaded fp32 model only: an in-process engine starts on dummy weights and is synced, nothing staged
    assert plan.host == {"startup": 80448 * 4, "sync": 0, "checkpoint": 482688}
    # vLLM measures after the trainer state is built (the broadcast's buffers freed) and asks for 0.5 x 4 GB
    start = plan.engine_start
    assert (start.free, start.requested, start.ok) == (4 * 10**9 - 563136 - CUDA_CONTEXT, 2 * 10**9, True)
    assert start.rule.startswith(VLLM_RULE) and not start.fallback
    record = plan.to_record()
    assert record["startup_peak_gb"] == round(plan.startup_peak / GB, 2) and record["vllm_start"]["ok"] is True
    assert record["sync_gb"] == {"device": 0.0, "host": 0.0} and record["checkpoint_gb"]["host"] == 0.0

    (tmpfs,) = plan_roles(to_object(compose([*args, "solver.weight_sync=tmpfs"])), shapes={"solver": (shape, model)})
    assert tmpfs.sync == {"device": 32768, "host": served} and tmpfs.host["sync"] == served
    assert tmpfs.host["startup"] == 80448 * 4 + served  # its engine starts from the staged model
    # the engine in a process of its own: its CUDA context is taken before it measures, and held beside its share
    assert tmpfs.terms["engine_context"] == CUDA_CONTEXT and tmpfs.engine_start.free == start.free - CUDA_CONTEXT


def test_single_gpu_roles_at_start_up_sync_and_save_by_hand():
    args = ("solver.num_gpus=1", "solver.kl_coef=0.1")
    (full,) = plan_roles(_cfg(*args), shapes={"solver": (SHAPE, _tiny_meta())})
    # no broadcast, no gradients at start; the HF engine generates with the trained model: nothing to sync
    assert full.startup == {"weights": 4000, "reference": 2000, "optimizer": 8000, "cuda_context": CUDA_CONTEXT}
    assert full.sync == {"device": 0, "host": 0} and "weight_sync" not in full.transient
    assert full.checkpoint == {"device": 0, "host": 4000 + 8000} and full.host["startup"] == 4000
    assert full.engine_start is None and full.to_record()["vllm_start"] is None
    (lora,) = plan_roles(_cfg(*args, "solver.lora.rank=8"), shapes={"solver": (SHAPE, _tiny_meta())})
    adapter = 8 * 1024 * 2
    assert lora.checkpoint["host"] == adapter * 12  # the adapter in fp32 and its two moments, not the base
    (frozen,) = plan_roles(_cfg("solver.num_gpus=1", "solver.frozen=true"), shapes={"solver": (SHAPE, _tiny_meta())})
    assert frozen.checkpoint == {"device": 0, "host": 0} and frozen.sync == {"device": 0, "host": 0}
    # LoRA on vLLM: the merged weights are built whole (1000 - 100 x 64 tied embedding is negative on this
    # made-up shape, so the real tiny Llama: 80448 - 6400 non-embedding fp32 parameters + one layer's fp32 sum)
    model = _tiny_meta()
    vllm = to_object(compose(["experiment=smoke", "rollout=vllm", "solver.num_gpus=1", "solver.lora.rank=8",
                              "ranker.num_gpus=0"]))
    (merged,) = plan_roles(vllm, shapes={"solver": (shape_of(model), model)})
    assert merged.sync == {"device": (80448 - 6400) * 4 + 3 * 64 * 128 * 4, "host": 0}


def test_engine_start_is_vllms_own_rule_and_a_fallback_is_said(monkeypatch):
    total = 80 * 10**9
    at = engine_start(total, 48 * 10**9, 0.6)  # exactly what it asks for: vLLM starts
    assert (at.ok, at.requested, at.rule.startswith(VLLM_RULE)) == (True, 48 * 10**9, True)
    below = engine_start(total, 48 * 10**9 - 1, 0.6)
    assert not below.ok and below.requested == 48 * 10**9 and "GPU memory utilization" in below.message
    monkeypatch.setattr(gpu_terms, "_vllm_rule", lambda: (None, "ImportError: no module named vllm"))
    fallback = engine_start(total, 48 * 10**9 - 1, 0.6)
    assert fallback.fallback and not fallback.ok and "ImportError: no module named vllm" in fallback.rule
    assert engine_start(total, 48 * 10**9, 0.6).ok
    model = _tiny_meta()
    cfg = to_object(compose(["experiment=smoke", "rollout=vllm", "solver.num_gpus=1", "cluster.gpu_memory_gb=4",
                             "ranker.num_gpus=0"]))
    (plan,) = plan_roles(cfg, shapes={"solver": (shape_of(model), model)})
    assert any(n.startswith("vLLM start-up precondition computed here") for n in plan.notes)


def test_a_plan_vllm_would_refuse_to_start_is_refused_naming_the_role_and_keys():
    """A 7B solver on 2 GPUs asking vLLM for 0.6 of each: 7.6 B x (4 + 2 + 8) / 2 = 53.3 GB of trainer state
    and the CUDA context are held when the engine starts, leaving 25.6 GB free for 48 GB requested."""
    cfg = to_object(compose(["proposer=qwen3-4b", "solver=qwen2.5-7b", "rollout=vllm", "solver.num_gpus=2",
                             "solver.gpu_memory_utilization=0.6"]))
    plans = {p.role: p for p in plan_roles(cfg)}
    start = plans["solver"].engine_start
    assert start.free == 80 * 10**9 - SOLVER_7B * 14 // 2 - CUDA_CONTEXT and start.requested == 48 * 10**9
    assert not start.ok and not plans["solver"].fits and plans["proposer"].fits
    with pytest.raises(PlanError) as refused:
        check_gpu_plan(cfg)
    message = str(refused.value)
    assert "solver's vLLM engine would refuse to start (vllm.v1.worker.utils.request_memory" in message
    assert "set solver.gpu_memory_utilization <= 0.32 or a larger solver.num_gpus" in message
    assert "proposer" not in message.split("\n", 1)[1]  # the proposer fits: named nowhere but the header


def test_a_start_up_peak_over_the_gpu_names_the_num_gpus_key():
    plan = GpuPlan("solver", 2.0, int(GB), startup={"weights": int(GB)})
    assert plan.total == 0 and not plan.fits
    message = plan_message([plan], _cfg())
    assert "solver needs 1.0 GB per GPU at start-up (before any engine)" in message
    assert "a larger solver.num_gpus shards what it holds then" in message and "solver needs 0.0" not in message


@pytest.mark.parametrize("rollout", [[], ["rollout=vllm"], ["rollout=hf"]], ids=["auto", "vllm", "hf"])
def test_headline_plan_prints_start_up_sync_and_checkpoint_for_every_role(capsys, rollout):
    """The headline as typed plans vLLM (rollout.engine=auto on GPU roles) and the 135M ranker data-parallel on
    the 2 GPUs the proposer (2) and the solver (4) leave: 8 of the node's 8, said on stderr as coevo.run says it."""
    assert plan_main(["proposer=qwen3-4b", "solver=qwen2.5-7b", *rollout]) == 0
    out = capsys.readouterr()
    records = {r["role"]: r for r in map(json.loads, out.out.splitlines())}
    assert {role: r["gpus"] for role, r in records.items()} == {"proposer": 2.0, "solver": 4.0, "ranker": 2.0}
    vllm = rollout != ["rollout=hf"]
    engine = "vllm" if vllm else "hf"
    assert (f"coevo.plan: placement: proposer 2 GPUs {engine}, solver 4 GPUs {engine}, ranker 2 GPUs {engine}: "
            "8 of 8 GPUs (cluster.nodes x cluster.gpus_per_node = 1 x 8)") in out.err
    assert ("rollout.engine=auto: vllm on GPUs, hf on the CPU" in out.err) == (rollout == [])
    for record in records.values():
        assert record["startup_peak_gb"] > 0 and record["fits"] is True
        assert set(record["sync_gb"]) == set(record["checkpoint_gb"]) == {"device", "host"}
        assert set(record["host_gb"]) == {"startup", "sync", "checkpoint"}
        if vllm:
            assert record["vllm_start"]["ok"] is True and record["vllm_start"]["rule"].startswith(VLLM_RULE)
        else:
            assert record["vllm_start"] is None
    solver = records["solver"]
    # 4 ranks: shards of 7.6 B x (4 + 2 + 8) / 4, the context, two fp32 embeddings in flight (+ HF's bf16 copy)
    peak = SOLVER_7B * 14 // 4 + CUDA_CONTEXT + 2 * EMBED_7B * 4 + (0 if vllm else SOLVER_7B * 2)
    assert solver["startup_peak_gb"] == round(peak / GB, 2)
    assert solver["sync_gb"] == {"device": round(2 * EMBED_7B * 2 / GB, 2), "host": 0.0}
    assert solver["checkpoint_gb"] == {"device": 0.0, "host": round(SOLVER_7B * 12 / 4 / GB, 2)}
    if vllm:  # free when vLLM starts: 80 GB less the trainer state and context; 0.35 x 80 GB asked
        assert solver["vllm_start"]["free_gb"] == round((80e9 - SOLVER_7B * 14 // 4 - CUDA_CONTEXT) / GB, 2)
        assert solver["vllm_start"]["requested_gb"] == 28.0
