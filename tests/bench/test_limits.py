"""bench/limits.py: its JSON line under --tiny --no-decode, and the stage fractions on hand-made metrics."""
import json
import sys
import types
from types import SimpleNamespace

import pytest

from bench import limits
from coevo.core.types import SamplingParams


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_tiny_run_prints_peaks_batch_and_an_explicitly_skipped_decode(tmp_path):
    metrics = _write_jsonl(tmp_path / "metrics.jsonl", [
        {"step": 0, "update": {"solver": {"seq_tokens": 1000, "n_tokens": 100, "time_s": 2.0}},
         "time_s": {"solve": 1.0, "update": 2.0}, "tokens": {"solve": {"decode": 50}}}])
    out = tmp_path / "limits.json"
    result = limits.main(["--tiny", "--no-decode", "--threads", "1", "--metrics", str(metrics),
                          "--params", "solver=1e6", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))  # the same one JSON line
    assert {"device", "threads", "cpu_flags", "bf16_native", "matmul", "batch", "decode", "decode_skipped",
            "stages"} <= set(result)
    matmul = result["matmul"]
    assert matmul["size"] == matmul["bf16"]["size"] == 256 and matmul["repeats"] == 1 and result["threads"] == 1
    assert matmul["fp32"]["gflops"] > 0 and matmul["bf16"]["gflops"] > 0
    assert matmul["bf16"]["native"] == result["bf16_native"] == (
        result["cpu_flags"]["avx512_bf16"] or result["cpu_flags"]["amx_bf16"])
    assert result["decode"] is None and result["decode_skipped"] == "--no-decode"
    batch = result["batch"]  # small_learning: questions x proposer candidates x solver rollouts (4 x 4 x 4 now)
    assert batch["value"] == batch["questions_per_step"] * batch["proposer_group_size"] * batch["solver_group_size"]
    assert batch["overrides"] == ["experiment=small_learning"]
    update = result["stages"]["update"]
    # 6 * 1e6 params * 1000 tokens over 2 s, against the measured fp32 peak (no config.yaml: fp32)
    expected = 6e9 / 2.0 / (matmul["fp32"]["gflops"] * 1e9)
    assert update["rows"][0]["fraction"] == pytest.approx(expected, rel=1e-3, abs=1e-4)
    assert update["rows"][0]["t_key"] == "seq_tokens" and update["skipped"] == []
    generation = result["stages"]["generation"]
    assert generation["rows"][0]["tokens_per_s"] == 50.0 and generation["rows"][0]["fraction"] is None
    assert generation["fraction_skipped"] == "no decode rate (--no-decode)"


