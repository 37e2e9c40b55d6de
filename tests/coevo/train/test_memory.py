"""The peak-memory estimate (coevo/train/memory.py) on hand-computed numbers, and the check before a run."""
import pytest

from coevo.core.config import CoevoConfig, PolicyConfig, SolveRootConfig, compose, to_object
from coevo.train.memory import (
    ENGINE_RUNTIME,
    GIB,
    PROCESS_RUNTIME,
    MemoryBudgetError,
    ModelShape,
    Term,
    activation_bytes,
    budget_message,
    check_run_memory,
    cpu_rank_terms,
    estimate_text,
    generated_rows,
    generation_bytes,
    loaded_policies,
    peak_bytes,
    policy_terms,
    run_terms,
)
from coevo.train.shapes import meta_model, shape_of


def model_shape(model, checkpoint=None):
    return shape_of(meta_model(model, checkpoint))

SHAPE = ModelShape(params=1000, hidden=64, intermediate=128, layers=2, vocab=100, tied=True, kv_heads=1, head_dim=32)
# SmolLM2-135M-Instruct, as its config.json says (the test need not build the preset).
SMOLLM2 = ModelShape(params=134_515_008, hidden=576, intermediate=1536, layers=30, vocab=49152, tied=True,
                     kv_heads=3, head_dim=64)
SMOLLM2_ACTIVATIONS = 1536 * (30 * (18 * 576 + 3 * 1536) * 4 + 49152 * 4)  # 1 sequence of 1536 tokens
SMOLLM2_GENERATION = 1536 * (30 * 2 * 3 * 64 + 10 * 576 + 5 * 1536) * 4  # per row of 1536 tokens


def _policy(**kw):
    base = dict(preset="test", model="unused", engine="hf", dtype="float32", kl_coef=0.0, micro_batch_size=2)
    base.update(kw)
    return PolicyConfig(**base)


def _by_name(terms):
    return {t.name: t.bytes for t in terms}


def test_activation_bytes():
    # per token: 2 layers x (18 x 64 + 3 x 128) x 4 B + 100 x 4 B of fp32 logits = 12288 + 400
    assert activation_bytes(SHAPE, 20, 4) == 20 * 12688
    assert activation_bytes(SHAPE, 10, 2) == 10 * (6144 + 400)
    # logits at 3 positions only; checkpointing keeps 2 fp32 layer inputs (2 x 64 x 4) + one bf16 layer
    layer = (18 * 64 + 3 * 128) * 2
    assert activation_bytes(SHAPE, 10, 2, logit_tokens=3) == 10 * 6144 + 3 * 400
    assert activation_bytes(SHAPE, 10, 2, checkpointing=True, input_bytes=4) == 10 * (2 * 64 * 4 + layer) + 4000


def test_generation_bytes():
    # per token: KV 2 layers x 2 x 1 head x 32 + prefill 10 x 64 + 5 x 128 = 128 + 1280 elements
    assert generation_bytes(SHAPE, 4, rows=3, tokens=10) == 3 * 10 * 1408 * 4


def test_trainable_policy_terms():
    terms = _by_name(policy_terms("solver", _policy(kl_coef=0.01), SHAPE, tokens=10, engine_share_of=0, rows=3))
    assert terms == {"weights": 4000, "grads": 4000, "optimizer": 8000, "reference": 4000,
                     "activations": 2 * 10 * 12688, "generation": 3 * 10 * 1408 * 4}
    no_kl = _by_name(policy_terms("solver", _policy(dtype="bfloat16"), SHAPE, tokens=10, engine_share_of=0))
    assert no_kl["weights"] == 2000 and no_kl["optimizer"] == 4000 and "reference" not in no_kl


def test_a_role_on_cpu_ranks_adds_each_further_ranks_activations_generation_copy_and_rows():
    policy = _policy(kl_coef=0.01, cpu_ranks=3)
    own = policy_terms("solver", policy, SHAPE, tokens=10, engine_share_of=0, rows=3)
    # 2 more ranks x (fp32 copy 1000 x 4 + activations 2 x 10 x 12688 + rows 3 x 10 x 1408 x 4)
    assert _by_name(cpu_rank_terms("solver", policy, SHAPE, own)) == {"cpu_ranks": 2 * (4000 + 253760 + 168960)}
    assert cpu_rank_terms("solver", _policy(), SHAPE, own) == []  # one process
    assert cpu_rank_terms("solver", _policy(cpu_ranks=1), SHAPE, own) == []


