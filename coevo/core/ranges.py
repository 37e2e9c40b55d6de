"""How a config key is declared, and the check of every numeric key against its range.

Every schema field (coevo/core/config.py, role_config.py) is one line, `name: type = key(default,
doc, range)`: its type, default, one-line documentation (`--help` prints it: coevo/core/schema.py)
and, for a number, its valid range, all on the field (its `dataclasses.field` metadata). A nested
block is `block(SchemaClass)`. Rules that involve several keys (`ranker.top_k <= ranker.n_candidates`,
`group_size >= 2` for a trained role) live in `config.validate_config`; `check_ranges` fails on any
numeric field declared without a range, so a new field cannot skip its check.

Every value must also be finite: `inf` and `nan` parse as floats but are never a setting.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Optional

DOC, RANGE = "doc", "range"  # the metadata keys of a schema field


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval; None leaves that side unbounded."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False  # the bound `low` itself is outside the range
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self, name: str) -> str:
        """The range as a condition on `name`: `top_p` → "0 < top_p <= 1", `steps` → "steps >= 1"."""
        low = "" if self.low is None else f"{_num(self.low)} {'<' if self.low_open else '<='} "
        high = "" if self.high is None else f" {'<' if self.high_open else '<='} {_num(self.high)}"
        if low and not high:  # one-sided: the key first reads better ("steps >= 1")
            return f"{name} {'>' if self.low_open else '>='} {_num(self.low)}"
        return f"{low}{name}{high}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


AT_LEAST_1 = Range(1)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
UNIT = Range(0, 1)  # a share or threshold in [0, 1]
FRACTION = Range(0, 1, low_open=True)  # 0 < x <= 1


def key(default: Any, doc: str, range: Optional[Range] = None) -> Any:  # noqa: A002  (the field's `range`)
    """A schema field: `default` (a list or dict is copied for each instance), its doc and its valid range."""
    metadata = {DOC: doc, RANGE: range}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def block(schema: type, doc: Optional[str] = None) -> Any:
    """A nested block of dataclass `schema`; its doc defaults to the first line of the class docstring."""
    text = doc or (schema.__doc__ or "").strip().split("\n")[0]
    return dataclasses.field(default_factory=schema, metadata={DOC: text, RANGE: None})


def range_of(schema: type, name: str) -> Optional[Range]:
    """The declared range of field `name` of dataclass `schema` (inherited fields included)."""
    found = {f.name: f for f in dataclasses.fields(schema)}.get(name)
    return None if found is None else found.metadata.get(RANGE)


def check_ranges(node: Any, prefix: str = "") -> None:
    """Raise ValueError naming key, value and valid range for the first numeric value out of range.

    `node` is a typed config (a dataclass instance); nested blocks are walked; None (an unset
    optional key) is not checked.
    """
    for f in dataclasses.fields(node):
        value, path = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, path + ".")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            valid = f.metadata.get(RANGE)
            if valid is None:  # a schema change without its range: a bug, never a silent pass
                raise LookupError(f"config key {path} has no valid range declared: give its field "
                                  "key(default, doc, range) (coevo/core/ranges.py)")
            if value not in valid:
                expected = ("" if math.isfinite(value) else "a finite ") + valid.describe(f.name)
                raise ValueError(f"config key {path}={value} is out of range: expected {expected}")
