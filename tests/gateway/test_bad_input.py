"""Bad Open Inference Protocol requests: each is answered with the right status and an
``{"error": ...}`` naming the problem, and the gateway serves a good request right after."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.gateway.helpers import (
    HEADER_LENGTH,
    Reference,
    base_url,
    binary_request,
    decode_response,
    infer_binary,
    json_request,
    make_repo,
    running_gateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

FEATURES = np.linspace(-1.0, 1.0, 32, dtype=np.float32).reshape(1, 32)
_GOOD = {"name": "features", "datatype": "FP32", "shape": [1, 32], "data": FEATURES[0].tolist()}


def _body(**fields: Any) -> bytes:
    return json.dumps({"inputs": [_GOOD], **fields}).encode()


def _features(**changes: Any) -> bytes:
    return json.dumps({"inputs": [{**_GOOD, **changes}]}).encode()


def _binary(
    arr: np.ndarray, *, declared: int | None = None, extra: bytes = b""
) -> tuple[bytes, bytes]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": list(arr.shape),
                    "parameters": {
                        "binary_data_size": arr.nbytes if declared is None else declared
                    },
                }
            ]
        }
    ).encode()
    return head, arr.astype("<f4").tobytes() + extra


def _binary_case(arr: np.ndarray, **kw: Any) -> tuple[bytes, dict[str, str]]:
    head, raw = _binary(arr, **kw)
    return head + raw, {HEADER_LENGTH: str(len(head))}


def _nan_features() -> np.ndarray:
    arr = FEATURES.copy()
    arr[0, 5] = np.nan
    return arr


def _inf_features() -> np.ndarray:
    arr = FEATURES.copy()
    arr[0, 0] = -np.inf
    return arr


def _fusion(accel_rows: int, temp_rows: int, **extra: Any) -> bytes:
    inputs = [
        {
            "name": "accel",
            "datatype": "FP32",
            "shape": [accel_rows, 3],
            "data": [0.1] * 3 * accel_rows,
        },
        {
            "name": "temperature",
            "datatype": "FP32",
            "shape": [temp_rows, 1],
            "data": [20.0] * temp_rows,
        },
    ]
    return json.dumps({"inputs": inputs, **extra}).encode()


_BIG = np.zeros((129, 32), dtype=np.float32)
_SHORT_HEAD, _SHORT_RAW = _binary(FEATURES)

# (model path, body, headers, status, words the error message must contain)
CASES: dict[str, tuple[str, bytes, dict[str, str], int, list[str]]] = {
    "malformed-json": ("sensor_mlp", b'{"inputs": [', {}, 400, ["malformed JSON"]),
    "not-utf8": ("sensor_mlp", b"\xff\xfe{", {}, 400, ["malformed JSON"]),
    "not-an-object": ("sensor_mlp", b"[1, 2]", {}, 400, ["JSON object"]),
    "inputs-not-a-list": ("sensor_mlp", b'{"inputs": {}}', {}, 400, ["'inputs'"]),
    "fp64-for-fp32-json": (
        "sensor_mlp",
        _features(datatype="FP64"),
        {},
        400,
        ["'features'", "FP64", "FP32"],
    ),
    "fp64-for-fp32-binary": (
        "sensor_mlp",
        *binary_request({"features": FEATURES.astype(np.float64)}, datatype="FP64"),
        400,
        ["'features'", "FP64", "FP32"],
    ),
    "int32-for-fp32": (
        "sensor_mlp",
        _features(datatype="INT32", data=[1] * 32),
        {},
        400,
        ["'features'", "INT32", "FP32"],
    ),
    "unknown-datatype": ("sensor_mlp", _features(datatype="FLOAT"), {}, 400, ["FLOAT", "datatype"]),
    "wrong-shape": (
        "sensor_mlp",
        _features(shape=[1, 31], data=[0.0] * 31),
        {},
        400,
        ["'features'", "shape", "[1, 31]", "[-1, 32]"],
    ),
    "wrong-rank": (
        "sensor_mlp",
        _features(shape=[32], data=[0.0] * 32),
        {},
        400,
        ["'features'", "shape", "[32]"],
    ),
    "data-a-string": (
        "sensor_mlp",
        _features(data="abc"),
        {},
        400,
        ["'features'", "'data' is a string", "list of 32 numbers"],
    ),
    "data-strings-short": (
        "sensor_mlp",
        _features(data=["abc"]),
        {},
        400,
        ["'features'", "strings are not valid FP32 data"],
    ),
    "data-count-not-shape": (
        "sensor_mlp",
        _features(data=[0.0] * 31),
        {},
        400,
        ["'features'", "31 values", "[1, 32]"],
    ),
    "negative-dimension": ("sensor_mlp", _features(shape=[1, -32]), {}, 400, ["shape"]),
    "zero-rows": ("sensor_mlp", _features(shape=[0, 32], data=[]), {}, 400, ["at least 1"]),
    "unknown-model": ("no_such_model", _body(), {}, 404, ["no_such_model"]),
    "unknown-version": ("sensor_mlp/versions/3", _body(), {}, 404, ["sensor_mlp", "version 3"]),
    "binary-shorter-than-declared": (
        "sensor_mlp",
        _SHORT_HEAD + _SHORT_RAW[:64],
        {HEADER_LENGTH: str(len(_SHORT_HEAD))},
        400,
        ["'features'", "declares 128", "only 64"],
    ),
    "binary-longer-than-declared": (
        "sensor_mlp",
        *_binary_case(FEATURES, extra=b"\0" * 8),
        400,
        ["binary section has 136 bytes", "declare 128"],
    ),
    "binary-wrong-shape": (
        "sensor_mlp",
        *_binary_case(FEATURES[:, :16], declared=64),
        400,
        ["'features'", "shape"],
    ),
    "binary-size-disagrees-with-shape": (
        "sensor_mlp",
        _SHORT_HEAD.replace(b"128", b"124") + _SHORT_RAW[:124],
        {HEADER_LENGTH: str(len(_SHORT_HEAD))},
        400,
        ["'features'", "124 bytes", "needs 128"],
    ),
    "nan-binary": ("sensor_mlp", *_binary_case(_nan_features()), 400, ["'features'", "NaN"]),
    "inf-binary": ("sensor_mlp", *_binary_case(_inf_features()), 400, ["'features'", "infinity"]),
    "nan-json-literal": (
        "sensor_mlp",
        _body().replace(b"[-1.0,", b"[NaN,"),
        {},
        400,
        ["'features'", "NaN"],
    ),
    "infinity-json-literal": (
        "sensor_mlp",
        _body().replace(b"[-1.0,", b"[Infinity,"),
        {},
        400,
        ["'features'", "infinity"],
    ),
    "finite-json-number-beyond-fp32": (
        "sensor_mlp",
        _body().replace(b"[-1.0,", b"[-1e39,"),
        {},
        400,
        ["'features'", "out of range", "FP32"],
    ),
    "strings-in-fp32": (
        "sensor_mlp",
        _features(data=["0.5"] * 32),
        {},
        400,
        ["'features'", "strings", "FP32"],
    ),
    "null-in-fp32": (
        "sensor_mlp",
        _features(data=[None] * 32),
        {},
        400,
        ["'features'", "null", "FP32"],
    ),
    "booleans-in-fp32": (
        "sensor_mlp",
        _features(data=[True] * 32),
        {},
        400,
        ["'features'", "booleans", "FP32"],
    ),
    "ragged-data": (
        "sensor_mlp",
        _features(shape=[2, 32], data=[[0.0] * 32, [0.0] * 31]),
        {},
        400,
        ["'features'", "ragged"],
    ),
    "missing-input": (
        "sensor_fusion",
        json.dumps(
            {"inputs": [{"name": "accel", "datatype": "FP32", "shape": [1, 3], "data": [0, 0, 0]}]}
        ).encode(),
        {},
        400,
        ["missing input", "temperature"],
    ),
    "unexpected-input": (
        "sensor_mlp",
        json.dumps(
            {
                "inputs": [
                    _GOOD,
                    {"name": "bogus", "datatype": "FP32", "shape": [1, 1], "data": [0.0]},
                ]
            }
        ).encode(),
        {},
        400,
        ["unexpected input", "bogus", "features"],
    ),
    "input-twice": (
        "sensor_mlp",
        json.dumps({"inputs": [_GOOD, _GOOD]}).encode(),
        {},
        400,
        ["twice"],
    ),
    "inputs-disagree-on-rows": (
        "sensor_fusion",
        _fusion(2, 3),
        {},
        400,
        ["batch dimension", "2", "3"],
    ),
    "batch-over-limit": (
        "sensor_mlp",
        *binary_request({"features": _BIG}),
        400,
        ["129 rows", "limit of 128"],
    ),
    "unknown-output": (
        "sensor_mlp",
        _body(outputs=[{"name": "logits"}]),
        {},
        400,
        ["unknown output", "logits", "probabilities"],
    ),
    "header-length-not-a-number": (
        "sensor_mlp",
        _body(),
        {HEADER_LENGTH: "twelve"},
        400,
        [HEADER_LENGTH, "twelve"],
    ),
    "header-length-beyond-body": (
        "sensor_mlp",
        _body(),
        {HEADER_LENGTH: "100000"},
        400,
        [HEADER_LENGTH, "100000"],
    ),
    "header-length-negative": ("sensor_mlp", _body(), {HEADER_LENGTH: "-3"}, 400, [HEADER_LENGTH]),
    "header-length-cuts-json": (
        "sensor_mlp",
        _body(),
        {HEADER_LENGTH: "10"},
        400,
        ["malformed JSON"],
    ),
    "timeout-not-a-number": (
        "sensor_mlp",
        _body(parameters={"timeout": "soon"}),
        {},
        400,
        ["timeout"],
    ),
    "priority-negative": (
        "sensor_mlp",
        _body(parameters={"priority": -1}),
        {},
        400,
        ["priority"],
    ),
    "id-not-a-string": ("sensor_mlp", _body(id=7), {}, 400, ["'id'"]),
}


async def _good_request_still_served(
    http: aiohttp.ClientSession, url: str, reference: Reference
) -> None:
    status, outputs, _ = await infer_binary(http, url, "sensor_mlp", {"features": FEATURES})
    assert status == 200, outputs
    assert isinstance(outputs, dict)
    np.testing.assert_array_equal(
        outputs["probabilities"],
        reference.infer("sensor_mlp", {"features": FEATURES})["probabilities"],
    )


@pytest.mark.parametrize("case", list(CASES))
async def test_bad_request_is_answered_and_the_gateway_keeps_serving(
    http: aiohttp.ClientSession, url: str, reference: Reference, case: str
) -> None:
    path, body, headers, status, words = CASES[case]
    async with http.post(f"{url}/v2/models/{path}/infer", data=body, headers=headers) as r:
        assert r.status == status
        assert r.content_type == "application/json"
        reply = await r.json()
    assert set(reply) == {"error"}
    for word in words:
        assert word in reply["error"], reply["error"]
    await _good_request_still_served(http, url, reference)


async def test_json_and_binary_requests_name_outputs_and_echo_the_id(
    http: aiohttp.ClientSession, url: str, reference: Reference
) -> None:
    """The good request the cases above are compared with, in JSON mode with an id."""
    body = json_request({"features": FEATURES}, id="dev-42/7", outputs=["probabilities"])
    async with http.post(f"{url}/v2/models/sensor_mlp/versions/1/infer", json=body) as r:
        assert r.status == 200
        raw = await r.read()
        headers = r.headers
    reply = json.loads(raw)
    assert reply["id"] == "dev-42/7"
    assert reply["model_name"] == "sensor_mlp"
    assert reply["model_version"] == "1"
    np.testing.assert_array_equal(
        decode_response(raw, headers)["probabilities"],
        reference.infer("sensor_mlp", {"features": FEATURES})["probabilities"],
    )


async def test_unknown_route_is_a_json_404(http: aiohttp.ClientSession, url: str) -> None:
    async with http.get(f"{url}/v2/nothing/here") as r:
        assert r.status == 404
        assert "/v2/nothing/here" in (await r.json())["error"]


@pytest.mark.slow
async def test_body_over_the_size_limit_is_a_413(
    http: aiohttp.ClientSession,
    demo_repo: Path,
    tmp_path: Path,
    reference: Reference,
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    async with running_gateway(repo, tmp_path / "cache", max_body_bytes=4096) as gw:
        url = base_url(gw)
        big = np.zeros((40, 32), dtype=np.float32)  # 5 KiB of binary data, over 4 KiB
        body, headers = binary_request({"features": big})
        assert len(body) > 4096
        async with http.post(f"{url}/v2/models/sensor_mlp/infer", data=body, headers=headers) as r:
            assert r.status == 413
            error = (await r.json())["error"]
        assert "4096" in error and str(len(body)) in error

        # The same without a Content-Length (chunked): refused while reading.
        async def chunks():
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]

        async with http.post(
            f"{url}/v2/models/sensor_mlp/infer", data=chunks(), headers=headers
        ) as r:
            assert r.status == 413
            assert "4096" in (await r.json())["error"]

        # TF Serving bodies have the same limit.
        async with http.post(
            f"{url}/v1/models/sensor_mlp:predict", json={"instances": big.tolist()}
        ) as r:
            assert r.status == 413
            assert "4096" in (await r.json())["error"]

        # A body under the limit is served.
        small = FEATURES
        status, outputs, _ = await infer_binary(http, url, "sensor_mlp", {"features": small})
        assert status == 200, outputs
        assert isinstance(outputs, dict)
        np.testing.assert_array_equal(
            outputs["probabilities"],
            reference.infer("sensor_mlp", {"features": small})["probabilities"],
        )
