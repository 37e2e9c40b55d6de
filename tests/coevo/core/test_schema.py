"""Schema keys: unknown keys refused with the closest known key (with `+` or without), docs and ranges on the fields."""
from dataclasses import fields, is_dataclass
from typing import Optional, get_type_hints

import pytest
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from coevo.core.config import SCHEMAS, Engine, PolicyConfig, ProposerConfig, compose, to_object
from coevo.core.ranges import FRACTION, NON_NEGATIVE, Range
from coevo.core.schema import closest_keys, field_docs, override_key, schema_keys, type_name

ROOTS = {"coevo": SCHEMAS["coevo_schema"], "solve": SCHEMAS["solve_schema"], "eval": SCHEMAS["eval_schema"]}


@pytest.mark.parametrize("root,override,suggestion", [
    ("coevo", "ranker.topk=5", "ranker.top_k"),
    ("coevo", "+ranker.topk=5", "ranker.top_k"),  # Hydra alone accepts this one silently
    ("coevo", "++ranker.topk=5", "ranker.top_k"),
    ("coevo", "rankr.top_k=1", "ranker.top_k"),  # a typo in the block
    ("coevo", "top_k=3", "ranker.top_k"),  # the right key in the wrong place
    ("coevo", "+solver.reward.corectness=f1", "solver.reward.correctness"),
    ("solve", "+solve.step=3", "solve.steps"),
    ("eval", "dat=x", "data"),
])
def test_unknown_keys_are_refused_with_the_closest_known_key(root, override, suggestion):
    key = override.lstrip("+").split("=")[0]
    with pytest.raises(ValueError) as err:
        compose(["experiment=smoke", override], config_name=root)
    assert str(err.value).startswith(f"unknown config key '{key}': did you mean '{suggestion}'? (")
    assert "--help lists every key" in str(err.value)


# The keys that moved into retrieval's backend blocks: the flat name is refused with the new one.
MOVED = {**{k: f"retrieval.faiss.{k}" for k in (
    "encoder", "query_prefix", "passage_prefix", "normalize", "device", "encode_batch_size", "index_type",
    "index_path", "hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "ivf_nlist", "ivf_nprobe", "pq_m", "pq_bits")},
    **{k: f"retrieval.http.{k}" for k in ("url", "timeout_s", "retries", "backoff_s")}}


@pytest.mark.parametrize("old,new", sorted(MOVED.items()))
def test_a_flat_retrieval_key_is_refused_naming_its_block(old, new):
    with pytest.raises(ValueError) as err:
        compose(["experiment=smoke", f"retrieval.{old}=1"])
    block = new.rpartition(".")[0]
    assert str(err.value).startswith(f"unknown config key 'retrieval.{old}': did you mean '{new}'? "
                                     f"(block {block} holds '{old}'; '{old}' is not a key of retrieval; ")
    assert new in {k.path for k in schema_keys(ROOTS["coevo"])}


def test_the_message_names_where_the_key_is_missing_and_the_keys_there():
    with pytest.raises(ValueError) as err:
        compose(["+solver.reward.x=1"])
    assert str(err.value) == ("unknown config key 'solver.reward.x': ('x' is not a key of solver.reward; expected one "
                              "of ['correctness', 'echo_guard', 'tool_cost', 'format_penalty']; "
                              "--help lists every key)")
    with pytest.raises(ValueError, match=r"^unknown config key 'seed\.x': \(seed has no sub-keys; "):
        compose(["+seed.x=1"])


def test_a_key_added_after_composition_is_refused_by_to_object():
    # What a config file (or a hand-built DictConfig) adds past the command-line check.
    cfg = compose(["experiment=smoke"])
    OmegaConf.update(cfg, "ranker.topk", 5, force_add=True)  # how Hydra applies `+ranker.topk=5`
    assert cfg.ranker.topk == 5
    with pytest.raises(ValueError, match=r"^unknown config key 'ranker\.topk': did you mean 'ranker\.top_k'\?"):
        to_object(cfg)


def test_group_choices_and_hydra_keys_pass_the_check():
    cfg = compose(["experiment=smoke", "solver=tiny-random", "hydra.job.chdir=false", "ranker.top_k=2"])
    assert cfg.ranker.top_k == 2


def test_closest_keys():
    schema = ROOTS["coevo"]
    assert closest_keys("ranker.topk", schema) == ["ranker.top_k"]
    assert closest_keys("temprature", schema) == ["proposer.temperature", "solver.temperature", "ranker.temperature"]
    assert closest_keys("solver.reward.x", schema) == []  # a shared prefix alone is no likeness
    assert closest_keys("zzz", schema) == []


def schema_dataclasses(schema: type) -> list[type]:
    """The root and every dataclass reachable from its fields (read with typing, not with coevo's helpers)."""
    out, todo = [], [schema]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += [h for h in get_type_hints(cls).values() if isinstance(h, type) and is_dataclass(h)]
    return out


@pytest.mark.parametrize("root", sorted(ROOTS))
def test_every_field_of_every_schema_dataclass_has_documentation(root):
    classes = schema_dataclasses(ROOTS[root])
    assert len(classes) >= 10
    for cls in classes:
        docs, hints = field_docs(cls), get_type_hints(cls)
        # A nested block documents itself with its class docstring.
        missing = [f.name for f in fields(cls) if not docs.get(f.name) and not is_dataclass(hints[f.name])]
        assert missing == [], f"{cls.__name__}: fields without a doc in key(default, doc, range): {missing}"
        assert all(cls.__doc__ for cls in classes)


def test_field_docs_and_ranges_are_the_fields_metadata():
    docs = field_docs(PolicyConfig)
    assert docs["lr"] == "AdamW learning rate"
    assert docs["engine"] == "generation engine: auto (vllm with num_gpus > 0, else hf) | hf | vllm"  # interpolated
    assert docs["vllm_enforce_eager"] == "skip CUDA graph capture"
    keys = {k.path: k for k in schema_keys(ROOTS["coevo"])}
    assert keys["solver.lr"].range == NON_NEGATIVE and keys["solver.top_p"].range == FRACTION
    assert keys["retrieval.faiss.pq_bits"].range == Range(1, 16) and keys["retrieval.backend"].range is None
    assert keys["retrieval.http"].doc.startswith("retrieval.backend=http") and keys["solver.reward"].doc
    inherited = field_docs(ProposerConfig)
    assert inherited["lr"] == "AdamW learning rate" and inherited["group_size"].startswith("target candidates")


def test_type_names():
    assert type_name(int) == "int" and type_name(Optional[str]) == "str | null"
    assert type_name(Engine) == "auto|hf|vllm" and type_name(Optional[Engine]) == "auto|hf|vllm | null"


KEYS = [k.path for k in schema_keys(ROOTS["coevo"])]


@given(key=st.sampled_from(KEYS), prefix=st.sampled_from(["", "+", "++"]),
       value=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20))
def test_override_key_reads_the_key_of_any_override(key, prefix, value):
    assert override_key(f"{prefix}{key}={value}") == key
    assert override_key(f"~{key}") == key
    assert override_key(f"-{prefix}{key}={value}") is None  # a flag (`--cfg=job`), not an override
    assert override_key(f"{prefix}{key}") is None  # no value: a name (`--help ranker`), not an override
