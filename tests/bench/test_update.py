"""bench/update.py on the tiny random model (CPU, seconds): its JSON line and the planner beside it."""
import json

from bench import update


def test_update_bench_reports_one_update_and_the_planner_terms():
    result = update.main(["--model", "tiny-random", "--tokens", "2x48", "--completion", "16", "--device", "cpu"])
    json.dumps(result)  # one JSON line
    assert result["tokens"] == "2x48" and result["update_s"] > 0 and result["tokens_per_s"] > 0
    assert result["trained_params"] == result["params"] == 77440 and result["grad_norm"] > 0
    terms = result["planner_terms_gb"]
    assert set(terms) == {"weights", "reference", "grads", "optimizer", "update"}


def test_profile_sums_self_time_by_kind_and_keeps_the_slowest_ops():
    events = [("aten::mm", 3.0), ("aten::addmm", 1.0), ("aten::_to_copy", 0.5), ("aten::mul", 0.25),
              ("aten::_foreach_addcdiv_", 0.25), ("aten::_log_softmax", 1.0)]
    summary = update.profile_summary(events, top=2)
    assert summary["self_s"] == 6.0 and summary["top"] == [["aten::mm", 3.0], ["aten::addmm", 1.0]]
    assert {k: v["s"] for k, v in summary["by_kind"].items()} == {
        "matmul": 4.0, "softmax/loss": 1.0, "cast/copy": 0.5, "other": 0.25, "optimizer": 0.25}
    assert summary["by_kind"]["matmul"]["share"] == round(4 / 6, 4)


def test_profiled_update_reports_its_kinds():
    result = update.main(["--model", "tiny-random", "--tokens", "2x48", "--completion", "16", "--device", "cpu",
                          "--profile"])
    profile = result["profile"]
    assert profile["self_s"] > 0 and "matmul" in profile["by_kind"] and len(profile["top"]) == 10
    assert abs(sum(v["s"] for v in profile["by_kind"].values()) - profile["self_s"]) < 0.01
