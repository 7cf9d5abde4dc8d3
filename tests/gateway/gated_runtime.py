"""A real ONNX Runtime backend behind a gate: an armed gate makes the next ``infer`` call block
on a ``threading.Event`` until the test opens it, which is how a hung backend looks to the
gateway. Also an ``InferenceService`` around it, serving the demo ``sensor_mlp``."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.metrics import GatewayMetrics
from gateway.service import InferenceService
from gateway.settings.schema import ServingSettings
from models.backends import load_runtime
from models.repository import ModelVersion, scan_repository
from models.runtime import ModelMetadata, Runtime, Threads
from tests.gateway.helpers import make_repo

MODEL = "sensor_mlp"
# How long a test waits for a thread-side event before failing: far beyond any real wait.
EVENT_DEADLINE_S = 60.0


class Gate:
    """Shared by every runtime the loader builds. ``arm`` makes the next call block until
    ``open``; ``entered`` tells when it is blocked."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self._armed = False
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.runtimes: dict[int, GatedRuntime] = {}
        self.stuck: GatedRuntime | None = None

    def arm(self) -> None:
        with self._lock:
            self._armed = True

    def open(self) -> None:
        self.released.set()

    def take(self) -> bool:
        """True once per arming: the caller is the call that blocks."""
        with self._lock:
            armed, self._armed = self._armed, False
            return armed

    def loader(self, version: ModelVersion, threads: Threads) -> Runtime:
        runtime = GatedRuntime(load_runtime(version, threads), self, next(self._ids))
        self.runtimes[runtime.id] = runtime
        return runtime


class GatedRuntime:
    def __init__(self, inner: Runtime, gate: Gate, runtime_id: int) -> None:
        self._inner = inner
        self._gate = gate
        self.id = runtime_id
        self.calls = 0
        self.closed = threading.Event()

    @property
    def metadata(self) -> ModelMetadata:
        return self._inner.metadata

    @property
    def threads(self) -> Threads:
        return self._inner.threads

    @property
    def device(self) -> str:
        return self._inner.device

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._gate.take():
            self._gate.stuck = self
            self._gate.entered.set()
            self._gate.released.wait()
        self.calls += 1
        return self._inner.infer(inputs)

    def close(self) -> None:
        self._inner.close()
        self.closed.set()


def mlp_repo(dest: Path, source_root: Path, **batching: Any) -> Path:
    """A repository of the demo ``sensor_mlp`` at ``dest`` with its batching overridden."""
    return make_repo(dest, source_root, {MODEL: {"slo_ms": 30_000.0, "batching": batching}})


def write_sensor_mlp(root: Path) -> Path:
    """The demo ``sensor_mlp`` alone (ONNX Runtime; no TensorFlow export needed)."""
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    (demo,) = [m for m in DEMO_MODELS if m.name == MODEL]
    write_model_version(demo, root / demo.name / str(VERSION))
    return root


def open_reference(source_root: Path) -> Runtime:
    """A runtime of the same model, opened directly: what the gateway's answers must equal."""
    (version,) = [v for v in scan_repository(source_root) if isinstance(v, ModelVersion)]
    return load_runtime(version, Threads(1, 1))


@contextlib.asynccontextmanager
async def gated_service(
    repo: Path, gate: Gate, *, executor_threads: int = 4, **serving: Any
) -> AsyncIterator[InferenceService]:
    """A loaded ``InferenceService`` whose runtimes pass through ``gate``. On exit the gate is
    opened, so that a blocked call returns and its executor thread ends."""
    executor = ThreadPoolExecutor(executor_threads, thread_name_prefix="test-exec")
    service = InferenceService(
        executor=executor,
        metrics=GatewayMetrics(),
        serving=ServingSettings(executor_threads=executor_threads, **serving),
        load_runtime=gate.loader,
    )
    service.registry.add_versions(scan_repository(repo))
    await service.registry.load_all()
    try:
        yield service
    finally:
        gate.open()
        await service.registry.close()
        executor.shutdown(wait=True)


def features(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"features": rng.standard_normal((rows, 32)).astype(np.float32)}


# Fixtures shared by the modules that test the batcher against a gated backend: they import
# these (pytest registers them under their ``name``, which the tests' arguments use).
@pytest.fixture(scope="module", name="source")
def source_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo sensor_mlp ONNX model, written once per module."""
    return write_sensor_mlp(tmp_path_factory.mktemp("mlp-source"))


@pytest.fixture(scope="module", name="reference")
def reference_fixture(source: Path) -> Iterator[Runtime]:
    """A plain ONNX Runtime session of ``source``: what the gateway's answers must equal."""
    runtime = open_reference(source)
    yield runtime
    runtime.close()
