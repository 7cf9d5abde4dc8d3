"""Fixtures shared by every test package."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from models.demo import FLOAT_DEMO_MODELS, ensure_demo_repository
from tests.workers import make_scheduler, run_folder, turn

# Gateways started by the tests (in-process, and `iotgw serve` children, which inherit this)
# keep the knobs they are given: a test of batching or reconfiguration must not have the online
# tuner retune them underneath it. The tuner's own tests turn it on explicitly.
os.environ.setdefault("IOTGW_TUNER__ENABLED", "false")
# Tests start many gateways, some at once: each takes a free gRPC port instead of 8001.
os.environ.setdefault("IOTGW_GRPC__PORT", "0")


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fp32 part of the bundled demo model repository, built once per test run into a
    temporary folder (never the user's cache): six models, ONNX Runtime and TensorFlow, version
    1 each. (The full default repository adds their int8/int4 checkpoints; the models tests
    build it with ``full_demo_repo``.)"""
    return ensure_demo_repository(
        run_folder(tmp_path_factory, "demo") / "demo-repo-v1", FLOAT_DEMO_MODELS
    )


GPU_TESTS = Path(__file__).parent / "gpu"


# Before pytest-xdist's own (firstresult: the first answer is the scheduler). Optional: the GPU
# lane runs without pytest-xdist.
@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` (what ./scripts/test.sh asks for) by ``tests.workers.scope_of``."""
    if config.getvalue("dist") != "loadscope":
        return None
    return make_scheduler(config, log)


# Outermost (tryfirst wrapper), so a wait for the turn is not counted by pytest-timeout's limit.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Each test in its turn (``tests.workers.turn``): under two workers the agent's live tests
    run while the other worker waits."""
    with turn(item.config, item.nodeid):
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The GPU tests (marker ``gpu``, tests/gpu) run only when asked for: with a ``-m``
    expression that names them (``./scripts/test.sh --gpu`` runs ``-m gpu``) or a path inside
    tests/gpu. The CPU suite, ``--fast`` included (whose ``-m "not slow"`` would select them),
    leaves them out instead of listing a skip per test."""
    if "gpu" in (config.option.markexpr or "") or any(
        Path(arg.split("::")[0]).resolve().is_relative_to(GPU_TESTS) for arg in config.args
    ):
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
