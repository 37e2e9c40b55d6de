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
