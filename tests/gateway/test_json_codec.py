"""The JSON codec (orjson where it agrees with the standard library, ``json`` where it would
not): requests read as ``json`` reads them, refusals worded as ``json`` words them, replies
whose numbers read back as exactly the doubles ``tolist`` + ``json`` wrote."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codecs import json_codec, oip, tfserving
from gateway.codecs.datatypes import dtype_label
from gateway.errors import BadRequest
from gateway.types import InferenceResponse
from models.runtime import ModelMetadata, TensorSpec


@pytest.fixture(name="codec", params=["orjson", "stdlib"])
def _codec(request: pytest.FixtureRequest) -> Iterator[str]:
    before = json_codec.selected()
    json_codec.select(request.param)
    yield request.param
    json_codec.select(before)


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 and 1.0 differ; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _outcome(raw: bytes | str, loads: Any) -> tuple[str, Any]:
    try:
        return "value", loads(raw)
    except RecursionError:
        return "RecursionError", None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        return type(exc).__name__, str(exc)


# Documents orjson refuses or reads differently, each of which must read as ``json`` reads it.
AWKWARD = [
    b"[NaN, Infinity, -Infinity]",
    b'{"data": [1e400, -1e400, 1e-400]}',
    b"[12345678901234567890, -9223372036854775809, 18446744073709551616]",
    b'{"shape": [1, 99999999999999999999]}',
    b"[18446744073709551615, -9223372036854775808, 9999999999999999999]",
    b"[1234567890123456789.5, 12345678901234567890e3, 0.000123456789012345678]",
    b'{"id": "89014103211118510720", "n": 1}',
    b'{"a": 1, "a": 2}',
    b"[-0, -0.0, 1E2, 1e-5]",
    b'"\\ud800"',
    b"\xef\xbb\xbf{}",
    '{"x": [1.5]}'.encode("utf-16"),
    b'{"x": "\\u0000\\u2028\xc3\xa9"}',
    b"[" * 1030 + b"]" * 1030,
    b'{"a":' * 1100 + b"1" + b"}" * 1100,
    b"[" * 300 + b"]" * 300,
    b"",
    b"{",
    b"{}x",
    b"[1,]",
    b"\xff\xfe\xfa",
    b"01",
    b"0x10",
    "[1.5, \ud800]",
]


@pytest.mark.parametrize("raw", AWKWARD, ids=range(len(AWKWARD)))
def test_awkward_documents_read_and_fail_as_the_standard_parser_has_them(
    codec: str, raw: bytes | str
) -> None:
    want, got = _outcome(raw, json.loads), _outcome(raw, json_codec.loads)
    assert want[0] == got[0]
    assert want[0] != "value" or _same(want[1], got[1]), (want, got)
    assert want[0] == "value" or want[1] == got[1]  # the refusal's very words


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(doc=_DOCUMENTS)
def test_any_document_json_writes_reads_back_identically(doc: Any) -> None:
    raw = json.dumps(doc).encode()
    assert _same(json_codec.loads(raw), json.loads(raw))


@settings(max_examples=300, deadline=None)
@given(numbers=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=8))
def test_fp32_outputs_read_back_as_the_doubles_json_wrote(numbers: list[float]) -> None:
    arr = np.asarray(numbers, dtype=np.float32)
    response = InferenceResponse(model="m", version=1, outputs={"y": arr})
    body, _ = oip.encode_response(response, oip.OutputFormat())
    (out,) = json.loads(body)["outputs"]
    assert _same(out["data"], arr.tolist())


OUTPUTS: dict[str, np.ndarray] = {
    "fp32": np.array([[0.1, -1e-5], [3.4e38, 1.17549435e-38]], dtype=np.float32),
    "fp16": np.array([0.1, 65504.0, 6e-8], dtype=np.float16),
    "fp64": np.array([0.1, 5e-324, 1.7976931348623157e308, -0.0]),
    "int64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "uint64": np.array([2**64 - 1, 0], dtype=np.uint64),
    "int8": np.array([[-128, 127]], dtype=np.int8),
    "bool": np.array([True, False]),
    "big_endian": np.array([1.5, 2.25], dtype=">f4"),
    "strided": np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1],
    "transposed": np.arange(6, dtype=np.int32).reshape(2, 3).T,
    "empty": np.zeros((0, 3), dtype=np.float32),
    "scalar": np.array(2.5, dtype=np.float32),
}


def _stdlib_reply(response: InferenceResponse) -> dict[str, Any]:
    """The reply as the gateway wrote it before orjson: ``tolist`` and ``json``."""
    outputs = [
        {
            "name": n,
            "datatype": dtype_label(a.dtype),
            "shape": list(a.shape),
            "data": a.reshape(-1).tolist(),
        }
        for n, a in response.outputs.items()
    ]
    doc = {"model_name": response.model, "model_version": str(response.version)}
    if response.id is not None:
        doc["id"] = response.id
    return json.loads(json.dumps({**doc, "outputs": outputs}))


@pytest.mark.parametrize("request_id", [None, "r-1", "caf\u00e9 \u2028", "lone \ud800"])
def test_oip_reply_means_what_the_standard_library_wrote(
    codec: str, request_id: str | None
) -> None:
    response = InferenceResponse(model="m", version=3, outputs=OUTPUTS, id=request_id)
    body, header_length = oip.encode_response(response, oip.OutputFormat())
    assert header_length is None
    assert _same(json.loads(body), _stdlib_reply(response))


def test_stdlib_codec_writes_the_bytes_the_gateway_always_wrote() -> None:
    response = InferenceResponse(model="m", version=1, outputs=OUTPUTS, id="a")
    before = json_codec.selected()
    json_codec.select("stdlib")
    try:
        body, _ = oip.encode_response(response, oip.OutputFormat())
    finally:
        json_codec.select(before)
    assert body == json.dumps(_stdlib_reply(response), separators=(",", ":")).encode()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_outputs_keep_their_nan_and_infinity_tokens(codec: str, bad: float) -> None:
    arr = np.array([1.0, bad, 0.1], dtype=np.float32)
    response = InferenceResponse(model="m", version=1, outputs={"y": arr, "n": np.arange(2)})
    body, _ = oip.encode_response(response, oip.OutputFormat())
    assert json.dumps(bad).encode() in body  # NaN / Infinity / -Infinity, never null
    assert _same(json.loads(body), _stdlib_reply(response))


def test_binary_outputs_beside_json_ones(codec: str) -> None:
    outputs = {"a": np.array([0.1, np.nan], dtype=np.float32), "b": np.arange(3.0)}
    fmt = oip.OutputFormat(binary=frozenset({"a"}))
    payload, header_length = oip.encode_response(
        InferenceResponse(model="m", version=1, outputs=outputs), fmt
    )
    assert header_length is not None
    a, b = json.loads(payload[:header_length])["outputs"]
    assert a["parameters"] == {"binary_data_size": 8} and b["data"] == [0.0, 1.0, 2.0]
    raw = np.frombuffer(payload[header_length:], dtype="<f4")
    np.testing.assert_array_equal(raw, outputs["a"])


def test_error_bodies(codec: str) -> None:
    for encode in (oip.encode_error, tfserving.encode_error):
        assert json.loads(encode("bad 'x' \u00e9 \ud800")) == {"error": "bad 'x' \u00e9 \ud800"}
    doc = {"status": 503, "reason": "queue_full", "error": "full", "retry_after_s": 0.25}
    assert json.loads(json_codec.dumps(doc)) == doc


_TF_OUTPUTS: dict[str, np.ndarray] = {
    "scores": np.array([[0.1, 0.2], [0.3, np.float32(1e-5)]], dtype=np.float32),
    "label": np.array([1, 0], dtype=np.int64),
    "text": np.array([b"ab", b"\xff"], dtype=object),
}


@pytest.mark.parametrize("rows", [True, False])
@pytest.mark.parametrize("names", [("scores",), ("scores", "label", "text")])
def test_tf_serving_reply_means_what_the_standard_library_wrote(
    codec: str, rows: bool, names: tuple[str, ...]
) -> None:
    outputs = {n: _TF_OUTPUTS[n] for n in names}
    body = tfserving.encode_predict(
        InferenceResponse(model="m", version=1, outputs=outputs), rows=rows
    )
    values = {
        n: a.tolist() if a.dtype != object else [{"b64": "YWI="}, {"b64": "/w=="}]
        for n, a in outputs.items()
    }
    if rows:
        want: Any = {
            "predictions": values[names[0]]
            if len(names) == 1
            else [{n: v[i] for n, v in values.items()} for i in range(2)]
        }
    else:
        want = {"outputs": values[names[0]] if len(names) == 1 else values}
    assert _same(json.loads(body), json.loads(json.dumps(want)))


def _fp32_request(data: str) -> bytes:
    entry = '{"name":"x","datatype":"FP32","shape":[1,2],"data":' + data + "}"
    return ('{"inputs":[' + entry + "]}").encode()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ("[1, 99999999999999999999]", "mixed or null values"),
        ("[1, 12345678901234567890]", None),  # within uint64: numpy makes both floats
        ("[NaN, 1.0]", None),  # read as NaN: the service refuses it, naming the input
        ("[1e39, 1.0]", "out of range"),
        ("[1e400, 1.0]", None),  # infinity, as json reads it
        ("[[1, 2]", "malformed JSON: Expecting"),
    ],
)
def test_oip_requests_decode_as_they_always_did(codec: str, data: str, words: str | None) -> None:
    body = _fp32_request(data)
    if words is None:
        request, _ = oip.decode_request(body, model="m", version=None)
        want = np.asarray(json.loads(data), dtype=np.float32).reshape(1, 2)
        np.testing.assert_array_equal(request.inputs["x"], want)
        return
    with pytest.raises(BadRequest, match=words):
        oip.decode_request(body, model="m", version=None)


def test_nesting_past_both_parsers_is_refused_in_the_same_words(codec: str) -> None:
    for body in (b"[" * 5000 + b"]" * 5000, b'{"inputs":' + b"[" * 1030 + b"]" * 1030 + b"}"):
        with pytest.raises(BadRequest, match="nested too deeply"):
            oip.decode_request(body, model="m", version=None)


def test_data_nested_within_the_parsers_reach_is_refused_by_the_dimension_limit(
    codec: str,
) -> None:
    """Between the standard parser's guard (about 1,000 levels, less the call stack) and
    orjson's (1,024) a document now parses; its tensor data still may not nest deeper than the
    dimension limit."""
    body = _fp32_request("[" * 1010 + "1" + "]" * 1010)
    with pytest.raises(BadRequest, match=r"levels deep|nested too deeply"):
        oip.decode_request(body, model="m", version=None)


def test_tf_serving_request_with_a_big_integer_is_refused_as_before(codec: str) -> None:
    metadata = ModelMetadata(
        name="m",
        version="1",
        platform="onnxruntime_onnx",
        inputs=(TensorSpec("x", "float32", (-1, 2)),),
        outputs=(),
    )
    with pytest.raises(BadRequest, match="mixed or null values"):
        tfserving.decode_predict(
            b'{"instances": [[1, 99999999999999999999]]}', metadata, model="m", version=None
        )
