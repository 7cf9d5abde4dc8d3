"""The gRPC adapter's translation, on real messages: the call's deadline as the request's
budget, Triton's parameter fields read from the unknown fields, typed contents both ways, TF's
TensorProto both ways, and the status code of every refusal."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway.codecs.limits import DecodeLimits
from gateway.errors import (
    BadRequest,
    BatchTimeout,
    DeadlineUnmeetable,
    GatewayError,
    InsufficientMemory,
    InternalError,
    MemoryBudgetExceeded,
    ModelUnavailable,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
)
from gateway.grpc import messages, oip_codec, tfs_service
from gateway.grpc.status import DeadlinePassed, status_code, trailers
from gateway.types import InferenceResponse

LIMITS = DecodeLimits()
ModelInferRequest = messages.message("inference.ModelInferRequest")
TensorProto = messages.message("tensorflow.TensorProto")


def _request(timeout_us: int | None = None) -> object:
    msg = ModelInferRequest(model_name="m", id="r1")
    if timeout_us is not None:
        msg.parameters["timeout"].int64_param = timeout_us
    msg.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    msg.raw_input_contents.append(np.array([[1.0, 2.0]], np.float32).tobytes())
    return msg


@pytest.mark.parametrize(
    ("timeout_us", "deadline_s", "budget_s"),
    [(None, None, None), (None, 0.25, 0.25), (2_000_000, 0.25, 0.25), (100_000, 5.0, 0.1)],
)
def test_the_budget_is_the_shorter_of_the_timeout_and_the_call_deadline(
    timeout_us: int | None, deadline_s: float | None, budget_s: float | None
) -> None:
    request, raw = oip_codec.decode_request(
        _request(timeout_us), limits=LIMITS, deadline_s=deadline_s
    )
    assert request.timeout_s == budget_s
    assert raw and request.id == "r1"
    np.testing.assert_array_equal(request.inputs["x"], [[1.0, 2.0]])


def test_triton_parameter_fields_are_read_from_unknown_fields() -> None:
    theirs = service_pb2.ModelInferRequest()
    theirs.parameters["priority"].uint64_param = 7
    theirs.parameters["ratio"].double_param = 0.5
    theirs.parameters["flag"].bool_param = True
    ours = ModelInferRequest.FromString(theirs.SerializeToString())
    assert oip_codec.parameters(ours.parameters, "request") == {
        "priority": 7,
        "ratio": 0.5,
        "flag": True,
    }


def test_an_empty_parameter_is_refused() -> None:
    msg = ModelInferRequest()
    msg.parameters["priority"].SetInParent()
    with pytest.raises(BadRequest, match="has no value"):
        oip_codec.parameters(msg.parameters, "request")


def test_typed_contents_round_trip_and_keep_ranges() -> None:
    msg = ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="small", datatype="INT8", shape=[3])
    t.contents.int_contents.extend([-128, 0, 127])
    b = msg.inputs.add(name="text", datatype="BYTES", shape=[2])
    b.contents.bytes_contents.extend([b"a", b"bc"])
    request, raw = oip_codec.decode_request(msg, limits=LIMITS, deadline_s=None)
    assert not raw
    assert request.inputs["small"].dtype == np.int8
    assert list(request.inputs["text"]) == [b"a", b"bc"]
    t.contents.int_contents[0] = 128
    with pytest.raises(BadRequest, match="out of range"):
        oip_codec.decode_request(msg, limits=LIMITS, deadline_s=None)

    response = InferenceResponse(model="m", version=2, outputs=dict(request.inputs), id="q")
    reply = oip_codec.encode_response(response, raw=False)
    assert reply.model_version == "2" and reply.id == "q" and not reply.raw_output_contents
    assert list(reply.outputs[1].contents.bytes_contents) == [b"a", b"bc"]
    # FP16 has no typed field: the whole reply goes raw.
    half = InferenceResponse(model="m", version=1, outputs={"h": np.ones(2, np.float16)})
    assert len(oip_codec.encode_response(half, raw=False).raw_output_contents) == 1


def test_raw_and_typed_contents_are_not_mixed() -> None:
    msg = _request()
    msg.inputs[0].contents.fp32_contents.extend([1.0, 2.0])  # type: ignore[attr-defined]
    with pytest.raises(BadRequest, match="raw_input_contents") as caught:
        oip_codec.decode_request(msg, limits=LIMITS, deadline_s=None)
    assert caught.value.request_id == "r1"


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16, np.bool_])
def test_tensor_protos_round_trip(dtype: type) -> None:
    arr: np.ndarray = (np.arange(6) % 2 if dtype is np.bool_ else np.arange(6)).astype(dtype)
    arr = arr.reshape(2, 3)
    proto = TensorProto()
    tfs_service.array_to_tensor(arr, proto)
    back = tfs_service.tensor_to_array(proto, "t", LIMITS)
    assert back.dtype == arr.dtype
    np.testing.assert_array_equal(back, arr)


def test_tensor_proto_typed_values() -> None:
    proto = TensorProto(dtype=messages.enum_value("tensorflow.DataType", "DT_HALF"))
    proto.tensor_shape.dim.add(size=2)
    proto.half_val.extend(np.array([1.5, -2.0], np.float16).view(np.uint16).tolist())
    np.testing.assert_array_equal(tfs_service.tensor_to_array(proto, "t", LIMITS), [1.5, -2.0])
    proto.float_val.append(1.0)
    with pytest.raises(BadRequest, match="go in half_val"):
        tfs_service.tensor_to_array(proto, "t", LIMITS)
    short = TensorProto(dtype=messages.enum_value("tensorflow.DataType", "DT_INT32"))
    short.tensor_shape.dim.add(size=3)
    short.int_val.extend([1, 2])
    with pytest.raises(BadRequest, match="2 values"):
        tfs_service.tensor_to_array(short, "t", LIMITS)


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (BadRequest("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (Unauthorized("x"), grpc.StatusCode.UNAUTHENTICATED),
        (NotFound("x"), grpc.StatusCode.NOT_FOUND),
        (PayloadTooLarge("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (MemoryBudgetExceeded("x", retry_after=0.2), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (InsufficientMemory("x", retry_after=1.0), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (Overloaded("x", retry_after=0.05), grpc.StatusCode.UNAVAILABLE),
        (DeadlineUnmeetable("x", retry_after=0.05), grpc.StatusCode.UNAVAILABLE),
        (ModelUnavailable("x"), grpc.StatusCode.UNAVAILABLE),
        (BatchTimeout("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (DeadlinePassed("x"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (InternalError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_every_refusal_has_its_code(err: GatewayError, code: grpc.StatusCode) -> None:
    assert status_code(err) == code
    sent = dict(trailers(err))
    assert sent["iotgw-reason"] == err.reason
    if err.retry_after is not None:
        assert int(sent["retry-after-ms"]) == max(1, round(err.retry_after * 1000))
    else:
        assert "retry-after-ms" not in sent


def test_the_model_version_parameter_is_read_as_over_http() -> None:
    msg = _request()
    msg.parameters["model_version"].string_param = "2"  # type: ignore[attr-defined]
    request, _ = oip_codec.decode_request(msg, limits=LIMITS, deadline_s=None)
    assert request.version == 2
    msg.model_version = "1"  # type: ignore[attr-defined]
    assert oip_codec.decode_request(msg, limits=LIMITS, deadline_s=None)[0].version == 1
    msg.model_version = ""  # type: ignore[attr-defined]
    msg.parameters["model_version"].string_param = "two"  # type: ignore[attr-defined]
    with pytest.raises(BadRequest, match="model_version"):
        oip_codec.decode_request(msg, limits=LIMITS, deadline_s=None)
