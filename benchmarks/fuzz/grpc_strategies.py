"""Hypothesis strategies for bad gRPC input: protobuf messages for ModelInfer and TF Serving's
Predict with wrong values (datatypes, shapes, raw lengths, typed contents in the wrong field or
of the wrong count, bad parameters), and bytes that are no valid message at all: lying length
prefixes, fields of the wrong wire type, huge repeated fields, unknown fields, unterminated
groups, truncations, raw bytes. ``grpc_cases()`` is the entry point; each case is labelled with
its family.

Messages are built with the gateway's own message classes (``gateway.grpc.messages``, so this
runs where TensorFlow is not imported) and then, for the wire families, taken apart at the byte
level with the few protobuf encoding helpers below.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from benchmarks.fuzz.cases import FEATURES, INPUT, MODEL, GrpcCase
from benchmarks.fuzz.strategies import DATATYPES, TEXT, Draw

INFER = "/inference.GRPCInferenceService/ModelInfer"
PREDICT = "/tensorflow.serving.PredictionService/Predict"
# Calls that read a request and answer without changing anything (load and unload are left out:
# they would take the model the well-formed requests need away).
READ_ONLY = (
    "/inference.GRPCInferenceService/ModelMetadata",
    "/inference.GRPCInferenceService/ModelReady",
    "/inference.GRPCInferenceService/RepositoryIndex",
    "/tensorflow.serving.PredictionService/GetModelMetadata",
    "/tensorflow.serving.ModelService/GetModelStatus",
)
INT64 = st.integers(-(2**63), 2**63 - 1)
DIMS = st.sampled_from([0, 1, 31, 32, 33, -1, -32, 2**31, 2**32 + 1, 2**62, -(2**63)]) | INT64
_MAX_INT64 = 2**63 - 1


def _message(name: str) -> Any:
    from gateway.grpc.messages import message

    return message(name)


# -- protobuf wire encoding --------------------------------------------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative numbers as protobuf writes them: ten bytes
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint((number << 3) | wire)


def delimited(number: int, data: bytes, declared: int | None = None) -> bytes:
    """A length-delimited field; ``declared`` is the length it claims (the truth by default)."""
    return tag(number, 2) + varint(len(data) if declared is None else declared) + data


# -- valid messages, mutated -------------------------------------------------------------------


def valid_infer(draw: Draw) -> Any:
    rows = draw(st.integers(1, 4))
    msg = _message("inference.ModelInferRequest")(model_name=MODEL)
    tensor = msg.inputs.add(name=INPUT, datatype="FP32", shape=[rows, FEATURES])
    values = np.full((rows, FEATURES), 0.25, np.float32)
    if draw(st.booleans()):
        msg.raw_input_contents.append(values.tobytes())
    else:
        tensor.contents.fp32_contents.extend(values.ravel().tolist())
    if draw(st.booleans()):
        msg.id = draw(TEXT)
    return msg


_PARAMS: dict[str, list[Any]] = {
    "timeout": [-1, 0, 1, _MAX_INT64, "100", True, 0.5],
    "priority": [-1, 2**40, 10**9, "1", True, 1.5],
    "binary_data_output": ["yes", 1, 0],
    "model_version": ["", "-1", "1.0", "99", "x", 7],
    "deadline_unix_ms": [-1, 0, 1, _MAX_INT64, "soon"],
}


def _set_param(params: Any, key: str, value: Any) -> None:
    entry = params[key]
    if isinstance(value, bool):
        entry.bool_param = value
    elif isinstance(value, int):
        entry.int64_param = value
    elif isinstance(value, str):
        entry.string_param = value
    else:
        entry.SetInParent()  # a parameter with no value at all


def infer_mutated(draw: Draw) -> bytes:
    """A valid ModelInfer request with one to three fields given wrong values."""
    msg = valid_infer(draw)
    tensor = msg.inputs[0]
    for _ in range(draw(st.integers(1, 3))):
        what = draw(
            st.sampled_from(
                ["datatype", "shape", "raw", "name", "model", "version", "param", "outputs"]
            )
        )
        if what == "datatype":
            tensor.datatype = draw(st.sampled_from([*DATATYPES, "", "fp32", "FP128"]) | TEXT)
        elif what == "shape":
            del tensor.shape[:]
            tensor.shape.extend(draw(st.lists(DIMS, max_size=10)))
        elif what == "raw":
            del msg.raw_input_contents[:]
            size = draw(st.sampled_from([0, 1, 127, 128, 129, 4 * FEATURES - 1, 4 * FEATURES + 1]))
            msg.raw_input_contents.extend([b"\0" * size] * draw(st.integers(1, 3)))
        elif what == "name":
            tensor.name = draw(st.sampled_from(["", INPUT.upper(), "x" * 300]) | TEXT)
        elif what == "model":
            msg.model_name = draw(st.sampled_from(["", "nope", MODEL + " ", "x" * 300]) | TEXT)
        elif what == "version":
            msg.model_version = draw(st.sampled_from(["1", "2", "0", "-1", "x", "9" * 30]))
        elif what == "param":
            key = draw(st.sampled_from([*_PARAMS, "unknown"]))
            value = draw(st.sampled_from([*_PARAMS.get(key, ["v"]), None]))
            target = msg.parameters if draw(st.booleans()) else tensor.parameters
            _set_param(target, key, value)
        else:
            for _ in range(draw(st.integers(1, 3))):
                msg.outputs.add(name=draw(st.sampled_from(["", "probabilities", "x"]) | TEXT))
    return bytes(msg.SerializeToString())


_CONTENT_FIELDS = [
    *("fp32_contents", "int_contents", "uint_contents", "bool_contents"),
    *("int64_contents", "fp64_contents", "bytes_contents", "uint64_contents"),
]


def typed_contents(draw: Draw) -> bytes:
    """Typed contents in the wrong field, of the wrong count, out of the datatype's range."""
    msg = _message("inference.ModelInferRequest")(model_name=MODEL)
    rows = draw(st.integers(1, 3))
    label = draw(st.sampled_from(["FP32", "INT8", "UINT8", "BOOL", "BYTES", "FP16", "INT64"]))
    tensor = msg.inputs.add(name=INPUT, datatype=label, shape=[rows, FEATURES])
    field = draw(st.sampled_from(_CONTENT_FIELDS))
    count = draw(st.sampled_from([0, 1, rows * FEATURES - 1, rows * FEATURES, 50_000]))
    value: Any = {
        "fp32_contents": 1e38,
        "fp64_contents": 1e308,
        "int_contents": draw(st.sampled_from([-129, 128, 2**31 - 1, -(2**31)])),
        "uint_contents": 2**32 - 1,
        "int64_contents": -(2**63),
        "uint64_contents": 2**64 - 1,
        "bool_contents": True,
        "bytes_contents": b"\xff" * draw(st.integers(0, 8)),
    }[field]
    getattr(tensor.contents, field).extend([value] * count)
    return bytes(msg.SerializeToString())


