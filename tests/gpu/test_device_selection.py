"""The device every model is given on a GPU machine, as ``iotgw doctor --load`` reports it after
opening one session per model: ``cuda:0`` for both backends. With the GPU hidden
(``CUDA_VISIBLE_DEVICES=""``, so CUDA cannot initialise) the same GPU build falls back to the CPU,
says so, and still serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.conftest import MODELS, ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("cuda_onnxruntime", "cuda_tensorflow"),
]

# Opening a session per model, TensorFlow and the CUDA libraries loaded once: tens of seconds.
DOCTOR_TIMEOUT_S = 240


def _doctor(repo: Path, cache: Path, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "doctor",
            "--json",
            "--load",
            "--model-repo",
            str(repo),
        ],
        cwd=ROOT,
        env={**os.environ, "IOTGW_SERVING__CACHE_DIR": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=DOCTOR_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = {row["model"]: row for row in report["models"]}
    assert set(rows) == set(MODELS), rows
    return rows


def test_every_model_is_given_the_gpu(gpu_repo: Path, tmp_path: Path) -> None:
    report = _doctor(gpu_repo, tmp_path)
    assert "CUDAExecutionProvider" in report["onnxruntime"]["will_use"]
    assert report["onnxruntime"]["placement"]["device"] == "cuda:0"
    assert report["tensorflow"]["placement"]["device"] == "cuda:0"
    for name, row in _rows(report).items():
        assert (row["state"], row["device"]) == ("READY", "cuda:0"), (name, row)


def test_with_cuda_unable_to_initialise_every_model_falls_back_and_says_why(
    gpu_repo: Path, tmp_path: Path
) -> None:
    report = _doctor(gpu_repo, tmp_path, CUDA_VISIBLE_DEVICES="")
    for name, row in _rows(report).items():
        assert (row["state"], row["device"]) == ("READY", "cpu"), (name, row)
        if row["runtime"] == "onnxruntime":
            assert "failed to initialise, fell back to CPU" in row["reason"], row
        else:
            assert "TensorFlow sees no GPU" in row["reason"], row


def test_a_model_that_fell_back_serves(gpu_repo: Path, tmp_path: Path) -> None:
    """The fallen-back session answers what a CPU session computes."""
    code = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "from pathlib import Path\n"
        "from models.backends import load_runtime\n"
        "from models.repository import ModelVersion, read_config\n"
        "from models.runtime import Threads\n"
        "d = Path(sys.argv[1])\n"
        "rt = load_runtime(ModelVersion('vision_cnn', 1, d, read_config(d / 'config.toml')), "
        "Threads(1, 1))\n"
        "x = np.random.default_rng(0).random((2, *rt.metadata.inputs[0].shape[1:]), np.float32)\n"
        "name = rt.metadata.inputs[0].name\n"
        "got = next(iter(rt.infer({name: x}).values()))\n"
        "cpu = ort.InferenceSession(str(d / 'model.onnx'), providers=['CPUExecutionProvider'])\n"
        "want = cpu.run(None, {name: x})[0]\n"
        "print(rt.device, float(np.abs(got - want).max()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(gpu_repo / "vision_cnn" / "1")],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=DOCTOR_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    device, diff = done.stdout.split()[-2:]
    assert device == "cpu"
    assert float(diff) <= 1e-6  # the same CPU provider computes both
