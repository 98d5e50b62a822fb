"""Shared test fixtures: where the workplace's real datasets are, and small helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("EPISHARD_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE = REPO / "sample" / "gr00t_robot_sim_picknplace"


def shared_dataset(name: str) -> Path:
    """Path of a dataset in ../shared/data; skips the test when it is absent (a user's fresh clone)."""
    path = SHARED_DATA / name
    if not (path / "meta" / "info.json").exists():
        pytest.skip(f"{path} is absent (real test data lives in ../shared/data)")
    return path
