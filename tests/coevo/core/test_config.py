"""Hydra config: presets, typed schema, errors naming the key and the valid choices."""
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from coevo.core.config import (
    CONFIG_DIR,
    SCHEMAS,
    EvalRootConfig,
    PolicyConfig,
    RankerMode,
    SolveRootConfig,
    compose,
    register_schema,
    to_object,
)

ROLES = ("proposer", "solver", "ranker")


def test_default_and_presets():
    cfg = to_object(compose())
    assert cfg.proposer.preset == "smollm2-135m" and cfg.corpus.name == "vital_articles"
    assert cfg.retrieval.backend == "bm25s" and cfg.solver.engine == "hf"
    big = to_object(compose(["proposer=qwen3-4b", "solver=qwen2.5-7b"]))
    assert big.proposer.model == "Qwen/Qwen3-4B" and big.solver.model == "Qwen/Qwen2.5-7B-Instruct"
    assert big.solver.dtype == "float32"  # trainable: fp32 master weights (bf16 compute on CUDA)


def test_smoke_experiment():
    cfg = to_object(compose(["experiment=smoke"]))
    assert {cfg.proposer.model, cfg.solver.model, cfg.ranker.model} == {"tiny-random"}
    assert cfg.experiment_name == "smoke"


def test_rollout_engine_interpolates():
    cfg = to_object(compose(["rollout=vllm"]))
    assert cfg.solver.engine == cfg.ranker.engine == "vllm"
    assert type(cfg.solver.engine) is type(cfg.rollout.engine)  # the interpolation yields the enum
    assert PolicyConfig.engine == "${rollout.engine}"


def test_wrong_preset_lists_choices():
    with pytest.raises(Exception, match=r"(?s)proposer/nope.*smollm2-135m.*tiny-random"):
        compose(["proposer=nope"])


def test_unknown_key_named():
    with pytest.raises(Exception, match="solver.nope"):
        compose(["solver.nope=1"])


@pytest.mark.parametrize("override,key,choices", [
    ("ranker.mode=best", "ranker.mode", "trainable, frozen, none, oracle"),
    ("ranker.grouping=x", "ranker.grouping", "semantic, by_question"),
    ("ranker.relevance=x", "ranker.relevance", "answer, evidence, both"),
    ("retrieval.backend=bm99", "retrieval.backend", "bm25s, rank_bm25, dense_minilm, dense_faiss, http"),
    ("retrieval.faiss.index_type=IVF", "retrieval.faiss.index_type", "flat, hnsw, ivf_pq"),
    ("solver.reward.correctness=acc", "solver.reward.correctness", "em, f1, f1_content"),
    ("proposer.reward=linear", "proposer.reward", "abs, quadratic, adversarial"),
    ("rollout.engine=tpu", "rollout.engine", "auto, hf, vllm"),
    ("solver.engine=tpu", "solver.engine", "auto, hf, vllm"),
    ("ranker.dtype=fp8", "ranker.dtype", "float32, bfloat16, float16"),
])
def test_bad_enum_values_name_key_and_choices(override, key, choices):
    with pytest.raises(ValueError, match=rf"(?s)expected one of \[{choices}\].*full_key: {key}"):
        compose([override])


@pytest.mark.parametrize("root,override,key,choices", [
    ("eval", "mode=agnet", "mode", "direct, rag, agent"),
    ("eval", "untagged=x", "untagged", "empty, raw"),
    ("solve", "ranker.mode=best", "ranker.mode", "trainable, frozen, none, oracle"),
])
def test_bad_enum_values_in_other_roots(root, override, key, choices):
    with pytest.raises(ValueError, match=rf"(?s)expected one of \[{choices}\].*full_key: {key}"):
        compose([override], config_name=root)


def test_bad_range_names_key():
    with pytest.raises(ValueError, match=r"ranker\.top_k"):
        to_object(compose(["ranker.top_k=20"]))


