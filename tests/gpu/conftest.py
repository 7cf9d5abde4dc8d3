"""Fixtures of the GPU tests (marker ``gpu``): a small repository with both backends' models,
fp32 and block-quantized, and the checks that say whether there is a GPU to test.

Without an NVIDIA GPU (``scripts/gpu_check.sh``) or without the GPU builds (onnxruntime with
its CUDA provider, TensorFlow built with CUDA), each test skips and says which is missing. The
GPU lane sets ``IOTGW_REQUIRE_GPU=1``: there such a test fails instead, since a skip would mean
the lane tested no GPU. Where both are present, a model that still lands on the CPU is a failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from models.demo import DEMO_MODELS, VERSION, write_model_version

ROOT = Path(__file__).resolve().parents[2]
# What tests/gpu serves: each backend's fp32 model and a block-quantized checkpoint (the serving
# plan's path), the CNN on ONNX Runtime (real work per row), the MLP on TensorFlow.
MODELS = ("vision_cnn", "vision_cnn_int4", "sensor_mlp", "sensor_mlp_tf", "sensor_mlp_int8_tf")


def require(ready: bool, reason: str) -> None:
    """Skip with ``reason`` unless ``ready``; in the GPU lane, fail instead."""
    if ready:
        return
    if os.environ.get("IOTGW_REQUIRE_GPU") == "1":
        pytest.fail(f"the GPU lane cannot test the GPU: {reason}", pytrace=False)
    pytest.skip(reason)


def nvidia_gpu() -> tuple[bool, str]:
    """(whether there is an NVIDIA GPU, the line that says which or why not): the lane's own
    check, ``scripts/gpu_check.sh``."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0, done.stdout.strip()


@pytest.fixture(scope="session")
def gpu() -> str:
    """The GPU's line (``nvidia-smi -L``); skips without one."""
    found, line = nvidia_gpu()
    require(found, line)
    return line


@pytest.fixture(scope="session")
def cuda_onnxruntime(gpu: str) -> None:
    """An onnxruntime that has the CUDA provider (the onnxruntime-gpu build alone)."""
    import onnxruntime as ort

    from models.backends.devices import CUDA_PROVIDER

    available = ort.get_available_providers()
    require(
        CUDA_PROVIDER in available,
        f"onnxruntime {ort.__version__} has no {CUDA_PROVIDER} (providers: {available}): "
        "the CPU build, or both builds installed (docs/gpu.md)",
    )


@pytest.fixture(scope="session")
def cuda_tensorflow(gpu: str) -> None:
    """A TensorFlow built with CUDA that sees the GPU."""
    from models import tf_env  # noqa: F401  isort: skip
    import tensorflow as tf

    require(tf.test.is_built_with_cuda(), f"TensorFlow {tf.__version__} is built without CUDA")
    gpus = tf.config.list_physical_devices("GPU")
    require(bool(gpus), "TensorFlow sees no GPU (CUDA or cuDNN libraries missing?)")


@pytest.fixture(scope="session")
def gpu_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``MODELS`` of the demo repository (same weights and configs), built once."""
    root = tmp_path_factory.mktemp("gpu-repo")
    for demo in DEMO_MODELS:
        if demo.name in MODELS:
            write_model_version(demo, root / demo.name / str(VERSION))
    return root
