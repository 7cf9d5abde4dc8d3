"""Fixtures of the rrl tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mlp_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository holding only the demo ``sensor_mlp`` (ONNX Runtime): enough for the
    profiler and the gateway control tests, without building the TensorFlow twins."""
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    root = tmp_path_factory.mktemp("mlp-repo")
    (demo,) = [m for m in DEMO_MODELS if m.name == "sensor_mlp"]
    write_model_version(demo, root / demo.name / str(VERSION))
    return root
