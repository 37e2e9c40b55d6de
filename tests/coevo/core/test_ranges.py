"""Config ranges (on each field, coevo/core/ranges.py): every numeric key of every root has one, and it is enforced."""
import copy
import dataclasses
import functools
import math
import typing
from pathlib import Path

import pytest

from coevo.core.config import CONFIG_DIR, SCHEMAS, compose, to_object, validate_config
from coevo.core.ranges import FRACTION, NON_NEGATIVE, POSITIVE, UNIT, Range, check_ranges, range_of

ROOT_NAMES = {"coevo_schema": "coevo", "solve_schema": "solve", "eval_schema": "eval"}


def numeric_fields(schema: type, prefix: str = "") -> list[tuple[str, type, str, type]]:
    """(dotted key, declaring dataclass, field name, int or float) of every numeric field under `schema`.

    Walks the type annotations, not values, so optional fields that default to None count too.
    """
    out = []
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is typing.Union and len(args) == 1:
            hint = args[0]  # Optional[X] -> X
        if dataclasses.is_dataclass(hint):
            out += numeric_fields(hint, f"{prefix}{f.name}.")
        elif hint in (int, float):
            out.append((f"{prefix}{f.name}", schema, f.name, hint))
    return out


ALL_FIELDS = sorted({(ROOT_NAMES[name], key, cls, field, kind)
                     for name, schema in SCHEMAS.items() for key, cls, field, kind in numeric_fields(schema)},
                    key=lambda t: (t[0], t[1]))
# Each key once, checked in the first root that has it (the coevo root holds most).
FIELDS = list({key: (root, key, cls, field, kind) for root, key, cls, field, kind in reversed(ALL_FIELDS)}.values())


def test_the_walk_finds_the_schema_numbers():
    keys = {key for _, key, _, _, _ in FIELDS}
    assert {"solver.top_p", "run.save_every", "proposer.questions_per_step", "solver.reward.tool_cost",
            "ray.num_cpus", "solve.limit", "batch_size", "seed"} <= keys
    assert "resume" not in keys and "ranker.mode" not in keys  # bools and enumerations are not numbers
    assert len(keys) >= 50


@pytest.mark.parametrize("root,key,cls,field,kind", ALL_FIELDS, ids=[f"{r}:{k}" for r, k, *_ in ALL_FIELDS])
def test_every_numeric_field_has_a_range(root, key, cls, field, kind):
    assert range_of(cls, field) is not None, f"give {cls.__name__}.{field} a range: key(default, doc, range)"


def _outside(valid: Range, kind: type) -> list:
    """Values just outside `valid` (of the field's type), each side that is bounded."""
    step = 1 if kind is int else 0.5
    out = []
    if valid.low is not None:
        out.append(kind(valid.low) if valid.low_open else kind(valid.low - step))
    if valid.high is not None:
        out.append(kind(valid.high) if valid.high_open else kind(valid.high + step))
    return out


@functools.cache
def default_config(root: str):
    """The root's typed default config (composing takes ~0.2 s: once per root)."""
    return to_object(compose(config_name=root), SCHEMAS[f"{root}_schema"])


def with_value(root: str, key: str, value):
    cfg = copy.deepcopy(default_config(root))
    *path, name = key.split(".")
    setattr(functools.reduce(getattr, path, cfg), name, value)
    return cfg


@pytest.mark.parametrize("root,key,cls,field,kind", FIELDS, ids=[f"{r}:{k}" for r, k, *_ in FIELDS])
def test_out_of_range_values_are_refused_naming_key_value_and_range(root, key, cls, field, kind):
    valid = range_of(cls, field)
    values = _outside(valid, kind)
    assert values, f"{key}: a range bounded on neither side checks nothing"
    for value in values:
        with pytest.raises(ValueError) as err:
            validate_config(with_value(root, key, value))
        assert str(err.value) == f"config key {key}={value} is out of range: expected {valid.describe(field)}"


