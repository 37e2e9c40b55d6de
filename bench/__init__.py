"""Benchmark scripts, each run as `python -m bench.<name>` from the repo root; each prints one JSON line."""
