"""A client written by others, Triton's ``tritonclient[http]``, against a real ``iotgw serve``
process: health, model readiness and metadata, the repository index, and inference in JSON and
binary-tensor modes, with outputs equal to a direct call of the same runtime."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.gateway.helpers import Reference, random_inputs

# One `iotgw serve` process loading all six demo models (TensorFlow too): ~8 s before the first
# test, which is what the index and metadata tests are about.
pytestmark = pytest.mark.slow

DEMO_MODELS = [
    "sensor_fusion",
    "sensor_fusion_tf",
    "sensor_mlp",
    "sensor_mlp_tf",
    "vision_cnn",
    "vision_cnn_tf",
]
_READY_LINE = re.compile(r"ready: http://127\.0\.0\.1:(\d+)/v2")


def _iotgw_command() -> list[str]:
    script = Path(sys.executable).with_name("iotgw")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]


@pytest.fixture(scope="module")
def server_url(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``iotgw serve`` in its own process on a free port; yields ``host:port`` once every model
    finished loading (the CLI logs a ``ready:`` line with the bound port)."""
    work = tmp_path_factory.mktemp("iotgw-serve")
    log_path = work / "serve.log"
    env = {**os.environ, "IOTGW_LOG_LEVEL": "INFO"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *_iotgw_command(),
                "serve",
                "--host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--model-repo",
                str(demo_repo),
                "--cache-dir",
                str(work / "cache"),
                "--no-mqtt",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        port = None
        give_up = time.monotonic() + 180  # a bound on start-up, not an assertion on its speed
        while port is None:
            text = log_path.read_text(errors="replace")
            match = _READY_LINE.search(text)
            if match:
                port = match.group(1)
                break
            if proc.poll() is not None or time.monotonic() > give_up:
                pytest.fail(f"iotgw serve did not become ready (exit {proc.poll()}):\n{text}")
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log_path.read_text(errors="replace")


@pytest.fixture(scope="module")
def client(server_url: str) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(url=server_url)
    yield c
    c.close()


def test_server_is_live_and_ready(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "iotgw"
    assert "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("model", DEMO_MODELS)
def test_every_model_is_ready(client: triton.InferenceServerClient, model: str) -> None:
    assert client.is_model_ready(model)
    assert client.is_model_ready(model, model_version="1")


def test_unknown_model_or_version_is_not_ready(client: triton.InferenceServerClient) -> None:
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("sensor_mlp", model_version="9")


def test_repository_index_lists_every_model(client: triton.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    assert sorted(index, key=lambda e: e["name"]) == [
        {"name": name, "version": "1", "state": "READY"} for name in DEMO_MODELS
    ]


@pytest.mark.parametrize("model", ["sensor_fusion", "sensor_fusion_tf"])
def test_model_metadata_of_a_multi_input_model(
    client: triton.InferenceServerClient, model: str
) -> None:
    meta = client.get_model_metadata(model)
    assert meta["name"] == model
    assert meta["versions"] == ["1"]
    assert meta["platform"] == (
        "tensorflow_savedmodel" if model.endswith("_tf") else "onnxruntime_onnx"
    )
    assert meta["inputs"] == [
        {"name": "accel", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "temperature", "datatype": "FP32", "shape": [-1, 1]},
    ]
    assert meta["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]}]


def test_model_metadata_of_a_versioned_image_model(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("vision_cnn_tf", model_version="1")
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 32, 32, 3]}]
    assert meta["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]


def test_metadata_of_an_unknown_model_is_a_404(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("no_such_model")
    assert info.value.status() == "404"
    assert "no_such_model" in info.value.message()


@pytest.mark.parametrize("binary_out", [True, False], ids=["out-binary", "out-json"])
@pytest.mark.parametrize("binary_in", [True, False], ids=["in-binary", "in-json"])
@pytest.mark.parametrize("model", DEMO_MODELS)
def test_inference_equals_a_direct_runtime_call(
    client: triton.InferenceServerClient,
    reference: Reference,
    model: str,
    binary_in: bool,
    binary_out: bool,
) -> None:
    metadata = reference.metadata(model)
    rng = np.random.default_rng(zlib.crc32(f"{model}{binary_in}{binary_out}".encode()))
    arrays = random_inputs(metadata, 5, rng)
    inputs = []
    for name, arr in arrays.items():
        inp = triton.InferInput(name, list(arr.shape), "FP32")
        inp.set_data_from_numpy(arr, binary_data=binary_in)
        inputs.append(inp)
    (out_spec,) = metadata.outputs
    outputs = [triton.InferRequestedOutput(out_spec.name, binary_data=binary_out)]
    request_id = f"req-{model}-{binary_in:d}{binary_out:d}"

    result = client.infer(model, inputs, outputs=outputs, request_id=request_id, model_version="1")

    response = result.get_response()
    assert response["id"] == request_id
    assert response["model_name"] == model
    assert response["model_version"] == "1"
    got = result.as_numpy(out_spec.name)
    want = reference.infer(model, arrays)[out_spec.name]
    assert got.dtype == np.float32
    assert got.shape == (5, *out_spec.shape[1:])
    # The request is alone in its batch and the gateway's instance has the reference's threads
    # (1, 1): both backends compute the very same bits, and JSON carries float32 exactly.
    np.testing.assert_array_equal(got, want)


def test_bad_datatype_is_reported_to_the_client(client: triton.InferenceServerClient) -> None:
    inp = triton.InferInput("features", [1, 32], "FP64")
    inp.set_data_from_numpy(np.zeros((1, 32), dtype=np.float64), binary_data=True)
    with pytest.raises(InferenceServerException) as info:
        client.infer("sensor_mlp", [inp])
    assert info.value.status() == "400"
    message = info.value.message()
    assert "features" in message and "FP64" in message and "FP32" in message
    # ... and the server keeps serving.
    good = triton.InferInput("features", [1, 32], "FP32")
    good.set_data_from_numpy(np.ones((1, 32), dtype=np.float32))
    assert client.infer("sensor_mlp", [good]).as_numpy("probabilities").shape == (1, 8)
