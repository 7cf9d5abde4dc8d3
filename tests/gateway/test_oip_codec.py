"""The Open Inference Protocol codec on its own: output framing choices and MQTT framing."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from gateway.codecs import oip
from gateway.errors import BadRequest, DeadlineUnmeetable
from gateway.types import InferenceResponse


def _request(**extra: object) -> bytes:
    body: dict[str, object] = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]
    }
    body.update(extra)
    return json.dumps(body).encode()


def test_an_output_asking_for_json_wins_over_the_request_wide_binary_flag() -> None:
    body = _request(
        parameters={"binary_data_output": True},
        outputs=[{"name": "a", "parameters": {"binary_data": False}}, {"name": "b"}],
    )
    _, fmt = oip.decode_request(body, model="m", version=None)
    assert not fmt.is_binary("a")
    assert fmt.is_binary("b")
    response = InferenceResponse(
        model="m",
        version=1,
        outputs={"a": np.arange(2, dtype=np.float32), "b": np.arange(3, dtype=np.int64)},
    )
    payload, header_length = oip.encode_response(response, fmt)
    assert header_length is not None
    header = json.loads(payload[:header_length])
    a, b = header["outputs"]
    assert a["data"] == [0.0, 1.0] and "parameters" not in a
    assert b["parameters"]["binary_data_size"] == 24
    np.testing.assert_array_equal(np.frombuffer(payload[header_length:], dtype="<i8"), np.arange(3))


def test_model_version_parameter_selects_the_version() -> None:
    request, _ = oip.decode_request(
        _request(parameters={"model_version": "2"}), model="m", version=None
    )
    assert request.version == 2
    with pytest.raises(BadRequest, match="model_version"):
        oip.decode_request(_request(parameters={"model_version": "x"}), model="m", version=None)


def test_mqtt_framing_round_trip() -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "datatype": "FP32",
                    "shape": [2],
                    "parameters": {"binary_data_size": 8},
                }
            ]
        }
    ).encode()
    raw = np.array([1.5, -2.0], dtype="<f4").tobytes()
    body, length = oip.unframe(oip.frame(header + raw, len(header)))
    request, _ = oip.decode_request(body, model="m", version=None, header_length=length)
    np.testing.assert_array_equal(request.inputs["x"], [1.5, -2.0])
    assert oip.unframe(b'{"inputs": []}') == (b'{"inputs": []}', None)
    with pytest.raises(BadRequest, match="prefix"):
        oip.unframe(b"OIPB\x01")


def test_an_absolute_deadline_bounds_the_time_budget() -> None:
    soon = time.time() * 1000 + 5_000
    request, _ = oip.decode_request(
        _request(parameters={"deadline_unix_ms": soon}), model="m", version=None
    )
    assert request.timeout_s is not None and 0 < request.timeout_s <= 5.0
    # With a relative timeout too, the earlier of the two holds.
    request, _ = oip.decode_request(
        _request(parameters={"deadline_unix_ms": soon, "timeout": 1_000}), model="m", version=None
    )
    assert request.timeout_s == pytest.approx(0.001)


def test_a_deadline_already_passed_is_refused_as_unmeetable() -> None:
    passed = time.time() * 1000 - 250
    with pytest.raises(DeadlineUnmeetable, match="passed") as caught:
        oip.decode_request(
            _request(parameters={"deadline_unix_ms": passed}), model="m", version=None
        )
    assert caught.value.status == 503 and caught.value.reason == "deadline"


@pytest.mark.parametrize("bad", [True, "soon", -1, 0])
def test_a_malformed_deadline_is_a_bad_request(bad: object) -> None:
    with pytest.raises(BadRequest, match="deadline_unix_ms"):
        oip.decode_request(_request(parameters={"deadline_unix_ms": bad}), model="m", version=None)
