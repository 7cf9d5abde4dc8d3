"""Fixtures of the models tests. The demo repository itself (``demo_repo``) is built once per
session by the shared fixture in ``tests/conftest.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.demo import DEMO_MODELS, DemoModel
from models.repository import ModelVersion, scan_repository


@pytest.fixture(scope="session")
def demo_versions(demo_repo: Path) -> dict[str, ModelVersion]:
    """Every readable version of the demo repository, by model name."""
    found = scan_repository(demo_repo)
    return {v.name: v for v in found if isinstance(v, ModelVersion)}


@pytest.fixture(scope="session")
def demo_models() -> dict[str, DemoModel]:
    return {m.name: m for m in DEMO_MODELS}
