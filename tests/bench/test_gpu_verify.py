"""bench/gpu_verify.py: `--tiny` on a bare torch + transformers interpreter, and the figures it is compared with.

The bare machine is emulated with this venv's own packages: a folder of links to torch, transformers and
what they require (their distributions' transitive requirements, no extras), run with `python -S` (no
site-packages) and that folder plus the repo root on PYTHONPATH. vLLM, Ray, omegaconf, Hydra and peft are
then as absent as on the borrowed machine (`find_spec` gives None), not merely made to raise.
"""
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from bench import gpu_verify
from bench import gpu_verify_lib as lib
from bench.gpu_verify_serve import add_lora
from coevo.train import gpu_terms

ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("vllm", "ray", "omegaconf", "hydra", "peft")


def requirement_closure(roots):
    """Distributions `roots` need, transitively, as pip would install them (extras left out)."""
    found, todo = {}, list(roots)
    while todo:
        req = Requirement(todo.pop())
        key = re.sub(r"[-_.]+", "-", req.name).lower()
        if key in found or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        found[key] = md.distribution(req.name)
        todo += found[key].requires or []
    return found


def bare_site(folder: Path) -> Path:
    """`folder` with a link to every top-level file and package of torch, transformers and their requirements."""
    folder.mkdir()
    for dist in requirement_closure(["torch", "transformers"]).values():
        assert dist.files is not None, f"{dist.metadata['Name']} lists no files: cannot link it"
        for top in {f.parts[0] for f in dist.files if f.parts[0] != ".."}:
            source, link = Path(dist.locate_file(top)), folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return folder


def test_tiny_runs_every_phase_on_a_bare_torch_transformers_interpreter(tmp_path):
    site = bare_site(tmp_path / "site")
    assert not any((site / name).exists() for name in ABSENT)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "PYTHONPATH": f"{site}:{ROOT}",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-S", "bench/gpu_verify.py", "--tiny"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    by_phase = {r["phase"]: r for r in records}
    assert list(by_phase) == ["environment", "startup_replay", "fsdp_update", "logprob_mismatch", "weight_sync",
                              "lora_update", "hf_generate"]
    assert not [r for r in records if "error" in r or "skipped" in r], records

    env_record = by_phase["environment"]
    assert env_record["importable"] == dict.fromkeys(ABSENT, False) and env_record["tiny"] and env_record["bf16"]
    startup = by_phase["startup_replay"]
    assert [s["step"] for s in startup["steps"]] == ["host_copy", "meta_skeleton", "fully_shard", "to_empty",
                                                     "fill_from_host", "reference_bf16", "adamw_moments",
                                                     "empty_cache"]
    assert startup["backend"] == "gloo" and startup["vllm_start"]["utilization"] == 0.35
    assert "omegaconf" in startup["planner"]["unavailable"] and "omegaconf" in by_phase["fsdp_update"]["planner"][
        "unavailable"]
    update = by_phase["fsdp_update"]
    assert update["grad_norm_finite"] and update["grad_norm"] > 0 and update["tokens_per_s"] > 0
    gap = by_phase["logprob_mismatch"]
    assert gap["tokens"] == lib.TINY.score_rows * lib.TINY.score_new and 0 < gap["mean"] <= gap["p99"] <= gap["max"]
    sync = by_phase["weight_sync"]
    assert sync["bytes_sent"] > 0 and sync["gather_gbps"] > 0 and sync["stage_gbps"] > 0
    lora = by_phase["lora_update"]["by_lr"]
    low, high = (lora[k]["merged_from_fp32_originals"]["share_of_targets"] for k in ("1e-06", "1e-05"))
    assert 0 < low < high <= 1  # ten times the step moves more served weights
    assert by_phase["hf_generate"]["new_tokens"] == lib.TINY.gen_rows * lib.TINY.gen_new


def test_a_failing_phase_reports_its_error_and_a_late_one_is_skipped(monkeypatch):
    def boom(ctx):
        raise RuntimeError("out of memory, say")

    monkeypatch.setitem(gpu_verify.PHASES, "weight_sync", boom)
    ctx = lib.Ctx(torch.device("cpu"), True, lib.TINY)
    record = gpu_verify.run_phase(ctx, "weight_sync", deadline=time.monotonic() + 60)
    assert record["error"] == "RuntimeError: out of memory, say" and record["at"].startswith("test_gpu_verify.py:")
    assert gpu_verify.run_phase(ctx, "environment", deadline=time.monotonic() - 1) == {
        "phase": "environment", "skipped": "the time budget (--budget-s) was spent before it started"}


