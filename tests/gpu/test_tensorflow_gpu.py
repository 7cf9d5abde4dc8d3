"""TensorFlow on the GPU: a SavedModel and a block-quantized checkpoint load on ``cuda:0``, their
ops run on the GPU (TensorFlow's full trace of a run), and the SavedModel answers what ONNX
Runtime computes on the CPU for the same weights (the demo exports both from one set)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from models.backends import load_runtime, tf_backend
from models.backends.devices import CPU_PROVIDER
from models.repository import ModelVersion, read_config
from models.runtime import Threads
from models.zoo import SENSOR_MLP
from tests.gpu.placement import tf_op_devices

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_tensorflow")]

FLOAT_TOLERANCE = 1e-4
# The op types that do the arithmetic (of either way the plan may choose): each must run on the
# GPU. (Feeding, fetching and the graph's source stay on the CPU.)
COMPUTE_OPS = {"MatMul", "BatchMatMulV2", "AddV2", "Add", "BiasAdd", "Mul", "Relu", "Softmax"}
FEATURES = SENSOR_MLP.inputs[0].name


def _version(repo: Path, name: str) -> ModelVersion:
    directory = repo / name / "1"
    return ModelVersion(name, 1, directory, read_config(directory / "config.toml"))


def _rows(rows: int) -> np.ndarray:
    return (
        np.random.default_rng(3)
        .standard_normal((rows, *SENSOR_MLP.inputs[0].shape))
        .astype(np.float32)
    )


def test_a_savedmodel_runs_on_the_gpu_and_answers_what_the_cpu_computes(gpu_repo: Path) -> None:
    runtime = load_runtime(_version(gpu_repo, "sensor_mlp_tf"), Threads(1, 1))
    x = _rows(16)
    try:
        assert isinstance(runtime, tf_backend.TfRuntime)
        assert runtime.device == "cuda:0", runtime.placement.reason
        got = runtime.infer({FEATURES: x})[SENSOR_MLP.output]
    finally:
        runtime.close()
    onnx = str(gpu_repo / "sensor_mlp" / "1" / "model.onnx")
    want = ort.InferenceSession(onnx, providers=[CPU_PROVIDER]).run(None, {FEATURES: x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT_TOLERANCE)


def test_the_int8_checkpoint_graph_runs_on_the_gpu(gpu_repo: Path) -> None:
    """The checkpoint's graph (codes in variables, dequantized in the graph) in the runtime's own
    session: its matrix products and scaling run on the GPU."""
    runtime = load_runtime(_version(gpu_repo, "sensor_mlp_int8_tf"), Threads(1, 1))
    try:
        assert isinstance(runtime, tf_backend.TfRuntime)
        assert runtime.device == "cuda:0", runtime.placement.reason
        session = runtime._session
        assert session is not None
        assert any(d.device_type == "GPU" for d in session.list_devices())
        # The checkpoint graph names its placeholders and its output after the model's.
        devices = tf_op_devices(session, f"{SENSOR_MLP.output}:0", {f"{FEATURES}:0": _rows(4)})
        types = {op.name: op.type for op in session.graph.get_operations()}
    finally:
        runtime.close()
    compute = {op: dev for op, dev in devices.items() if types.get(op) in COMPUTE_OPS}
    assert compute, devices
    off_gpu = {op: dev for op, dev in compute.items() if "GPU" not in dev}
    assert not off_gpu, f"ops off the GPU: {off_gpu}"