def test_lora_and_checkpointing_policy_terms():
    from coevo.core.config import LoraConfig

    lora = LoraConfig(rank=2, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"])
    cfg = _policy(kl_coef=0.1, dtype="bfloat16", lora=lora, gradient_checkpointing=True)
    terms = _by_name(policy_terms("solver", cfg, SHAPE, tokens=10, engine_share_of=0, adapter=2048))
    adapter = 4 * 2048  # fp32
    with pytest.raises(ValueError, match="solver.lora.rank=2"):
        policy_terms("solver", cfg, SHAPE, tokens=10, engine_share_of=0)  # a LoRA role without its count
    # checkpointing keeps each layer's input (2 x 64) plus one layer's activations (18 x 64 + 3 x 128), bf16
    assert terms == {"weights": 2000, "adapter": adapter, "grads": adapter, "optimizer": 2 * adapter,
                     "activations": 2 * 10 * ((2 * 64 + 18 * 64 + 3 * 128) * 2 + 400)}  # no reference copy


def test_model_shape_of_an_adapter_checkpoint_is_the_base(tiny_dir, tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    assert model_shape(str(tiny_dir), checkpoint=str(tmp_path)) == model_shape(str(tiny_dir))


def test_frozen_and_vllm_policy_terms():
    frozen = policy_terms("ranker", _policy(frozen=True, kl_coef=0.1), SHAPE, tokens=10, engine_share_of=0)
    assert _by_name(frozen) == {"weights": 4000}
    vllm = _by_name(policy_terms("solver", _policy(engine="vllm", gpu_memory_utilization=0.05), SHAPE, tokens=10,
                                 engine_share_of=10_000_000))
    assert vllm["engine"] == 500_000 and vllm["engine_runtime"] == ENGINE_RUNTIME
    assert "generation" not in vllm  # the engine's share holds its KV cache
    assert vllm["sync_staging"] == 4000 + 100 * 64 * 4  # vLLM runs untied: lm_head staged too
    on_gpu = policy_terms("solver", _policy(engine="vllm"), SHAPE, tokens=10, engine_share_of=0, device="gpu")
    assert {t.name for t in on_gpu if t.device == "cpu"} == {"engine_runtime", "sync_staging"}


def test_peak_counts_the_largest_transient_term_once():
    terms = [Term("solver", "weights", 10), Term("solver", "activations", 7), Term("ranker", "activations", 5),
             Term("solver", "sync_staging", 3), Term("run", "runtime", 1), Term("solver", "optimizer", 100, "gpu")]
    assert peak_bytes(terms) == 10 + 1 + 7
    assert peak_bytes(terms, "gpu") == 100


def test_loaded_policies_follow_the_ranker_mode():
    cfg = CoevoConfig()
    assert list(loaded_policies(cfg)) == ["proposer", "solver", "ranker"]
    assert list(loaded_policies(cfg, with_proposer=False)) == ["solver", "ranker"]
    cfg.ranker.share_backbone = True  # a trainable ranker on the solver's own policy object
    assert list(loaded_policies(cfg)) == ["proposer", "solver"]
    cfg.ranker.mode = "oracle"
    assert list(loaded_policies(cfg)) == ["proposer", "solver"]


def test_the_default_run_fits_a_24_gb_machine():
    """Hand-computed: 3 trainable SmolLM2 policies (fp32, kl_coef 0.001), HF rollouts, Ray actors."""
    cfg = to_object(compose([]))
    shapes = {role: SMOLLM2 for role in ("proposer", "solver", "ranker")}
    terms = run_terms(cfg, shapes, memory_total=24 * GIB)
    weights = 134_515_008 * 4
    lasting = 3 * 5 * weights  # weights, grads, 2 AdamW moments, reference copy
    # The largest transient: 4 questions x 4 candidates accepted x 4 solver rollouts, all 1536 tokens.
    generation = 64 * SMOLLM2_GENERATION
    assert generation > SMOLLM2_ACTIVATIONS  # micro_batch_size 1 x solver.max_episode_tokens
    runtime = 6 * PROCESS_RUNTIME  # driver, 3 policy actors, retrieval, evidence
    assert peak_bytes(terms) == lasting + generation + runtime
    assert 20.2 * GIB < peak_bytes(terms) < 20.3 * GIB  # < 22 GiB available on an idle 24 GB machine
    local = run_terms(to_object(compose(["ray.local=true"])), shapes, memory_total=24 * GIB)
    assert peak_bytes(local) == lasting + generation + PROCESS_RUNTIME
    replicated = run_terms(to_object(compose(["retrieval.replicas=3"])), shapes, memory_total=24 * GIB)
    assert peak_bytes(replicated) == peak_bytes(terms) + 2 * PROCESS_RUNTIME  # two more retrieval processes


def test_solve_with_vllm_fits_a_24_gb_machine():
    cfg = to_object(compose(["rollout=vllm"], config_name="solve"), SolveRootConfig)
    terms = run_terms(cfg, {"solver": SMOLLM2, "ranker": SMOLLM2}, memory_total=24 * GIB, with_proposer=False)
    engines = 2 * (int(0.05 * 24 * GIB) + ENGINE_RUNTIME)
    lasting = 2 * 5 * 134_515_008 * 4
    assert peak_bytes(terms) == lasting + engines + SMOLLM2_ACTIVATIONS + PROCESS_RUNTIME
    assert peak_bytes(terms) < 15 * GIB
    hf = to_object(compose(["solve.batch_questions=16"], config_name="solve"), SolveRootConfig)
    terms = run_terms(hf, {"solver": SMOLLM2, "ranker": SMOLLM2}, memory_total=24 * GIB, with_proposer=False)
    assert peak_bytes(terms) == lasting + 64 * SMOLLM2_GENERATION + PROCESS_RUNTIME  # 16 questions x 4 rollouts


def test_check_refuses_naming_the_largest_terms_and_their_overrides(caplog):
    cfg = to_object(compose(["experiment=smoke", "rollout=vllm", "solver.kl_coef=0.1"]))
    with pytest.raises(MemoryBudgetError) as err:
        check_run_memory(cfg, available=GIB)
    msg = str(err.value)
    assert "GiB of RAM at its peak, but 1.0 GiB is available" in msg
    assert "run.runtime" in msg and "ray.local=true" in msg
    assert "engine_runtime" in msg and "rollout=hf" in msg
    assert "run.memory_check=false" in msg
    with caplog.at_level("INFO", logger="coevo.memory"):
        terms = check_run_memory(cfg, available=1000 * GIB)
    assert terms and f"memory: {estimate_text(terms, 1000 * GIB)}" in caplog.messages
    assert estimate_text(terms) == f"estimated peak {peak_bytes(terms) / GIB:.1f} GiB of RAM"
    cfg.run.memory_check = False
    assert check_run_memory(cfg, available=GIB) is None
    cfg.run.memory_check, cfg.ray.address = True, "10.0.0.1:6379"  # the actors use another machine's memory
    assert check_run_memory(cfg, available=GIB) is None


def test_model_shape_counts_parameters_without_loading_weights(tiny_dir, tiny):
    model, _ = tiny
    shape = model_shape(str(tiny_dir))
    assert shape.params == sum(p.numel() for p in model.parameters())
    cfg = model.config
    assert (shape.hidden, shape.intermediate, shape.layers, shape.vocab, shape.tied) == (
        cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size, True)
    assert (shape.kv_heads, shape.head_dim) == (1, 32)  # build_tiny_random: hidden 32, 1 head of 32, 1 KV head


def test_estimate_counts_the_exact_adapter_of_the_configured_model(tiny_dir):
    """A LoRA role's adapter, grads and AdamW state come from the meta model's own Linear layers."""
    from coevo.train.memory import estimate_run
    from coevo.train.shapes import adapter_parameters, meta_model

    cfg = to_object(compose(["experiment=smoke", f"solver.model={tiny_dir}", "solver.lora.rank=4"]))
    exact = adapter_parameters(meta_model(str(tiny_dir)), cfg.solver.lora)
    assert exact > 0
    solver = {t.name: t.bytes for t in estimate_run(cfg) if t.role == "solver"}
    assert solver["adapter"] == solver["grads"] == 4 * exact and solver["optimizer"] == 8 * exact


def test_refusal_suggests_the_micro_batch_that_fits():
    cfg = to_object(compose(["solver.micro_batch_size=4"], config_name="solve"), SolveRootConfig)
    terms = run_terms(cfg, {"solver": SMOLLM2, "ranker": SMOLLM2}, memory_total=24 * GIB, with_proposer=False)
    available = peak_bytes(terms) - 2 * SMOLLM2_ACTIVATIONS  # the solver's 4 sequences must become 2
    msg = budget_message(terms, cfg, available)
    assert "solver.activations: 11.41 GiB (micro_batch_size 4 x 1536 tokens)" in msg
    assert "shrink with solver.micro_batch_size=2 or a smaller solver.max_episode_tokens" in msg
    assert "ray.local=true" not in msg  # coevo.solve is one process already


def test_an_unreadable_model_config_skips_the_check(caplog):
    cfg = to_object(compose(["experiment=smoke", "solver.model=/nonexistent/model"]))
    assert check_run_memory(cfg, available=GIB) is None
    assert [r.levelname for r in caplog.records if "check skipped" in r.getMessage()] == ["WARNING"]


def test_generated_rows_per_entry_point():
    run = to_object(compose([]))  # 4 questions x 4 candidates; 4 rollouts each
    assert [generated_rows(run, r) for r in ("proposer", "solver", "ranker")] == [16, 64, 64]
    solve = to_object(compose(["solve.batch_questions=8"], config_name="solve"), SolveRootConfig)
    assert generated_rows(solve, "solver", with_proposer=False) == 32
