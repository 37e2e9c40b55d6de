"""Hydra config: presets, typed schema, errors naming the key and the valid choices."""
import pytest

from coevo.core.config import compose, to_object


def test_default_and_presets():
    cfg = to_object(compose())
    assert cfg.proposer.preset == "smollm2-135m" and cfg.corpus.name == "vital_articles"
    assert cfg.retrieval.backend == "bm25s" and cfg.solver.engine == "hf"
    big = to_object(compose(["proposer=qwen3-4b", "solver=qwen2.5-7b"]))
    assert big.proposer.model == "Qwen/Qwen3-4B" and big.solver.model == "Qwen/Qwen2.5-7B-Instruct"
    assert big.solver.dtype == "bfloat16"


def test_smoke_experiment():
    cfg = to_object(compose(["experiment=smoke"]))
    assert {cfg.proposer.model, cfg.solver.model, cfg.ranker.model} == {"tiny-random"}
    assert cfg.experiment_name == "smoke"


def test_rollout_engine_interpolates():
    cfg = to_object(compose(["rollout=vllm"]))
    assert cfg.solver.engine == cfg.ranker.engine == "vllm"


def test_wrong_preset_lists_choices():
    with pytest.raises(Exception, match=r"(?s)proposer/nope.*smollm2-135m.*tiny-random"):
        compose(["proposer=nope"])


def test_unknown_key_named():
    with pytest.raises(Exception, match="solver.nope"):
        compose(["solver.nope=1"])


@pytest.mark.parametrize("override,key", [
    ("ranker.mode=best", "ranker.mode"),
    ("retrieval.backend=bm99", "retrieval.backend"),
    ("ranker.top_k=20", "ranker.top_k"),
    ("solver.reward.correctness=acc", "solver.reward.correctness"),
])
def test_bad_values_name_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        to_object(compose([override]))
