"""Session-wide fixtures: shared data location (fails loudly when missing)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """`$COEVO_SHARED_DATA` (default ../shared/data); CI has it, so missing data is an error."""
    path = Path(os.environ.get("COEVO_SHARED_DATA", "../shared/data")).expanduser()
    if not (path / "wiki_mini" / "corpus.jsonl.gz").exists():
        pytest.fail(f"shared data not found at {path.resolve()}: set COEVO_SHARED_DATA to the shared data directory")
    return path