# -- bytes that are no valid message -----------------------------------------------------------


def lying_length(draw: Draw) -> bytes:
    """A valid request whose length prefixes lie: a field claiming more bytes than follow, or
    fewer (the rest then reads as garbage fields), at the top or inside an input."""
    msg = valid_infer(draw)
    inner = msg.inputs[0].SerializeToString()
    raw = msg.raw_input_contents[0] if msg.raw_input_contents else b""
    lie = draw(st.sampled_from([-1, 1, 7, 2**31, 2**32 + 3, 2**63, 2**64 - 1]))
    where = draw(st.sampled_from(["input", "raw", "model", "nested"]))
    head = delimited(1, MODEL.encode())
    if where == "input":
        return head + delimited(5, inner, max(0, len(inner) + lie)) + delimited(7, raw)
    if where == "raw":
        return head + delimited(5, inner) + delimited(7, raw, max(0, len(raw) + lie))
    if where == "model":
        return delimited(1, MODEL.encode(), max(0, len(MODEL) + lie)) + delimited(5, inner)
    # Inside the input: its shape (field 3, packed) claims the wrong length.
    shape = varint(1) + varint(FEATURES)
    bad_inner = delimited(1, INPUT.encode()) + delimited(2, b"FP32") + delimited(3, shape, lie)
    return head + delimited(5, bad_inner) + delimited(7, raw)


def wrong_wire_types(draw: Draw) -> bytes:
    """Known fields written with a wire type that is not theirs (varint for a string, fixed64
    for a message, a length-delimited blob for a packed shape, ...)."""
    number = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7]))
    wire = draw(st.sampled_from([0, 1, 5, 2]))
    payload = {
        0: varint(draw(INT64)),
        1: b"\x01" * 8,
        5: b"\x01" * 4,
        2: varint(3) + b"abc",
    }[wire]
    good = valid_infer(draw).SerializeToString()
    return bytes(good + tag(number, wire) + payload)


