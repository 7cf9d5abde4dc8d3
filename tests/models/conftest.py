"""Fixtures of the models tests. The fp32 demo repository (``demo_repo``) is built once per
session by the shared fixture in ``tests/conftest.py``; ``full_demo_repo`` is the whole default
repository, quantized checkpoints included, as ``iotgw serve`` builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.demo import DEMO_MODELS, DemoModel, ensure_demo_repository
from models.repository import ModelVersion, scan_repository
from tests.workers import run_folder


@pytest.fixture(scope="session")
def full_demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The complete default demo repository (fp32 models and their int8/int4 checkpoints),
    in a cache folder laid out as ``iotgw serve --cache-dir`` expects."""
    return ensure_demo_repository(run_folder(tmp_path_factory, "cache") / "demo-repo-v1")


@pytest.fixture(scope="session")
def demo_versions(full_demo_repo: Path) -> dict[str, ModelVersion]:
    """Every readable version of the full demo repository, by model name."""
    found = scan_repository(full_demo_repo)
    return {v.name: v for v in found if isinstance(v, ModelVersion)}


@pytest.fixture(scope="session")
def demo_models() -> dict[str, DemoModel]:
    return {m.name: m for m in DEMO_MODELS}