@pytest.mark.parametrize("overrides, message", [
    (["evidence.hops=4"], r"evidence\.hops='4' is not a path length: expected one of longest, sampled or a number "
                          r"of hops 1\.\.3"),
    (["evidence.hops=shortest"], r"evidence\.hops='shortest'"),
    (["proposer.curriculum.down=0.6"], r"proposer\.curriculum\.down=0\.6 is not below proposer\.curriculum\.up"),
    (["proposer.curriculum.enabled=true", "evidence.hops=2"], r"evidence\.hops=2 with proposer\.curriculum"),
    (["proposer.curriculum.enabled=true", "proposer.generation=direct"], r"generation=direct"),
    (["evidence.retrievable_k=0"], r"evidence\.retrievable_k=0 is out of range"),
])
def test_path_length_and_curriculum_keys_are_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        to_object(compose(overrides))


def test_cpu_compile_is_refused_at_start_where_the_update_shares_a_kv_cache():
    """The proposer shares its groups' prompts through a KV cache (no checkpointing): refused by key, at start."""
    with pytest.raises(ValueError, match=r"proposer\.cpu_compile=true.*proposer\.gradient_checkpointing=true"):
        to_object(compose(["experiment=small_learning", "proposer.cpu_compile=true"]))
    to_object(compose(["experiment=small_learning", "proposer.cpu_compile=true", "proposer.shared_prompt=false"]))
    to_object(compose(["proposer.cpu_compile=true", "proposer.frozen=true"]))  # never updated: nothing compiles


def test_path_length_values():
    assert to_object(compose(["evidence.hops=2"])).evidence.hops == "2"
    assert to_object(compose(["evidence.hops=4", "evidence.max_hops=4"])).evidence.hops == "4"
    assert to_object(compose(["evidence.hops=sampled"])).evidence.hops == "sampled"


def test_enums_behave_as_strings():
    cfg = to_object(compose(["experiment=fixed_ranker", "solver.reward.correctness=f1"]))
    assert cfg.ranker.mode is RankerMode.frozen and cfg.ranker.mode == "frozen"
    assert cfg.ranker.mode in ("frozen", "none") and cfg.ranker.has_model
    assert f"{cfg.ranker.mode}/{cfg.solver.dtype}" == "frozen/float32" and str(cfg.retrieval.backend) == "bm25s"
    assert json.dumps({"c": cfg.solver.reward.correctness}) == '{"c": "f1"}'
    assert {"f1": 1}[cfg.solver.reward.correctness] == 1
    # config.yaml of a run (the composed config) and a typed object written back: plain strings
    # (config.yaml keeps rollout.engine=auto as chosen; the typed object holds the engine it decided)
    for node, engine in ((compose(["experiment=fixed_ranker"]), "auto"), (OmegaConf.structured(cfg), "hf")):
        written = yaml.safe_load(OmegaConf.to_yaml(node, resolve=True))
        assert written["ranker"]["mode"] == "frozen" and type(written["ranker"]["mode"]) is str
        assert written["solver"]["engine"] == engine and written["retrieval"]["backend"] == "bm25s"


def test_eval_out_interpolates_the_mode_string():
    cfg = to_object(compose(["mode=rag"], config_name="eval"), EvalRootConfig)
    assert cfg.out.startswith("runs/eval/rag-") and cfg.mode == "rag"


@pytest.mark.parametrize("overrides,frozen", [
    ([], False), (["ranker.mode=frozen"], True), (["experiment=fixed_ranker"], True), (["ranker.frozen=true"], True),
    (["ranker.mode=none"], False),
])
def test_ranker_mode_frozen_loads_the_ranker_frozen(overrides, frozen):
    assert to_object(compose(overrides)).ranker.frozen is frozen
    solve = to_object(compose(overrides, config_name="solve"), SolveRootConfig)
    assert isinstance(solve, SolveRootConfig) and solve.ranker.frozen is frozen


def test_eval_loads_every_policy_frozen():
    cfg = to_object(compose(["ranker.mode=trainable"], config_name="eval"), EvalRootConfig)
    assert cfg.solver.frozen and cfg.ranker.frozen and cfg.proposer.frozen


def test_one_registration_for_all_roots():
    register_schema()
    stored = ConfigStore.instance().repo
    assert {f"{name}.yaml" for name in SCHEMAS} <= set(stored)
    assert SCHEMAS["solve_schema"] is SolveRootConfig and SCHEMAS["eval_schema"] is EvalRootConfig


def _defaults(name):
    return yaml.safe_load((Path(CONFIG_DIR) / f"{name}.yaml").read_text())["defaults"]