def huge_repeated(draw: Draw) -> bytes:
    """One repeated field with tens of thousands of entries: shape dims, inputs, raw blobs,
    parameters, requested outputs."""
    msg = valid_infer(draw)
    size = draw(st.sampled_from([1_000, 20_000, 100_000]))
    what = draw(st.sampled_from(["dims", "inputs", "raw", "params", "outputs"]))
    if what == "dims":
        msg.inputs[0].shape.extend([1] * size)
    elif what == "inputs":
        for i in range(size // 10):
            msg.inputs.add(name=f"x{i}", datatype="FP32", shape=[1])
    elif what == "raw":
        msg.raw_input_contents.extend([b""] * size)
    elif what == "params":
        for i in range(size // 10):
            msg.parameters[f"p{i}"].int64_param = i
    else:
        for i in range(size // 10):
            msg.outputs.add(name=f"o{i}")
    return bytes(msg.SerializeToString())


def unknown_fields(draw: Draw) -> bytes:
    """Fields no message declares, of every wire type, at the top or inside an input; also an
    unterminated group and a field number of zero, which no parser may accept."""
    msg = valid_infer(draw)
    extra = b""
    for _ in range(draw(st.integers(1, 4))):
        number = draw(st.integers(8, 2**29 - 1))
        wire = draw(st.sampled_from([0, 1, 2, 3, 5]))
        if wire == 0:
            extra += tag(number, 0) + varint(draw(INT64))
        elif wire == 1:
            extra += tag(number, 1) + b"\0" * 8
        elif wire == 5:
            extra += tag(number, 5) + b"\0" * 4
        elif wire == 2:
            extra += delimited(number, b"\xff" * draw(st.integers(0, 64)))
        else:  # a group: closed, or left open
            extra += tag(number, 3) + (tag(number, 4) if draw(st.booleans()) else b"")
    if draw(st.integers(0, 5)) == 0:
        extra += tag(0, 0) + b"\x01"
    if draw(st.booleans()):
        inner = msg.inputs[0].SerializeToString() + extra
        del msg.inputs[:]
        body = msg.SerializeToString() + delimited(5, inner)
    else:
        body = msg.SerializeToString() + extra
    return bytes(body)


def truncated(draw: Draw) -> bytes:
    good = valid_infer(draw).SerializeToString()
    return bytes(good[: draw(st.integers(0, max(0, len(good) - 1)))])


# -- TF Serving's Predict ----------------------------------------------------------------------


def predict_mutated(draw: Draw) -> bytes:
    msg = _message("tensorflow.serving.PredictRequest")()
    msg.model_spec.name = draw(st.sampled_from([MODEL, MODEL, "", "nope"]))
    spec = draw(st.sampled_from(["none", "version", "label", "signature"]))
    if spec == "version":
        msg.model_spec.version.value = draw(st.sampled_from([1, 0, -1, 2, _MAX_INT64]))
    elif spec == "label":
        msg.model_spec.version_label = draw(TEXT)
    elif spec == "signature":
        msg.model_spec.signature_name = draw(st.sampled_from(["", "serving_default", "x"]))
    tensor = msg.inputs[draw(st.sampled_from([INPUT, INPUT, "", "x"]))]
    tensor.dtype = draw(st.sampled_from([1, 1, 0, 2, 3, 7, 10, 14, 19, 20, 21, 33, 101]))
    dims = draw(st.sampled_from([[1, FEATURES], [2, FEATURES], [FEATURES], []]) | st.lists(DIMS))
    for d in dims:
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_shape.unknown_rank = draw(st.integers(0, 7)) == 0
    how = draw(st.sampled_from(["content", "float_val", "int_val", "string_val", "half_val"]))
    count = draw(st.sampled_from([0, 1, FEATURES - 1, FEATURES, 2 * FEATURES, 20_000]))
    if how == "content":
        tensor.tensor_content = b"\0" * (4 * count + draw(st.integers(0, 3)))
    elif how == "string_val":
        tensor.string_val.extend([b"\xff\xfe"] * count)
    else:
        getattr(tensor, how).extend([1] * count)
    if draw(st.integers(0, 3)) == 0:
        msg.output_filter.extend(draw(st.lists(st.sampled_from(["probabilities", "x", ""]))))
    return bytes(msg.SerializeToString())


_FAMILIES = {
    "grpc/infer_mutated": (INFER, infer_mutated, 6),
    "grpc/typed_contents": (INFER, typed_contents, 3),
    "grpc/lying_length": (INFER, lying_length, 3),
    "grpc/wrong_wire_type": (INFER, wrong_wire_types, 2),
    "grpc/huge_repeated": (INFER, huge_repeated, 1),
    "grpc/unknown_fields": (INFER, unknown_fields, 2),
    "grpc/truncated": (INFER, truncated, 1),
    "grpc/tfs_predict": (PREDICT, predict_mutated, 4),
}
_MIX = [name for name, (_, _, weight) in _FAMILIES.items() for _ in range(weight)]


@st.composite
def grpc_cases(draw: Draw) -> GrpcCase:
    family = draw(st.sampled_from([*_MIX, "grpc/raw_bytes", "grpc/read_only"]))
    if family == "grpc/raw_bytes":
        method = draw(st.sampled_from([INFER, PREDICT]))
        return GrpcCase(family, method, draw(st.binary(max_size=512)))
    if family == "grpc/read_only":
        body = draw(st.binary(max_size=64) | st.just(b""))
        return GrpcCase(family, draw(st.sampled_from(READ_ONLY)), body)
    method, build, _ = _FAMILIES[family]
    return GrpcCase(family, method, build(draw))
