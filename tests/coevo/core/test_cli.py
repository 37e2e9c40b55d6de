"""Before Hydra runs: `--help` with every documented key, unknown keys, validation, dry_run writes nothing."""
import re
import sys
from dataclasses import fields, is_dataclass
from typing import get_type_hints

import pytest

from coevo.core.cli import DRY_RUN_OVERRIDES, format_help, hydra_entry
from coevo.core.config import SCHEMAS, compose, to_object

ROOTS = {"coevo": SCHEMAS["coevo_schema"], "solve": SCHEMAS["solve_schema"], "eval": SCHEMAS["eval_schema"]}


def documented_fields(schema: type, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, its documentation and range) of every leaf field, walking the dataclasses with typing alone."""
    out = []
    hints = get_type_hints(schema)
    for f in fields(schema):
        if is_dataclass(hints[f.name]):
            out += documented_fields(hints[f.name], f"{prefix}{f.name}.")
        else:
            valid = f.metadata["range"]
            out.append((prefix + f.name, f.metadata["doc"] + (f"  [range: {valid.describe(f.name)}]" if valid else "")))
    return out


@pytest.mark.parametrize("root", sorted(ROOTS))
def test_help_lists_every_schema_field_with_its_type_value_and_documentation(root):
    text = format_help(root, compose([], root, return_hydra_config=True))
    lines = text.splitlines()
    expected = documented_fields(ROOTS[root])
    assert len(expected) > 60
    for key, doc in expected:
        found = [ln for ln in lines if ln.startswith(f"  {key}: ")]
        assert len(found) == 1, key
        assert found[0].endswith(f"  # {doc}"), found[0]
    assert "  ranker.top_k: int = 3" in text if root != "eval" else "  mode: direct|rag|agent = agent" in text
    assert "  run.dir: str = runs/${now:%Y%m%d-%H%M%S}" in text  # as written: resolved when the run starts
    assert "  rollout=auto" in text and "options: auto, hf, vllm" in text
    # Grouped like the schema: each block under its own title, nested blocks after their parent.
    titles = [ln for ln in lines if re.match(r"^[\w. ]+ \(\w+\): ", ln)]
    assert titles[0].startswith("top level (") and "solver.reward (SolverRewardConfig): Tool-aware" in text
    solver = titles.index(next(t for t in titles if t.startswith("solver (")))
    reward = titles.index(next(t for t in titles if t.startswith("solver.reward (")))
    assert reward > solver and all(t.startswith("solver.") for t in titles[solver + 1:reward + 1])
    assert any(t.startswith("solver.lora (LoraConfig): ") for t in titles[solver + 1:reward])


def test_help_of_one_part_shows_the_overridden_values():
    text = format_help("coevo", compose(["experiment=smoke"], return_hydra_config=True), ["ranker"])
    assert text.startswith("ranker=tiny-random (options: configs/ranker/<option>.yaml)\n  qwen2.5-3b ")
    assert "  ranker.n_candidates: int = 5" in text  # the smoke experiment's value
    assert "solver." not in text and "proposer." not in text
    one = format_help("coevo", compose([], return_hydra_config=True), ["solver.reward.tool_cost"])
    assert one == ("  solver.reward.tool_cost: float = 0.2  # lambda: penalty for extra searches among correct rollouts"
                   "  [range: tool_cost >= 0]")
    group = format_help("coevo", compose([], return_hydra_config=True), ["experiment"])
    assert group.splitlines()[0] == "experiment=null (options: configs/experiment/<option>.yaml)"
    assert "  smoke               Tiny random models and small sizes" in group
    with pytest.raises(ValueError, match=r"^unknown config key 'rankr': did you mean 'ranker'\?"):
        format_help("coevo", compose([], return_hydra_config=True), ["rankr"])


def test_help_of_retrieval_shows_each_backend_block_with_type_value_doc_and_range():
    text = format_help("coevo", compose(["retrieval=e5_faiss"], return_hydra_config=True), ["retrieval"])
    lines = text.splitlines()
    titles = [ln for ln in lines if ln.startswith("retrieval")]
    assert [t.split(" (")[0] for t in titles] == ["retrieval=e5_faiss", "retrieval", "retrieval.faiss",
                                                  "retrieval.http"]
    assert "  retrieval.replicas: int = 1" in text
    assert "  retrieval.faiss.encoder: str | null = intfloat/e5-base-v2 " in text
    hnsw = next(ln for ln in lines if ln.startswith("  retrieval.faiss.hnsw_m: int = 32 "))
    assert hnsw.endswith("# hnsw: links per node (more: better recall, more memory)  [range: hnsw_m >= 2]")
    assert any(ln.startswith("  retrieval.http.url: str = http://127.0.0.1:8000/retrieve ") for ln in lines)


class FakeHydraMain:
    """Stands in for the `@hydra.main` function: records the arguments Hydra would have parsed."""

    def __init__(self):
        self.argv = None

    def __call__(self):
        self.argv = list(sys.argv[1:])


def _entry(monkeypatch, args, config_name="coevo", validate=to_object):
    monkeypatch.setattr(sys, "argv", ["coevo", *args])
    fake = FakeHydraMain()
    code = None
    try:
        hydra_entry(fake, config_name, validate)
    except SystemExit as e:
        code = e.code
    return code, fake.argv


@pytest.mark.parametrize("args,message", [
    (["experiment=smoke", "+ranker.topk=5"], "unknown config key 'ranker.topk': did you mean 'ranker.top_k'?"),
    (["ranker.topk=5"], "unknown config key 'ranker.topk': did you mean 'ranker.top_k'?"),
    (["--cfg", "job", "ranker.topk=5"], "unknown config key 'ranker.topk': did you mean 'ranker.top_k'?"),
    (["run.save_every=0"], "config key run.save_every=0 is out of range: expected save_every >= 1"),
    (["proposer=nope"], "Could not find 'proposer/nope'"),
])
def test_a_bad_command_line_stops_before_hydra_with_the_fix(monkeypatch, capsys, args, message):
    code, hydra_argv = _entry(monkeypatch, args)
    err = capsys.readouterr().err
    assert code == 2 and hydra_argv is None  # Hydra never ran: no run directory was created
    assert err.startswith("coevo.run: error: ") and message in err and "Traceback" not in err


def test_dry_run_tells_hydra_to_write_nothing(monkeypatch):
    code, hydra_argv = _entry(monkeypatch, ["experiment=smoke", "dry_run=true"])
    assert code is None and hydra_argv == ["experiment=smoke", "dry_run=true", *DRY_RUN_OVERRIDES]
    code, hydra_argv = _entry(monkeypatch, ["experiment=smoke"])
    assert code is None and hydra_argv == ["experiment=smoke"]
    solve = SCHEMAS["solve_schema"]
    code, hydra_argv = _entry(monkeypatch, ["dry_run=true"], "solve", lambda c: to_object(c, solve))
    assert hydra_argv[-len(DRY_RUN_OVERRIDES):] == list(DRY_RUN_OVERRIDES)


def test_help_prints_and_exits_without_hydra(monkeypatch, capsys):
    code, hydra_argv = _entry(monkeypatch, ["experiment=smoke", "--help", "ranker.top_k"])
    assert code == 0 and hydra_argv is None
    out = capsys.readouterr().out
    assert out == ("  ranker.top_k: int = 3  # K: documents the ranker returns to the solver (paper 5)"
                   "  [range: top_k >= 1]\n")