@pytest.mark.parametrize("override,message", [
    ("run.save_every=0", "config key run.save_every=0 is out of range: expected save_every >= 1"),
    ("solver.top_p=0", "config key solver.top_p=0.0 is out of range: expected 0 < top_p <= 1"),
    ("ray.num_cpus=0", "config key ray.num_cpus=0 is out of range: expected num_cpus >= 1"),
])
def test_ranges_apply_to_composed_overrides(override, message):
    with pytest.raises(ValueError) as err:
        to_object(compose([override]))
    assert str(err.value) == message


def test_a_numeric_field_without_a_range_is_an_error_not_a_pass():
    @dataclasses.dataclass
    class Unlisted:
        steps_per_moon: int = 3

    with pytest.raises(LookupError, match="config key steps_per_moon has no valid range"):
        check_ranges(Unlisted())


@pytest.mark.parametrize("valid,name,text,inside,outside", [
    (Range(1), "steps", "steps >= 1", [1, 7], [0, -1, math.inf, math.nan]),
    (POSITIVE, "clip_eps", "clip_eps > 0", [1e-9, 2.0], [0.0, -0.1]),
    (NON_NEGATIVE, "lr", "lr >= 0", [0.0, 3.0], [-1e-12, math.inf]),
    (FRACTION, "top_p", "0 < top_p <= 1", [1.0, 0.01], [0.0, 1.01, math.nan]),
    (UNIT, "gamma", "0 <= gamma <= 1", [0.0, 1.0, 0.5], [-0.5, 1.5]),
    (Range(0.5, 2, high_open=True), "x", "0.5 <= x < 2", [0.5, 1.9], [2, 0.4]),
])
def test_range_text_and_membership(valid, name, text, inside, outside):
    assert valid.describe(name) == text
    assert all(v in valid for v in inside) and not any(v in valid for v in outside)


def test_infinite_values_are_refused_as_not_finite():
    with pytest.raises(ValueError, match=r"^config key proposer\.lr=inf is out of range: expected a finite lr >= 0$"):
        to_object(compose(["proposer.lr=inf"]))


@pytest.mark.parametrize("root,overrides", [
    ("coevo", ["solver.group_size=1", "solver.frozen=true"]),
    ("coevo", ["proposer.group_size=1", "proposer.frozen=true"]),
    ("solve", ["solver.group_size=1", "solve.train=false"]),
    ("solve", ["proposer.group_size=1"]),  # coevo.solve has no proposer
    ("eval", ["solver.group_size=1", "proposer.group_size=1"]),  # evaluation trains nothing
])
def test_group_size_one_is_fine_where_the_role_does_not_train(root, overrides):
    to_object(compose(overrides, config_name=root), SCHEMAS[f"{root}_schema"])


@pytest.mark.parametrize("root,role", [("coevo", "proposer"), ("coevo", "solver"), ("solve", "solver")])
def test_group_size_one_is_refused_for_a_trained_role(root, role):
    with pytest.raises(ValueError, match=rf"^config key {role}\.group_size=1 is out of range for a trained {role}: "
                                         rf"expected group_size >= 2 .*set {role}\.frozen=true$"):
        to_object(compose([f"{role}.group_size=1"], config_name=root), SCHEMAS[f"{root}_schema"])


def test_solve_resumes_and_solve_train_false_trains_nothing():
    cfg = to_object(compose(["resume=true"], config_name="solve"), SCHEMAS["solve_schema"])
    assert cfg.resume and not cfg.solver.frozen and not cfg.ranker.frozen
    idle = to_object(compose(["solve.train=false"], config_name="solve"), SCHEMAS["solve_schema"])
    assert idle.solver.frozen and idle.ranker.frozen  # loaded without optimizer: its checkpoints hold no policy


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (Path(CONFIG_DIR) / "experiment").glob("*.yaml")))
def test_every_shipped_experiment_is_in_range(experiment):
    to_object(compose([f"experiment={experiment}"]))


@pytest.mark.parametrize("root", ["solve", "eval"])
def test_other_roots_defaults_are_in_range(root):
    validate_config(default_config(root))


@pytest.mark.parametrize("preset", sorted(p.stem for p in (Path(CONFIG_DIR) / "model").glob("*.yaml")))
def test_every_model_preset_is_in_range(preset):
    to_object(compose([f"proposer={preset}", f"solver={preset}", f"ranker={preset}"]))
