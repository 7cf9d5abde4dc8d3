"""Request bodies and replies against docs/mqtt.md, checked with the responder's independent
parser; tensors generated from metadata or read from .npy files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from device_sim.payloads import Framing, RecordedPayloads, build_pool
from device_sim.tensors import DATATYPES, DataFile, InputSpec, ModelInputs, random_tensor
from device_sim.wire import (
    BINARY_CONTENT_TYPE,
    JSON_CONTENT_TYPE,
    OipBody,
    RawBody,
    body_from_payload,
    encode_request,
    parse_reply,
)
from tests.device_sim.responders import error_reply, parse_request, success_reply

FUSION = ModelInputs(
    "fusion",
    (InputSpec("image", "FP32", (-1, 2, 3)), InputSpec("tag", "INT64", (-1, 1))),
)


def test_json_request_carries_the_id_and_the_tensors() -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    body = encode_request({"x": x}, binary=False, timeout_us=25_000)
    assert body.content_type == JSON_CONTENT_TYPE
    header, tensors, binary = parse_request(body.mqtt("r-1"))
    assert not binary and tensors == b""
    assert header == {
        "id": "r-1",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6], "data": x[0].tolist()}],
        "parameters": {"timeout": 25_000},
    }
    assert body.http("r-1") == (body.mqtt("r-1"), None)


def test_binary_request_frames_raw_little_endian_tensors() -> None:
    a = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    b = np.array([[7]], dtype=np.int64)
    body = encode_request({"image": a, "tag": b}, binary=True)
    assert body.content_type == BINARY_CONTENT_TYPE
    header, tensors, binary = parse_request(body.mqtt("r-2"))
    assert binary and header["id"] == "r-2"
    assert header["parameters"] == {"binary_data_output": True}
    sizes = [i["parameters"]["binary_data_size"] for i in header["inputs"]]
    assert sizes == [24, 8] and len(tensors) == 32
    np.testing.assert_array_equal(np.frombuffer(tensors[:24], "<f4").reshape(1, 2, 3), a)
    assert np.frombuffer(tensors[24:], "<i8").tolist() == [7]
    http_body, header_length = body.http("r-2")
    assert json.loads(http_body[:header_length])["id"] == "r-2"
    assert http_body[header_length:] == tensors


def test_bytes_tensors_use_length_prefixed_elements() -> None:
    body = encode_request({"s": np.array([["ab", "c"]], dtype=object)}, binary=True)
    _, tensors, _ = parse_request(body.mqtt("r"))
    assert tensors == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 1) + b"c"


@pytest.mark.parametrize("binary", [False, True])
def test_a_recorded_payload_is_replayed_with_a_fresh_id(binary: bool) -> None:
    original = encode_request({"x": np.ones((1, 3), np.float32)}, binary=binary).mqtt("old")
    body = body_from_payload(original)
    assert isinstance(body, OipBody) and body.binary == binary
    header, tensors, _ = parse_request(body.mqtt("new"))
    old_header, old_tensors, _ = parse_request(original)
    assert header == {**old_header, "id": "new"} and tensors == old_tensors


def test_an_unreadable_recorded_payload_is_replayed_verbatim() -> None:
    body = body_from_payload(b"\x00garbage")
    assert isinstance(body, RawBody) and body.mqtt("any") == b"\x00garbage"


def test_replies_give_id_status_and_reason() -> None:
    assert parse_reply(success_reply("m", "r1", binary=False)) == parse_reply(
        success_reply("m", "r1", binary=True)
    )
    ok = parse_reply(success_reply("m", "r1", binary=True))
    assert (ok.id, ok.status, ok.reason) == ("r1", 200, None)
    err = parse_reply(error_reply("r2", 503, "deadline"))
    assert (err.id, err.status, err.reason) == ("r2", 503, "deadline")
    # The MQTT 5 user property wins over the body.
    assert parse_reply(b'{"id": "r3", "outputs": []}', "413").status == 413
    assert parse_reply(b"\xff\xfe").reason == "unreadable_reply"
    assert parse_reply(b'{"id": "r4"}').reason == "no_status"


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_random_tensors_fit_every_datatype(datatype: str) -> None:
    arr = random_tensor(InputSpec("x", datatype, (-1, 3, -1)), np.random.default_rng(0), 2)
    assert arr.shape == (2, 3, 1)
    body = encode_request({"x": arr}, binary=datatype != "BYTES")
    header, _, _ = parse_request(body.mqtt("r"))
    assert header["inputs"][0]["datatype"] == datatype


def test_pools_use_data_file_rows_and_generate_the_rest(tmp_path: Path) -> None:
    rows = np.arange(5 * 6, dtype=np.float32).reshape(5, 2, 3)
    np.save(tmp_path / "images.npy", rows)
    data = DataFile.parse(f"fusion:image={tmp_path / 'images.npy'}")
    pool = build_pool("fusion", FUSION, [data], Framing(batch=2), np.random.default_rng(0))
    assert len(pool.bodies) == 3  # 5 rows in batches of 2, wrapping around
    header, _, _ = parse_request(pool.body(2).mqtt("r"))
    image, tag = header["inputs"]
    assert [image["name"], tag["name"]] == ["image", "tag"]  # the model's input order
    assert image["shape"] == [2, 2, 3] and tag["shape"] == [2, 1]
    assert image["data"] == np.concatenate([rows[4:5], rows[0:1]]).ravel().tolist()
    assert pool.body(5) is pool.body(2)


def test_a_model_without_metadata_or_data_is_refused() -> None:
    with pytest.raises(ValueError, match="no inputs known for model 'm'"):
        build_pool("m", None, [], Framing(), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"MODEL:INPUT=FILE\.npy"):
        DataFile.parse("only.npy")


def test_trace_payloads_cannot_point_outside_the_trace_folder(tmp_path: Path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"{}")
    inside = tmp_path / "trace"
    inside.mkdir()
    (inside / "ok.bin").write_bytes(b'{"inputs": []}')
    payloads = RecordedPayloads(inside)
    assert isinstance(payloads.body("ok.bin"), OipBody)
    with pytest.raises(ValueError, match="outside the trace's folder"):
        payloads.body("../secret.bin")


def test_a_deadline_is_spliced_into_the_request_parameters() -> None:
    body = encode_request({"features": np.zeros((1, 32), np.float32)}, binary=True)
    payload = body.mqtt("r1", 1_700_000_000_000)
    n = int.from_bytes(payload[4:8], "little")
    header = json.loads(payload[8 : 8 + n])
    assert header["id"] == "r1"
    assert header["parameters"] == {
        "binary_data_output": True,
        "deadline_unix_ms": 1_700_000_000_000,
    }
    # A recorded payload replays without its (long past) deadline, with a fresh id.
    replayed = body_from_payload(payload).mqtt("r2")
    n = int.from_bytes(replayed[4:8], "little")
    again = json.loads(replayed[8 : 8 + n])
    assert again["id"] == "r2" and again["parameters"] == {"binary_data_output": True}
