"""A policy's checkpoint formats and their readers (docs/method.md §5.3): the full one and a sharded role's.

- full (`Policy.save`, coevo/train/policy.py): an HF model directory + `optimizer.pt` (torch's
  optimizer state_dict, keyed by parameter index);
- sharded (`save_sharded`, what coevo/train/sharded.py writes): torch.distributed.checkpoint
  (DCP). Every rank writes its own shards of the fp32 weights and AdamW state (`__<rank>_0.distcp`,
  rank 0 also `.metadata`), so no rank gathers a full copy; beside them what a reader needs
  without a process group: the HF `config.json` (+ `generation_config.json`), the tokenizer files
  and `sharded.json` (`MANIFEST_FORMAT`, the world size, the trained parameter names in optimizer
  order), whose presence marks the format. The ranks write into one temp sibling of the target,
  which rank 0 renames once every rank's shards are written (a reader finds the old directory or
  the whole new one); the directory must be on a filesystem every rank sees.
Readers:
- `load_sharded` (every rank together): either format into a sharded model and its optimizer; DCP
  re-shards, so a checkpoint of n ranks resumes on m;
- in one process, without a process group: `load_model_weights` (either format, a plain state
  dict), `read_optimizer_state` (either format, torch's optimizer state_dict) and `load_model` (a
  sharded checkpoint as an HF causal LM: `coevo.eval`'s `<role>.checkpoint`).
"""
from __future__ import annotations

import json
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from coevo.core.io import atomic_dir, atomic_write_text
from coevo.train.checkpoint import OPTIMIZER_FILE, SHARDED_MANIFEST

MANIFEST_FORMAT = 1  # version of sharded.json and of the DCP state's layout ({"model": ..., "optim": ...})
SHARDED = StateDictOptions(full_state_dict=False)  # each rank's own shards (DTensors), never a full copy


def trained_names(model: torch.nn.Module) -> list[str]:
    """Names of the optimizer's parameters in `Policy.build_optimizer`'s order: index i is names[i]."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def _by_index(optim: dict, names: list[str]) -> dict:
    """An optimizer state keyed by parameter name -> `torch.optim` keys (indices), as `Policy.save` writes it."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in optim["param_groups"]]
    for g in groups:  # a state that went through set_optimizer_state_dict has AdamW's betas as a list
        if isinstance(g.get("betas"), list):
            g["betas"] = tuple(g["betas"])
    return {"state": {index[n]: v for n, v in optim["state"].items()}, "param_groups": groups}


def _by_name(optim: dict, names: list[str]) -> dict:
    """The inverse of `_by_index`: `Policy.save`'s optimizer state keyed by parameter name."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]]
    return {"state": {names[int(i)]: v for i, v in optim["state"].items()}, "param_groups": groups}


def is_sharded_checkpoint(directory: str | Path) -> bool:
    """Whether `directory` holds a sharded checkpoint (its manifest), rather than the full format."""
    return (Path(directory) / SHARDED_MANIFEST).is_file()


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The manifest of sharded checkpoint `directory`; ValueError naming the file when it is not one we read."""
    path = Path(directory) / SHARDED_MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e}): expected a sharded checkpoint's manifest") from e
    found = manifest if isinstance(manifest, dict) else {}
    names = found.get("parameters")
    if found.get("format") != MANIFEST_FORMAT or not isinstance(found.get("world_size"), int) or \
            not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: expected {{\"format\": {MANIFEST_FORMAT}, \"world_size\": <int>, \"parameters\": "
                         f"[names]}}, found format {found.get('format')!r} (written by another coevo version?)")
    return found


def _check_names(directory: Path, names: list[str], role: str) -> None:
    """The checkpoint trained the same parameters, in the same order, as `names` (this role's model)."""
    saved = read_manifest(directory)["parameters"]
    if saved != names:
        first = next((i for i, (a, b) in enumerate(zip(saved, names)) if a != b), min(len(saved), len(names)))
        raise ValueError(f"{directory} holds the optimizer state of {len(saved)} parameters, this {role} trains "
                         f"{len(names)}; they differ from index {first} on: is it another model's checkpoint?")


def save_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 tokenizer: Any) -> Path:
    """Write `model`'s and `optimizer`'s shards to `directory` in the sharded format; every rank calls it.

    Rank 0 stages a temp sibling (config, tokenizer, manifest), every rank writes its shards into
    it, and once all have (a barrier) rank 0 renames it to `directory`; nobody returns before that.
    """
    rank = dist.get_rank()
    state = {"model": get_model_state_dict(model, options=SHARDED),
             "optim": get_optimizer_state_dict(model, optimizer, options=SHARDED)}
    with (atomic_dir(directory) if rank == 0 else nullcontext(None)) as tmp:
        staged = [str(tmp) if tmp is not None else None]
        dist.broadcast_object_list(staged, src=0)  # one temp dir for all (rank 0's random name)
        if tmp is not None:
            _write_reader_files(tmp, model, tokenizer, dist.get_world_size())
        dcp.save(state, storage_writer=dcp.FileSystemWriter(staged[0]))
        dist.barrier()  # every rank's shards are written: rank 0 may rename on leaving the block
    dist.barrier()  # nobody returns before the directory is in place
    return Path(directory)


