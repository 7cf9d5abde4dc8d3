"""Where the backends run: CUDA when the libraries offer it, CPU otherwise, and a reported
fallback when a GPU cannot initialise.

The GPU branches are tested on any machine by faking what a GPU machine reports
(``onnxruntime.get_available_providers``, TensorFlow's GPU list): a real GPU cannot be had in CI.
A real ONNX Runtime session asked for CUDA on a CPU build is exactly the "CUDA failed to
initialise" case (ONNX Runtime drops the provider and runs on CPU). The same on a real GPU, with
the GPU builds: tests/gpu (``./scripts/test.sh --gpu``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from models.backends import load_runtime, onnx_backend
from models.backends.devices import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    onnx_actual,
    onnx_expected,
    onnx_providers,
    tf_expected,
)
from models.repository import ModelVersion, read_config
from models.runtime import Threads

CUDA_BUILD = [CUDA_PROVIDER, CPU_PROVIDER]


def _version(demo_repo: Path, name: str) -> ModelVersion:
    directory = demo_repo / name / "1"
    return ModelVersion(name, 1, directory, read_config(directory / "config.toml"))


def test_cuda_first_with_cpu_fallback_when_the_build_has_it() -> None:
    assert onnx_providers(CUDA_BUILD) == [CUDA_PROVIDER, CPU_PROVIDER]
    assert onnx_providers(["AzureExecutionProvider", CPU_PROVIDER]) == [CPU_PROVIDER]


def test_expected_placement_says_why_not_cuda() -> None:
    gpu = onnx_expected(CUDA_BUILD, gpu_package=True)
    assert (gpu.device, gpu.engine) == ("cuda:0", CUDA_PROVIDER)
    cpu = onnx_expected([CPU_PROVIDER], gpu_package=False)
    assert cpu.device == "cpu"
    assert cpu.reason == "CUDAExecutionProvider not available: onnxruntime-gpu not installed"
    shadowed = onnx_expected([CPU_PROVIDER], gpu_package=True)
    assert "CPU onnxruntime wheel shadows it" in shadowed.reason


def test_a_session_that_lost_cuda_is_a_fallback() -> None:
    expected = onnx_expected(CUDA_BUILD, gpu_package=True)
    assert onnx_actual(expected, CUDA_BUILD, CUDA_BUILD).device == "cuda:0"
    fallback = onnx_actual(expected, CUDA_BUILD, [CPU_PROVIDER])
    assert fallback.device == "cpu"
    assert "failed to initialise, fell back to CPU" in fallback.reason


def test_tensorflow_placement() -> None:
    assert tf_expected(["GPU:0"], built_with_cuda=True).device == "cuda:0"
    no_build = tf_expected([], built_with_cuda=False)
    assert no_build.device == "cpu" and "pip install -e '.[gpu]'" in no_build.reason
    assert "pip install 'iotgw[gpu]'" not in no_build.reason  # on no index: it finds nothing
    no_gpu = tf_expected([], built_with_cuda=True)
    assert no_gpu.device == "cpu" and "sees no GPU" in no_gpu.reason


# ONNX Runtime warns that the CPU build has no CUDA provider: the very fallback under test.
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_onnx_session_falls_back_to_cpu_when_cuda_cannot_initialise(
    demo_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This onnxruntime claims CUDA (as a GPU build does) but cannot start it (as on a machine
    without the CUDA libraries): the model loads on CPU, serves, and says it fell back."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: CUDA_BUILD)
    runtime = load_runtime(_version(demo_repo, "sensor_mlp"), Threads(1, 1))
    try:
        assert isinstance(runtime, onnx_backend.OnnxRuntime)
        assert runtime.device == "cpu"
        assert "fell back to CPU" in runtime.placement.reason
        out = runtime.infer({"features": np.zeros((2, 32), np.float32)})
        assert out["probabilities"].shape == (2, 8)
    finally:
        runtime.close()


def test_onnx_session_on_a_cpu_build_says_why(demo_repo: Path) -> None:
    runtime = load_runtime(_version(demo_repo, "sensor_mlp"), Threads(1, 1))
    try:
        assert isinstance(runtime, onnx_backend.OnnxRuntime)
        if CUDA_PROVIDER not in ort.get_available_providers():
            assert runtime.device == "cpu"
            assert runtime.placement.reason.startswith("CUDAExecutionProvider not available")
    finally:
        runtime.close()


def test_tensorflow_runtime_takes_the_gpu_tensorflow_reports(
    demo_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a GPU listed the TF runtime says cuda:0; its session places ops with soft placement,
    so on this CPU machine the ops still run (on the CPU) and the model serves."""
    from models.backends import tf_backend

    monkeypatch.setattr(tf_backend, "_placement", None)
    monkeypatch.setattr(tf_backend.tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    runtime = load_runtime(_version(demo_repo, "sensor_mlp_tf"), Threads(1, 1))
    try:
        assert runtime.device == "cuda:0"
        out = runtime.infer({"features": np.zeros((1, 32), np.float32)})
        assert out["probabilities"].shape == (1, 8)
    finally:
        runtime.close()
        monkeypatch.setattr(tf_backend, "_placement", None)  # the real answer for later tests