def test_the_bench_constants_are_the_shipped_presets():
    from coevo.core.config import compose, to_object
    from coevo.core.role_config import LORA_TARGETS, LoraConfig
    from coevo.train.gpu_plan import LORA_SUGGESTION

    cfg = to_object(compose(lib.HEADLINE))
    assert (cfg.solver.model, cfg.solver.num_gpus, cfg.solver.gpu_memory_utilization) == (
        lib.BIG, lib.SOLVER_RANKS, lib.VLLM_UTILIZATION)
    assert to_object(compose(["solver=qwen2.5-3b"])).solver.model == lib.MID
    paper = to_object(compose(["experiment=paper_cosearch"])).ranker.lora
    assert lib.LORA_RANK == LORA_SUGGESTION == paper.rank and lib.LORA_ALPHA == LoraConfig().alpha == paper.alpha
    assert list(lib.LORA_TARGETS) == LORA_TARGETS


def test_the_startup_replay_holds_one_rank_share_of_the_7b():
    full = lib.count_params(lib.model_config(lib.BIG, {}))
    replay = lib.count_params(lib.model_config(lib.BIG, lib.REAL.startup))
    assert abs(replay / (full / lib.SOLVER_RANKS) - 1) < 0.001


def test_the_planner_figures_where_it_imports(monkeypatch):
    monkeypatch.setattr(gpu_terms, "_vllm_rule", lambda: (None, "ImportError: no vllm in this test"))
    ctx = lib.Ctx(torch.device("cpu"), True, lib.REAL)
    startup = lib.planner_startup(ctx)
    assert startup["startup_gb"]["weights"] == 7.62 and startup["vllm_start"]["ok"]  # 7.6B x 4 bytes / 4 ranks
    config = lib.model_config(lib.MID, lib.REAL.mid)
    full, lora = lib.planner_update(ctx, config), lib.planner_update(ctx, config, lib.REAL.lora_rank)
    assert set(full["terms_gb"]) == {"weights", "grads", "optimizer", "update"}
    assert full["terms_gb"]["weights"] == 12.34 and full["terms_gb"]["optimizer"] == 24.69  # 3.086B x 4, x 8
    assert 0 < lora["terms_gb"]["optimizer"] < 1 < lora["terms_gb"]["weights"] < full["terms_gb"]["weights"]


def test_fit_layers_halves_the_layers_until_the_phase_fits(monkeypatch):
    ctx = lib.Ctx(torch.device("cuda"), True, lib.REAL)  # a device name only: nothing is allocated
    monkeypatch.setattr(lib, "free_total", lambda device: (200 * 10**9, 200 * 10**9))
    assert lib.fit_layers(ctx, lib.MID, {}, 20) == ({}, "36 layers (all)")
    monkeypatch.setattr(lib, "free_total", lambda device: (40 * 10**9, 80 * 10**9))
    changes, why = lib.fit_layers(ctx, lib.MID, {}, 20)
    kept = changes["num_hidden_layers"]
    assert kept in (18, 9, 4, 2, 1) and why.startswith(f"{kept} of 36 layers")
    assert lib.count_params(lib.model_config(lib.MID, changes)) * 20 * 1.1 <= 0.9 * 40e9


def test_the_hand_written_lora_is_peft_s_layer():
    peft = pytest.importorskip("peft")  # in the project venv; the bare machine has none, hence the copy
    config = lib.model_config(lib.MID, lib.TINY_MODEL)
    ours, base = lib.build(config, "cpu"), lib.build(config, "cpu")
    theirs = peft.get_peft_model(base, peft.LoraConfig(r=8, lora_alpha=32, target_modules=list(lib.LORA_TARGETS)))
    wrapped = add_lora(ours, 8, 32.0)
    theirs_layers = {n.removeprefix("base_model.model."): m for n, m in theirs.named_modules()
                     if hasattr(m, "lora_A") and isinstance(m.lora_A, torch.nn.ModuleDict)}
    assert set(theirs_layers) == set(wrapped)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, layer in wrapped.items():
            layer.lora_B.normal_()
            theirs_layers[name].lora_A["default"].weight.copy_(layer.lora_A)
            theirs_layers[name].lora_B["default"].weight.copy_(layer.lora_B)
        ids = torch.randint(0, config.vocab_size, (2, 12))
        assert torch.allclose(ours(ids).logits, theirs(ids).logits, atol=1e-5)
        merged = theirs.merge_and_unload()
        name = next(iter(wrapped))
        assert torch.allclose(merged.get_submodule(name).weight, wrapped[name].base.weight + wrapped[name].delta(),
                              atol=1e-6)