def _write_reader_files(tmp: Path, model: torch.nn.Module, tokenizer: Any, world: int) -> None:
    """What a one-process reader needs beside the shards: HF config, tokenizer, manifest."""
    model.config.save_pretrained(tmp)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    manifest = {"format": MANIFEST_FORMAT, "world_size": world, "parameters": trained_names(model)}
    atomic_write_text(tmp / SHARDED_MANIFEST, json.dumps(manifest, indent=1))


def load_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 role: str) -> None:
    """Restore `directory`'s weights and optimizer state into a sharded `model`; every rank calls it.

    The sharded format: each rank reads what its shards need (any world size). The full format
    (`Policy.save`'s, an older run's): rank 0 reads it and broadcasts, each rank keeps its shards.
    Every rank checks the directory, so all fail together.
    """
    directory = Path(directory)
    names = trained_names(model)
    if is_sharded_checkpoint(directory):
        _check_names(directory, names, role)
        state = {"model": get_model_state_dict(model, options=SHARDED),
                 "optim": get_optimizer_state_dict(model, optimizer, options=SHARDED)}
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(directory)))
        set_model_state_dict(model, state["model"], options=SHARDED)
        set_optimizer_state_dict(model, optimizer, state["optim"], options=SHARDED)
        return
    _optimizer_file(directory, role)  # on every rank: all fail together
    weights: dict = {}
    optim: dict = {}
    if dist.get_rank() == 0:
        weights = load_model_weights(directory)
        optim = _by_name(read_optimizer_state(directory, role), names)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, optim, options=options)


def _optimizer_file(directory: Path, role: str) -> Path:
    """`optimizer.pt` of a full-format directory; FileNotFoundError when missing (a fresh AdamW changes the run)."""
    path = directory / OPTIMIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the trainable {role} cannot resume without its optimizer state")
    return path


def _read_dcp(directory: Path, top: str) -> Any:
    """Entry `top` ("model" or "optim") of a sharded checkpoint, whole, read in this process alone."""
    reader = dcp.FileSystemReader(str(directory))
    metadata = reader.read_metadata()
    tree: dict = {}
    for key, meta in metadata.state_dict_metadata.items():
        path = metadata.planner_data[key]  # where the flattened key sits in the saved nested state
        if path[0] == top:  # tensors read into empty full-size ones, other values (param_groups) replaced
            full = isinstance(meta, TensorStorageMetadata)
            _put(tree, path, torch.empty(meta.size, dtype=meta.properties.dtype) if full else None)
    if top not in tree:
        raise ValueError(f"{directory}: its DCP state holds no {top!r} entry; expected a sharded checkpoint")
    with warnings.catch_warnings():  # DCP warns that it loads in one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(tree, storage_reader=reader, no_dist=True)
    return tree[top]


def _put(tree: dict, path: tuple, value: Any) -> None:
    """tree[path[0]][path[1]]... = value, making dicts (str keys) and lists (int keys) on the way."""
    node: Any = tree
    for key, nxt in zip(path[:-1], path[1:]):
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = [] if isinstance(nxt, int) else {}
        elif key not in node:
            node[key] = [] if isinstance(nxt, int) else {}
        node = node[key]
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


def load_model_weights(directory: str | Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The weights of checkpoint `directory` (either format) as a plain state dict of `dtype` on the CPU."""
    directory = Path(directory)
    if is_sharded_checkpoint(directory):
        return {k: v.to(dtype) if v.is_floating_point() else v for k, v in _read_dcp(directory, "model").items()}
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).state_dict()


def read_optimizer_state(directory: str | Path, role: str, names: Optional[list[str]] = None,
                         device: torch.device | str = "cpu") -> dict:
    """The optimizer state of checkpoint `directory` (either format) as torch's state_dict (keyed by index).

    `names`: the trained parameter names of the model it is for, checked against a sharded
    checkpoint's (the full format records none). A full-format directory without `optimizer.pt`
    is a FileNotFoundError naming `role`.
    """
    directory = Path(directory)
    if is_sharded_checkpoint(directory):
        if names is not None:
            _check_names(directory, names, role)
        return _by_index(_read_dcp(directory, "optim"), read_manifest(directory)["parameters"])
    return torch.load(_optimizer_file(directory, role), map_location=device, weights_only=True)


def load_model(directory: str | Path, dtype: torch.dtype) -> Any:
    """Sharded checkpoint `directory` as a plain HF causal LM of `dtype`, in eval mode as `from_pretrained` gives."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    directory = Path(directory)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=dtype)
    model.load_state_dict(load_model_weights(directory, dtype))
    if (directory / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(directory)
    return model.eval()