def test_roots_share_one_defaults_list():
    for root, corpus in (("coevo", "vital_articles"), ("solve", "wiki_mini"), ("eval", "wiki_mini")):
        assert _defaults(root)[:5] == [f"{root}_schema", "common", {"corpus": corpus}, "_self_",
                                       {"experiment": None}]
    groups = [next(iter(d)) for d in _defaults("common")]
    assert groups == [*ROLES, "retrieval", "rollout"]


def test_role_presets_are_the_model_presets():
    models = sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml"))
    assert "tiny-random" in models and "smollm2-135m" in models
    for role in ROLES:
        assert sorted(p.stem for p in (Path(CONFIG_DIR) / role).glob("*.yaml")) == models
        for name in models:
            assert _defaults(f"{role}/{name}") == [{"/model@_here_": name}]
    cfg = compose([f"{role}=qwen2.5-7b" for role in ROLES])
    preset = yaml.safe_load((Path(CONFIG_DIR) / "model" / "qwen2.5-7b.yaml").read_text())
    for role in ROLES:
        assert {k: cfg[role][k] for k in preset} == preset


def test_learning_levers_default_to_todays_behaviour():
    cfg = to_object(compose([]))
    assert not cfg.proposer.invalid_penalty_by_stage and cfg.proposer.reward == "abs"
    assert cfg.ranker.reasoning and not cfg.ranker.prime_tag and not cfg.evidence.support_head
    assert not any(getattr(cfg, role).keep_zero_advantage for role in ("proposer", "solver", "ranker"))
    assert cfg.evidence.hops == "longest" and not cfg.proposer.curriculum.enabled and not cfg.evidence.retrievable
    assert not cfg.evidence.open_question and not cfg.evidence.answer_type


# Run 5's overrides in docs/learning.md (the command its curves come from), written out by hand.
RUN5_OVERRIDES = [
    "proposer.questions_per_step=4", "proposer.temperature=0.7", "proposer.grounding=5", "proposer.question_stop=true",
    "proposer.invalid_penalty_by_stage=true", "evidence.support_head=true", "ranker.prime_tag=true",
    "ranker.reasoning=false", "ranker.line_stop=true", "ranker.n_candidates=5", "ranker.passage_chars=160",
    "ranker.max_new_tokens=48", "solver.max_new_tokens=64", "solver.max_turns=3", "solver.max_searches=2",
    "solver.prime_tag=true", "proposer.kl_coef=0", "solver.kl_coef=0", "ranker.kl_coef=0", "solver.lr=3e-5",
    "ranker.lr=3e-5", "proposer.micro_batch_size=4", "solver.micro_batch_size=4", "ranker.micro_batch_size=4",
    "ranker.top_k=2", "ranker.grouping=by_question", "ranker.min_group_size=2",
]


# Levers the preset gained after run 5 (the issue "The solver learns to answer"): off by default.
AFTER_RUN5 = ["proposer.curriculum.enabled=true", "evidence.retrievable=true",
              # the step-time settings (vLLM rollouts inside the memory estimate)
              "rollout=vllm", "solver.gradient_checkpointing=true", "ranker.gradient_checkpointing=true",
              "proposer.max_prompt_tokens=512", "ranker.max_prompt_tokens=768",
              "evidence.open_question=true",  # after run 7
              "proposer.cpu_bf16_autocast=true", "solver.cpu_bf16_autocast=true", "ranker.cpu_bf16_autocast=true",
              "solver.cpu_compile=true", "ranker.cpu_compile=true",  # after run 9
              "evidence.answer_type=true",  # after the warm-started co-evolution probe
              "ray.local=true"]  # bench.learning's layout, now the preset's: it fits a 24 GB machine


def test_small_learning_preset_is_run_5s_configuration():
    run_dir = ["run.dir=runs/x"]  # the default run dir is a timestamp
    preset = dataclasses.asdict(to_object(compose(["experiment=small_learning"] + run_dir)))
    run5 = dataclasses.asdict(to_object(compose(RUN5_OVERRIDES + AFTER_RUN5 + run_dir)))
    assert preset.pop("experiment_name") == "small_learning"
    run5.pop("experiment_name")
    assert preset == run5
