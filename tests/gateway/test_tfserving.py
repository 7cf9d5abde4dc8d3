"""TF Serving REST API: model status, metadata, and ``:predict`` in row (``instances``) and
columnar (``inputs``) formats, for single- and multi-input models, against direct runtime calls."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.gateway.helpers import Reference, random_inputs

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as r:
        return r.status, await r.json()


async def _post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("model", ["sensor_mlp", "vision_cnn_tf", "sensor_fusion"])
async def test_model_status(http: aiohttp.ClientSession, url: str, model: str) -> None:
    want = {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    assert await _get(http, f"{url}/v1/models/{model}") == (200, want)
    assert await _get(http, f"{url}/v1/models/{model}/versions/1") == (200, want)


async def test_status_of_unknown_model_and_version_is_404(
    http: aiohttp.ClientSession, url: str
) -> None:
    status, body = await _get(http, f"{url}/v1/models/no_such_model")
    assert status == 404
    assert "no_such_model" in body["error"]
    status, body = await _get(http, f"{url}/v1/models/sensor_mlp/versions/4")
    assert status == 404
    assert "version 4" in body["error"]


async def test_metadata_of_a_multi_input_model(http: aiohttp.ClientSession, url: str) -> None:
    status, body = await _get(http, f"{url}/v1/models/sensor_fusion_tf/metadata")
    assert status == 200
    assert body["model_spec"] == {
        "name": "sensor_fusion_tf",
        "signature_name": "",
        "version": "1",
    }
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"

    def dims(t: dict[str, Any]) -> list[int]:
        return [int(d["size"]) for d in t["tensor_shape"]["dim"]]

    assert {n: (t["dtype"], dims(t)) for n, t in sig["inputs"].items()} == {
        "accel": ("DT_FLOAT", [-1, 3]),
        "temperature": ("DT_FLOAT", [-1, 1]),
    }
    assert {n: (t["dtype"], dims(t)) for n, t in sig["outputs"].items()} == {
        "probabilities": ("DT_FLOAT", [-1, 4])
    }


async def test_versioned_metadata(http: aiohttp.ClientSession, url: str) -> None:
    status, body = await _get(http, f"{url}/v1/models/vision_cnn/versions/1/metadata")
    assert status == 200
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert [int(d["size"]) for d in sig["inputs"]["image"]["tensor_shape"]["dim"]] == [
        -1,
        32,
        32,
        3,
    ]


@pytest.mark.parametrize("model", ["sensor_mlp", "sensor_mlp_tf", "vision_cnn"])
@pytest.mark.parametrize("versioned", [False, True], ids=["default-version", "version-1"])
async def test_predict_single_input_rows_and_columns(
    http: aiohttp.ClientSession, url: str, reference: Reference, model: str, versioned: bool
) -> None:
    metadata = reference.metadata(model)
    (spec,) = metadata.inputs
    x = random_inputs(metadata, 3, np.random.default_rng(7))[spec.name]
    want = reference.infer(model, {spec.name: x})["probabilities"]
    path = f"{url}/v1/models/{model}" + ("/versions/1" if versioned else "") + ":predict"

    status, body = await _post(http, path, {"instances": x.tolist()})
    assert status == 200, body
    got = np.asarray(body["predictions"], dtype=np.float32)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)

    status, body = await _post(http, path, {"instances": [{spec.name: row.tolist()} for row in x]})
    assert status == 200, body
    np.testing.assert_array_equal(np.asarray(body["predictions"], dtype=np.float32), want)

    status, body = await _post(
        http, path, {"signature_name": "serving_default", "inputs": x.tolist()}
    )
    assert status == 200, body
    got = np.asarray(body["outputs"], dtype=np.float32)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("model", ["sensor_fusion", "sensor_fusion_tf"])
async def test_predict_multi_input_rows_and_columns(
    http: aiohttp.ClientSession, url: str, reference: Reference, model: str
) -> None:
    x = random_inputs(reference.metadata(model), 4, np.random.default_rng(11))
    want = reference.infer(model, x)["probabilities"]
    path = f"{url}/v1/models/{model}:predict"

    instances = [
        {"accel": x["accel"][i].tolist(), "temperature": x["temperature"][i].tolist()}
        for i in range(4)
    ]
    status, body = await _post(http, path, {"instances": instances})
    assert status == 200, body
    got = np.asarray(body["predictions"], dtype=np.float32)
    assert got.shape == (4, 4)
    np.testing.assert_array_equal(got, want)

    columns = {name: arr.tolist() for name, arr in x.items()}
    status, body = await _post(http, path, {"inputs": columns})
    assert status == 200, body
    got = np.asarray(body["outputs"], dtype=np.float32)
    assert got.shape == (4, 4)
    np.testing.assert_array_equal(got, want)


_B64 = base64.b64encode(np.zeros(32, dtype=np.float32).tobytes()).decode()


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("sensor_mlp", {"instances": [{"b64": _B64}]}),
        ("sensor_mlp", {"inputs": {"b64": _B64}}),
        ("sensor_mlp", {"inputs": [{"b64": _B64}]}),
        ("sensor_fusion", {"instances": [{"accel": {"b64": _B64}, "temperature": [1.0]}]}),
        ("sensor_fusion", {"inputs": {"accel": [{"b64": _B64}], "temperature": [[1.0]]}}),
    ],
    ids=["row", "column-object", "column-list", "named-row", "named-column"],
)
async def test_b64_on_a_numeric_input_is_a_400_naming_b64(
    http: aiohttp.ClientSession, url: str, model: str, body: dict[str, Any]
) -> None:
    status, reply = await _post(http, f"{url}/v1/models/{model}:predict", body)
    assert status == 400
    assert set(reply) == {"error"}
    assert "b64" in reply["error"]


@pytest.mark.parametrize(
    ("model", "body", "status", "words"),
    [
        ("no_such_model", {"instances": [[0.0] * 32]}, 404, ["no_such_model"]),
        ("sensor_mlp", {"instances": [[0.0] * 32], "inputs": [[0.0] * 32]}, 400, ["instances"]),
        ("sensor_mlp", {"signature_name": "other", "instances": [[0.0]]}, 400, ["other"]),
        ("sensor_mlp", {"instances": []}, 400, ["instances"]),
        ("sensor_mlp", {"instances": [[0.0] * 31]}, 400, ["shape", "features"]),
        ("sensor_mlp", {"instances": [[0.0] * 32, [0.0] * 31]}, 400, ["ragged"]),
        ("sensor_mlp", {"instances": [["a"] * 32]}, 400, ["strings", "FP32"]),
        ("sensor_mlp", {"instances": [[1e39] * 32]}, 400, ["out of range", "FP32"]),
        ("sensor_fusion", {"instances": [[0.0] * 3]}, 400, ["several inputs"]),
        ("sensor_fusion", {"instances": [{"accel": [0.0] * 3}]}, 400, ["temperature"]),
        ("sensor_fusion", {"inputs": {"accel": [[0.0] * 3]}}, 400, ["temperature"]),
    ],
    ids=[
        "unknown-model",
        "both-formats",
        "unknown-signature",
        "empty-instances",
        "wrong-shape",
        "ragged",
        "strings",
        "beyond-fp32",
        "unnamed-multi-input",
        "missing-input-row",
        "missing-input-column",
    ],
)
async def test_predict_errors_are_json_objects_naming_the_problem(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    body: dict[str, Any],
    status: int,
    words: list[str],
) -> None:
    got_status, reply = await _post(http, f"{url}/v1/models/{model}:predict", body)
    assert got_status == status
    assert set(reply) == {"error"}
    for word in words:
        assert word in reply["error"]
    # The gateway keeps serving.
    ok, good = await _post(http, f"{url}/v1/models/sensor_mlp:predict", {"instances": [[0.5] * 32]})
    assert ok == 200
    assert np.asarray(good["predictions"]).shape == (1, 8)


async def test_malformed_json_is_a_400(http: aiohttp.ClientSession, url: str) -> None:
    async with http.post(f"{url}/v1/models/sensor_mlp:predict", data=b'{"instances": [') as r:
        assert r.status == 400
        assert "malformed JSON" in (await r.json())["error"]
