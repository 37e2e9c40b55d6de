"""What the config schema knows: every key, its type, and its one-line documentation.

- `check_override_keys` refuses a command-line override whose key is not in the schema, with
  or without `+`, before Hydra composes anything (Hydra's own refusal of `ranker.topk=5` advises
  `+ranker.topk=5`, which it then accepts as a new key beside the unchanged `ranker.top_k`).
  `check_known_keys` refuses a key of a composed config the schema does not know (a `+key`, or
  one a config file added). Both suggest the closest known key (difflib), or the new name of a
  key that moved into a nested block (`retrieval.index_type` -> `retrieval.faiss.index_type`).
- `schema_keys` lists every key with its type, documentation and range, all read from the
  field's `key(default, doc, range)` metadata (coevo/core/ranges.py; a nested block's doc
  defaults to its class docstring). coevo/core/cli.py renders them for `--help`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Collection, Optional, Sequence, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, OmegaConf

from coevo.core.ranges import DOC, RANGE, Range


@dataclass(frozen=True)
class SchemaKey:
    """One key of a schema: dotted path, type hint, documentation, the dataclass of a nested block, its range."""

    path: str
    hint: Any
    doc: str
    block: Optional[type] = None
    range: Optional[Range] = None  # the valid range of a number


def _optional_inner(hint: Any) -> Optional[Any]:
    """X of Optional[X]; None for any other hint."""
    if get_origin(hint) is Union:
        inner = [a for a in get_args(hint) if a is not type(None)]
        if len(inner) == 1 and len(get_args(hint)) == 2:
            return inner[0]
    return None


def _block_of(hint: Any) -> Optional[type]:
    hint = _optional_inner(hint) or hint
    return hint if isinstance(hint, type) and is_dataclass(hint) else None


def _is_mapping(hint: Any) -> bool:
    hint = _optional_inner(hint) or hint
    return get_origin(hint) is dict or hint is dict


def field_docs(cls: type) -> dict[str, str]:
    """{field: documentation} of every field of dataclass `cls`, inherited ones included (its `key(...)` doc)."""
    return {f.name: f.metadata.get(DOC, "") for f in fields(cls)}


def first_line(doc: Optional[str]) -> str:
    return (doc or "").strip().split("\n")[0]


def schema_keys(schema: type, prefix: str = "") -> list[SchemaKey]:
    """Every key of dataclass `schema` in declaration order, nested blocks right after their own key."""
    hints = get_type_hints(schema)
    out = []
    for f in fields(schema):
        block = _block_of(hints[f.name])
        doc = f.metadata.get(DOC) or (first_line(block.__doc__) if block else "")
        out.append(SchemaKey(prefix + f.name, hints[f.name], doc, block, f.metadata.get(RANGE)))
        if block is not None:
            out.extend(schema_keys(block, f"{prefix}{f.name}."))
    return out


def type_name(hint: Any) -> str:
    """`int`, `str | null`, `hf|vllm` (an enumeration's values), a block's class name."""
    inner = _optional_inner(hint)
    if inner is not None:
        return f"{type_name(inner)} | null"
    if isinstance(hint, type) and issubclass(hint, Enum):
        return "|".join(str(m.value) for m in hint)
    return getattr(hint, "__name__", str(hint))


# ---- unknown keys ----------------------------------------------------------------------------------

def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def closest_keys(key: str, schema: type) -> list[str]:
    """The known keys most like `key` (difflib): the one suggestion, or several equally near, or none.

    A key that moved into a nested block of its block is its new name (`retrieval.url` ->
    `retrieval.http.url`). Else first a key of the same block (`ranker.topk` -> `ranker.top_k`,
    ratio >= 0.6); else keys of any block with the nearest last part (ratio >= 0.8): the one whose block is most like
    `key`'s (`rankr.top_k` -> `ranker.top_k`), or all of them for a key without a block
    (`temprature` -> the three policies' `temperature`).
    """
    known = [k.path for k in schema_keys(schema)]
    parent, _, leaf = key.rpartition(".")
    moved = moved_key(key, known)
    if moved is not None:
        return [moved]
    if not parent or parent in known:
        siblings = [p for p in known if p.rpartition(".")[0] == parent]
        best = max(siblings, key=lambda p: _ratio(leaf, p.rpartition(".")[2]), default=None)
        if best is not None and _ratio(leaf, best.rpartition(".")[2]) >= 0.6:
            return [best]
    scored = [(round(_ratio(leaf, p.rpartition(".")[2]), 6), p) for p in known if not key.startswith(p + ".")]
    top = max((r for r, _ in scored), default=0.0)
    nearest = [p for r, p in scored if r == top and r >= 0.8]
    if parent and len(nearest) > 1:
        return [max(nearest, key=lambda p: _ratio(parent, p.rpartition(".")[0]))]
    return nearest


def moved_key(key: str, known: Collection[str]) -> Optional[str]:
    """The one known key that is `key` moved one block down (`retrieval.url` -> `retrieval.http.url`), else None."""
    parent, _, leaf = key.rpartition(".")
    if not parent:
        return None
    inside = [p for p in known if p.startswith(f"{parent}.") and p.endswith(f".{leaf}")
              and p.count(".") == key.count(".") + 1]
    return inside[0] if len(inside) == 1 else None


def unknown_key_error(key: str, schema: type) -> Optional[ValueError]:
    """None when `key` (dotted) is a key of `schema`; otherwise the error saying what is near and what is wrong."""
    node: Optional[type] = schema
    parts = key.split(".")
    names: list[str] = []
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the root"
        if node is None:
            problem = f"{where} has no sub-keys"
            break
        names = [f.name for f in fields(node)]
        if part not in names:
            problem = f"{part!r} is not a key of {where}; expected one of {names}"
            break
        hint = get_type_hints(node)[part]
        if _is_mapping(hint) and depth == len(parts) - 2:
            return None  # a free-form mapping (`solver.resources.node_a`): its keys are the user's
        node = _block_of(hint)
    else:
        return None
    near = closest_keys(key, schema)
    hint = ""
    moved = moved_key(key, [k.path for k in schema_keys(schema)])
    if moved is not None:
        problem = f"block {moved.rpartition('.')[0]} holds {parts[-1]!r}; {problem}"
    if near:
        hint = f"did you mean {near[0]!r}? " if len(near) == 1 else f"did you mean one of {near}? "
    return ValueError(f"unknown config key {key!r}: {hint}({problem}; --help lists every key)")


def override_key(item: str) -> Optional[str]:
    """The config key a command-line override sets (`+`, `++` and `~` stripped); None for a Hydra flag."""
    if item.startswith("-"):
        return None
    body = item.lstrip("+~")
    if "=" not in body and not item.startswith("~"):
        return None
    return body.split("=", 1)[0].strip()


def check_override_keys(overrides: Sequence[str], schema: type, groups: Collection[str]) -> None:
    """Raise ValueError for an override whose key `schema` does not know (with or without `+`).

    Config-group choices (`experiment=smoke`, `solver=qwen2.5-7b`, `proposer@x=...`) and `hydra.*`
    / `hydra/...` keys are Hydra's and pass through; Hydra checks them against configs/.
    """
    for item in overrides:
        key = override_key(item)
        if not key or key in groups or key.split(".")[0] == "hydra" or "@" in key or "/" in key:
            continue
        error = unknown_key_error(key, schema)
        if error is not None:
            raise error


def _config_paths(node: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every key in a composed config (as plain data), parents before their children."""
    out = []
    for key, child in node.items() if isinstance(node, dict) else []:
        out.append(f"{prefix}{key}")
        out.extend(_config_paths(child, f"{prefix}{key}."))
    return out


def check_known_keys(cfg: DictConfig, schema: type) -> None:
    """Raise ValueError for the first key of composed `cfg` that `schema` does not know (Hydra's own node aside)."""
    for path in _config_paths(plain(cfg)):
        if path.split(".")[0] == "hydra":
            continue
        error = unknown_key_error(path, schema)
        if error is not None:
            raise error


def config_groups(config_dir: str | Path) -> list[str]:
    """The config groups under `config_dir` (its sub-directories)."""
    return sorted(p.name for p in Path(config_dir).iterdir() if p.is_dir())


def plain(cfg: DictConfig) -> Any:
    """The composed config as plain data, interpolations left as written (`${rollout.engine}`)."""
    return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