def test_stage_fractions_by_hand_and_every_skipped_denominator_listed():
    records = [
        # solver: 6 * 1e6 * 1000 / 3e9 = 2 s ideal in 2 s -> 1.0; stage 2 s ideal / 2.5 s -> 0.8;
        # generation 600 tokens / 3 s = 200 tok/s over 400 -> 0.5
        {"step": 0, "update": {"solver": {"seq_tokens": 1000, "n_tokens": 200, "time_s": 2.0},
                               "proposer": {"skipped": True, "n_seqs": 0}},
         "time_s": {"solve": 3.0, "update": 2.5}, "tokens": {"solve": {"decode": 600}}},
        # ranker (bf16 peak 6 GFLOP/s): 6 * 2e6 * 500 loss-masked tokens / 6e9 = 1 s in 1 s -> 1.0;
        # the solver has no time_s (skipped, so no stage fraction); coevo.solve keys: (300 + 100) / 2 s / 400 -> 0.5
        {"step": 1, "update": {"solver": {"seq_tokens": 10}, "ranker": {"n_tokens": 500, "time_s": 1.0}},
         "time_s": {"solve": 2.0, "update": 1.5}, "solver": {"gen_tokens": 300}, "ranker": {"gen_tokens": 100}},
        {"step": 2},  # nothing to measure: generation skipped, no update rows
    ]
    shapes = {"solver": {"params": 1_000_000, "dtype": "float32", "peak": "fp32"},
              "ranker": {"params": 2_000_000, "dtype": "bfloat16", "peak": "bf16"}}
    out = limits.stage_fractions(records, shapes, {"fp32": 3.0, "bf16": 6.0}, decode_tps=400.0)
    update, generation = out["update"], out["generation"]
    assert out["steps"] == 3
    assert [(r["step"], r["role"], r["fraction"], r["t_key"]) for r in update["rows"]] == [
        (0, "solver", 1.0, "seq_tokens"), (1, "ranker", 1.0, "n_tokens")]
    assert update["steps"] == [{"step": 0, "seconds": 2.5, "ideal_s": 2.0, "fraction": 0.8}]
    assert update["median"] == {"ranker": 1.0, "solver": 1.0, "stage": 0.8}
    assert update["t_keys"] == {"seq_tokens": 1, "n_tokens": 1}
    assert [(s["step"], s["role"]) for s in update["skipped"]] == [(0, "proposer"), (1, "solver"), (1, "(stage)")]
    assert "time_s" in update["skipped"][1]["why"]
    assert [(r["step"], r["tokens"], r["tokens_key"], r["fraction"]) for r in generation["rows"]] == [
        (0, 600, "tokens/solve/decode", 0.5), (1, 400, "solver/gen_tokens+ranker/gen_tokens", 0.5)]
    assert generation["median"] == 0.5 and [s["step"] for s in generation["skipped"]] == [2]


def test_role_shapes_from_the_run_config_or_params(tmp_path):
    (tmp_path / "config.yaml").write_text("solver:\n  model: tiny-random\n  dtype: float32\n"
                                          "ranker:\n  model: tiny-random\n  dtype: bfloat16\n")
    shapes = limits.role_shapes(tmp_path, {"solver", "ranker"}, {"ranker": 5}, "cpu")
    assert shapes == {"solver": {"params": 77440, "dtype": "float32", "peak": "fp32"},
                      "ranker": {"params": 5, "dtype": "bfloat16", "peak": "bf16"}}


@pytest.mark.parametrize("native", [True, False])
def test_cpu_bf16_autocast_is_held_to_the_bf16_peak_where_the_cpu_has_bf16(tmp_path, monkeypatch, native):
    (tmp_path / "config.yaml").write_text("solver:\n  model: tiny-random\n  dtype: float32\n"
                                          "  cpu_bf16_autocast: true\n")
    monkeypatch.setattr(limits.precision, "cpu_native_bf16", lambda: native)
    shapes = limits.role_shapes(tmp_path, {"solver"}, {"solver": 5}, "cpu")
    assert shapes["solver"]["dtype"] == ("bfloat16" if native else "float32")
    assert shapes["solver"]["peak"] == ("bf16" if native else "fp32")


def test_pure_decode_ignores_eos_and_is_timed_by_rollout_throughput(monkeypatch):
    """PureDecode through bench/rollout.py's `throughput`, over a fake vLLM (importing vLLM takes ~15 s)."""
    vllm, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    vllm.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    inputs.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    seen = []

    def generate(prompts, params, use_tqdm):
        seen.extend(params)
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[7] * p.max_tokens)]) for p in params]

    from bench.rollout import throughput
    prompts = [[1, 2, 3]] * 3
    tps, tokens, seconds = throughput(limits.PureDecode(SimpleNamespace(llm=SimpleNamespace(generate=generate))),
                                      prompts, SamplingParams(max_new_tokens=5, seed=10))
    assert tokens == 3 * 5 and tps > 0 and seconds > 0
    timed = seen[2:]  # after the 2-prompt warm-up
    assert all(p.ignore_eos and p.max_tokens == 5 for p in timed) and [p.seed for p in timed] == [10, 11, 12]
