"""Fixtures of the bench tests: load a bench/ script as a module (they are scripts, not a package)."""
import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench_script() -> Callable[[str], Any]:
    """`bench_script("scale")`: bench/scale.py executed as a fresh module named `bench_scale`."""
    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load
