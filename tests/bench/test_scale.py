"""bench/scale.py at a few hundred passages: the synthetic corpus and the JSON line's keys (lazy paths too)."""
import json

from bench import scale


def test_synthetic_corpus_is_seeded_with_unique_ids_and_titles(tmp_path, shared_data):
    a = scale.synthetic_corpus(300, shared_data, tmp_path / "a.jsonl", seed=1)
    b = scale.synthetic_corpus(300, shared_data, tmp_path / "b.jsonl", seed=1)
    assert a.read_bytes() == b.read_bytes()  # the same seed, the same corpus
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(rows) == 300 and len({r["id"] for r in rows}) == 300 and len({r["title"] for r in rows}) == 300
    assert all(r["title"].endswith(f"(#{i})") and len(r["text"]) > 40 for i, r in enumerate(rows))
    real = {p["title"] for p in scale.real_passages(shared_data)}
    assert all(r["title"].rsplit(" (#", 1)[0] in real for r in rows)  # real titles, made unique


def test_one_json_line_per_size_with_the_bm25s_measures(tmp_path, shared_data, capsys):
    scale.main(["--sizes", "200", "--kinds", "bm25s", "--work", str(tmp_path), "--queries", "16",
                "--data", str(shared_data), "--stats-sample", "40", "--targets", "3"])
    line = json.loads(capsys.readouterr().out.strip())
    assert line["passages"] == 200 and line["corpus_bytes"] > 0
    bm25s = line["bm25s"]
    assert "error" not in bm25s, bm25s
    assert bm25s["build_s"] > 0 and bm25s["peak_rss_gb"] > 0 and bm25s["index_bytes"] > 0 and bm25s["qps"] > 0
    assert bm25s["latency_ms"]["p50"] <= bm25s["latency_ms"]["p99"]
    assert line["run_start_s"]["retrieval"] == bm25s["run_start_s"] > 0
    lazy = line["evidence"]["lazy"]
    assert lazy["build"]["sample_passages"] == 40 and lazy["build"]["titles_bytes"] > 0
    assert lazy["cold"]["annotated"] > 0 and lazy["cold"]["stored"] == lazy["cold"]["annotated"]
    assert lazy["store_warm"]["annotated"] == 0  # the second process read every passage from the store
    assert set(line["path_ms"]) == {"first_touch_p50", "store_warm_p50", "memo_warm_p50"}
    assert line["run_start_s"]["evidence"] == lazy["cold"]["evidence_ready_s"] > 0
    assert (tmp_path / "cache" / "indexes").is_dir()  # the children's caches stay under --work
