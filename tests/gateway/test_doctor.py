"""``iotgw doctor``: providers, devices, CUDA libraries, and where each model runs and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from gateway import doctor
from models.backends.devices import CPU_PROVIDER, CUDA_PROVIDER
from models.demo import config_toml
from models.repository import ModelConfig
from tests.gateway.helpers import make_repo

ROOT = Path(__file__).resolve().parents[2]


TF_HINT = (
    "TensorFlow is not installed: install the iotgw[tf] extra (pip install '.[tf]' in the iotgw "
    "source folder)"
)
QUANT_HINT = (
    "onnx is not installed: install the iotgw[quant] extra (pip install '.[quant]' in the iotgw "
    "source folder)"
)


@pytest.fixture
def repo(demo_repo: Path, tmp_path: Path) -> Path:
    """An ONNX model, a TensorFlow model, and a block-quantized ONNX Runtime checkpoint (whose
    graph needs onnx at load; the file is only a placeholder: doctor does not open it unless
    asked to with --load)."""
    root = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None, "sensor_mlp_tf": None})
    version = root / "sensor_mlp_int8" / "1"
    version.mkdir(parents=True)
    (version / "model.safetensors").write_bytes(b"")
    config = ModelConfig(runtime="onnxruntime", path="model.safetensors", format="checkpoint")
    (version / "config.toml").write_text(config_toml(config), encoding="utf-8")
    return root


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert doctor.main(list(argv)) == 0
    return capsys.readouterr().out


def test_json_report(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads(_run(capsys, "--model-repo", str(repo), "--json"))
    runtime = report["onnxruntime"]
    assert CPU_PROVIDER in runtime["available_providers"]
    assert runtime["will_use"][-1] == CPU_PROVIDER
    assert report["tensorflow"]["installed"] is True
    assert any(d.endswith("CPU:0") for d in report["tensorflow"]["devices"])
    assert set(report["cuda"]["libraries"]) == set(doctor.CUDA_LIBRARIES)
    rows = {r["model"]: r for r in report["models"]}
    assert rows["sensor_mlp"]["runtime"] == "onnxruntime"
    assert rows["sensor_mlp_tf"]["runtime"] == "tensorflow"
    assert {r["state"] for r in rows.values()} == {"READY"}


def test_text_names_the_provider_and_why(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if CUDA_PROVIDER in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    text = _run(capsys, "--model-repo", str(repo))
    assert (
        "sensor_mlp v1: onnxruntime CPUExecutionProvider "
        "(CUDAExecutionProvider not available: onnxruntime-gpu not installed)"
    ) in text
    assert "sensor_mlp_tf v1: tensorflow " in text
    assert "libcudnn.so.9 (cuDNN 9): " in text


def test_a_cpu_tensorflow_names_the_install_command_of_a_checkout(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """iotgw is on no package index: the GPU hint is the command that works in its checkout."""
    report = json.loads(_run(capsys, "--model-repo", str(repo), "--json"))
    if report["tensorflow"]["built_with_cuda"]:
        pytest.skip("this TensorFlow is built with CUDA")
    text = _run(capsys, "--model-repo", str(repo))
    assert "install the iotgw[gpu] extra (pip install -e '.[gpu]' in the iotgw source" in text
    assert "pip install 'iotgw[gpu]'" not in text


# ONNX Runtime warns that the CPU build has no CUDA provider: the fallback under test.
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_a_gpu_build_is_expected_on_cuda_and_load_shows_the_fallback(
    demo_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime reporting the CUDA provider (as onnxruntime-gpu does): doctor expects the
    GPU; with --load the session, unable to start CUDA here, shows the fallback to CPU."""
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_PROVIDER, CPU_PROVIDER])
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    expected = doctor.build_report(repo, load=False)
    assert expected["onnxruntime"]["will_use"] == [CUDA_PROVIDER, CPU_PROVIDER]
    assert expected["models"][0]["device"] == "cuda:0"
    loaded = doctor.build_report(repo, load=True)
    row = loaded["models"][0]
    assert row["device"] == "cpu" and "fell back to CPU" in row["reason"]


def _without(packages: str, *argv: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tests.without_packages", packages, "--", "doctor", *argv]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_missing_libraries_name_the_extra(repo: Path) -> None:
    report = _without("tensorflow,keras,onnx", "--model-repo", str(repo), "--json")
    assert report["tensorflow"] == {
        "installed": False,
        "note": TF_HINT,
    }
    rows = {r["model"]: r for r in report["models"]}
    assert rows["sensor_mlp"]["state"] == "READY"
    assert rows["sensor_mlp_tf"] == {
        "model": "sensor_mlp_tf",
        "version": 1,
        "runtime": "tensorflow",
        "state": "UNAVAILABLE",
        "reason": TF_HINT,
    }
    assert rows["sensor_mlp_int8"]["reason"] == QUANT_HINT


def test_without_a_repository_it_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = doctor.build_report(doctor.default_repository(tmp_path), load=False)
    assert report["models"] == [] and "give --model-repo" in report["repository_note"]


def test_a_checkpoint_file_is_reported_as_iotgw_serve_serves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from models.train.demo_weights import TRAINED_FILES, WEIGHTS_DIR

    monkeypatch.setenv("IOTGW_SERVING__CACHE_DIR", str(tmp_path / "cache"))  # not the home's
    checkpoint = WEIGHTS_DIR / TRAINED_FILES[("digits_cnn", 4)]
    report = json.loads(_run(capsys, "--model-repo", str(checkpoint), "--json"))
    assert report["repository"].startswith(str(tmp_path / "cache" / "checkpoint-repos"))
    (row,) = report["models"]
    assert (row["model"], row["runtime"]) == ("digits_cnn_int4", "onnxruntime")
    assert row["state"] == "READY"


def test_a_file_that_is_no_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IOTGW_SERVING__CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert doctor.main(["--model-repo", str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither a directory nor a block-quantized checkpoint" in err[0], err
