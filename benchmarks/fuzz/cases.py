"""What the fuzzer sends: one HTTP request, one MQTT publish or one gRPC call, as plain picklable
records (they are generated in a worker process), and the well-formed requests interleaved
between them.

An MQTT case's topic and Response Topic are templates: ``{n}`` becomes the request's sequence
number when it is sent, so every request has a device (and a reply route) of its own and a reply
is matched to its request by the topic it arrives on, whatever the payload or properties did.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from gateway.codecs.oip import HEADER_LENGTH

MODEL = "sensor_mlp"
INPUT = "features"
FEATURES = 32
CLASSES = 8
PREFIX = "iotgw"
REPLY_ROOT = "fuzz"  # Response Topics outside every device's namespace (the receiver takes fuzz/#)
SEQ = "{n}"  # placeholder in topic templates, replaced by the sequence number


@dataclass(frozen=True, slots=True)
class HttpCase:
    family: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class MqttCase:
    family: str
    v5: bool
    topic: str  # template with {n}
    payload: bytes
    response_topic: str | None = None  # template with {n}; MQTT 5 only
    correlation: bytes | None = None  # the sequence number is prepended when sent
    content_type: str | None = None
    expiry_s: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class GrpcCase:
    family: str
    method: str  # the call's path, /package.Service/Method
    body: bytes  # the request message's bytes, as sent (no client-side serializer)


Case = HttpCase | MqttCase | GrpcCase


def request_topic(model: str = MODEL, device: str = SEQ) -> str:
    return f"{PREFIX}/infer/{model}/req/{device}"


def oip_doc(rows: np.ndarray, rid: str | None) -> dict[str, object]:
    doc: dict[str, object] = {
        "inputs": [
            {"name": INPUT, "datatype": "FP32", "shape": list(rows.shape), "data": rows.tolist()}
        ]
    }
    if rid is not None:
        doc["id"] = rid
    return doc


def binary_body(rows: np.ndarray, rid: str | None) -> tuple[bytes, int]:
    """The binary tensor extension: JSON header, then the raw little-endian rows."""
    raw = rows.astype("<f4").tobytes()
    doc = oip_doc(rows, rid)
    entry = doc["inputs"][0]  # type: ignore[index]
    del entry["data"]
    entry["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps(doc).encode()
    return header + raw, len(header)


def oipb_frame(body: bytes, header_length: int) -> bytes:
    return b"OIPB" + struct.pack("<I", header_length) + body


def good_http(rng: np.random.Generator, k: int) -> HttpCase:
    """A well-formed request over HTTP in one of the three forms the gateway serves."""
    rows = rng.standard_normal((1 + k % 3, FEATURES)).astype(np.float32)
    form = k % 3
    if form == 0:
        body = json.dumps(oip_doc(rows, f"good-{k}")).encode()
        return HttpCase("good/oip_json", f"/v2/models/{MODEL}/infer", body)
    if form == 1:
        body, n = binary_body(rows, f"good-{k}")
        return HttpCase(
            "good/oip_binary", f"/v2/models/{MODEL}/infer", body, ((HEADER_LENGTH, str(n)),)
        )
    body = json.dumps({"instances": rows.tolist()}).encode()
    return HttpCase("good/tfs_instances", f"/v1/models/{MODEL}:predict", body)


def good_mqtt(rng: np.random.Generator, k: int) -> MqttCase:
    """A well-formed request over MQTT: MQTT 5 or 3.1.1, JSON or binary-framed."""
    rows = rng.standard_normal((1, FEATURES)).astype(np.float32)
    v5 = k % 2 == 0
    rid = f"good-{k}"
    if k % 4 < 2:
        payload = json.dumps(oip_doc(rows, rid)).encode()
    else:
        payload = oipb_frame(*binary_body(rows, rid))
    device = f"good-{'v5' if v5 else 'v311'}-{SEQ}"
    return MqttCase(
        f"good/mqtt{'5' if v5 else '311'}",
        v5,
        request_topic(device=device),
        payload,
        response_topic=f"{PREFIX}/infer/{MODEL}/res/{device}/reply" if v5 else None,
        correlation=b"good" if v5 else None,
    )


def good_grpc(rng: np.random.Generator, k: int) -> GrpcCase:
    """A well-formed gRPC call: ModelInfer with raw or typed contents, or TF Serving's Predict."""
    from gateway.grpc.messages import message

    rows = rng.standard_normal((1 + k % 3, FEATURES)).astype(np.float32)
    if k % 3 == 2:
        predict = message("tensorflow.serving.PredictRequest")()
        predict.model_spec.name = MODEL
        tensor = predict.inputs[INPUT]
        tensor.dtype = 1  # DT_FLOAT
        for d in rows.shape:
            tensor.tensor_shape.dim.add(size=d)
        tensor.tensor_content = rows.astype("<f4").tobytes()
        body = predict.SerializeToString()
        return GrpcCase("good/grpc_predict", "/tensorflow.serving.PredictionService/Predict", body)
    infer = message("inference.ModelInferRequest")(model_name=MODEL, id=f"good-{k}")
    entry = infer.inputs.add(name=INPUT, datatype="FP32", shape=list(rows.shape))
    if k % 3 == 0:
        infer.raw_input_contents.append(rows.astype("<f4").tobytes())
    else:
        entry.contents.fp32_contents.extend(rows.ravel().tolist())
    return GrpcCase(
        "good/grpc_infer", "/inference.GRPCInferenceService/ModelInfer", infer.SerializeToString()
    )
