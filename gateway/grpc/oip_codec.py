"""``inference.ModelInferRequest`` <-> ``InferenceRequest`` / ``InferenceResponse``: typed
``contents`` and ``raw_input_contents`` in, typed or raw outputs back.

The same rules as the JSON and binary bodies of HTTP and MQTT (``gateway.codecs.oip``): the
``DecodeLimits``, the datatype names, the raw layout (little-endian, BYTES elements with a
4-byte length), the range checks on typed values, and the ``timeout`` / ``priority``
parameters. A message has already been bounded in bytes by the server's receive limit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.unknown_fields import UnknownFieldSet

from gateway.codecs.datatypes import dtype_label, numpy_dtype
from gateway.codecs.limits import DecodeLimits
from gateway.codecs.oip import (
    convert_values,
    scheduling,
    tensor_from_raw,
    tensor_to_raw,
    version_parameter,
)
from gateway.errors import BadRequest, GatewayError
from gateway.grpc.messages import message
from gateway.types import InferenceRequest, InferenceResponse

ModelInferResponse = message("inference.ModelInferResponse")

# The typed ``InferTensorContents`` field of each datatype (FP16 and BF16 have none: raw only).
_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# Triton's InferParameter adds double_param (4) and uint64_param (5; its client sends
# ``priority`` so) to KServe's three. The message is KServe's as published, so they arrive as
# unknown fields and are read from there.
_DOUBLE_PARAM, _UINT64_PARAM = 4, 5


def parameters(params: Any, what: str) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain values (bool, int, str or float)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
            continue
        triton = (_DOUBLE_PARAM, _UINT64_PARAM)
        unknown = UnknownFieldSet(value)
        extra = [f for i in range(len(unknown)) if (f := unknown[i]).field_number in triton]
        if not extra:
            raise BadRequest(f"{what}: parameter {key!r} has no value")
        field = extra[-1]  # the last one given wins, as protobuf reads a repeated scalar
        if field.field_number == _UINT64_PARAM and isinstance(field.data, int):
            out[key] = field.data
        elif field.field_number == _DOUBLE_PARAM and isinstance(field.data, int):
            out[key] = float(np.array([field.data], dtype=np.uint64).view(np.float64)[0])
        else:
            raise BadRequest(f"{what}: parameter {key!r} has a malformed value")
    return out


def decode_request(
    msg: Any, *, limits: DecodeLimits, deadline_s: float | None
) -> tuple[InferenceRequest, bool]:
    """The request, and whether its outputs go back raw. ``deadline_s``: the time left of the
    call's gRPC deadline, if it has one; the request's budget is the shorter of it and the
    ``timeout`` parameter. Errors carry the request's id."""
    try:
        return _decode(msg, limits, deadline_s)
    except GatewayError as exc:
        exc.request_id = msg.id or None
        raise


def _decode(
    msg: Any, limits: DecodeLimits, deadline_s: float | None
) -> tuple[InferenceRequest, bool]:
    params = parameters(msg.parameters, "request")
    timeout_s, priority = scheduling(params)
    if deadline_s is not None:
        timeout_s = deadline_s if timeout_s is None else min(timeout_s, deadline_s)
    if not msg.inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    limits.check_input_count(len(msg.inputs))
    raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs: give one "
            "per input, in the order of 'inputs'"
        )
    inputs: dict[str, np.ndarray] = {}
    elements = 0
    for i, tensor in enumerate(msg.inputs):
        name, arr = _input(tensor, i, raw[i] if raw else None, limits)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = arr
        elements += arr.size
        limits.check_elements(elements)
    outputs, raw_out = _requested_outputs(msg.outputs, limits, params, bool(raw))
    # The field as given (checked by the edge), else the parameter, which HTTP reads too.
    version = int(msg.model_version) if msg.model_version else version_parameter(params)
    request = InferenceRequest(
        model=msg.model_name,
        version=version,
        inputs=inputs,
        id=msg.id or None,
        outputs=outputs,
        timeout_s=timeout_s,
        priority=priority,
    )
    return request, raw_out


def _input(tensor: Any, index: int, raw: bytes | None, limits: DecodeLimits) -> tuple[str, Any]:
    name = tensor.name
    if not name:
        raise BadRequest(f"inputs[{index}] needs a 'name'")
    what = f"input {name!r}"
    dtype = numpy_dtype(tensor.datatype, what=what)
    shape = list(tensor.shape)
    if any(d < 0 for d in shape):
        raise BadRequest(f"{what}: 'shape' must be a list of non-negative integers")
    count = limits.check_shape(shape, what)
    parameters(tensor.parameters, what)  # refused when malformed; none is used per input
    filled = [f.name for f, _ in tensor.contents.ListFields()]
    if raw is not None:
        if filled:
            raise BadRequest(
                f"{what}: 'contents' is set although the request uses raw_input_contents"
            )
        return name, tensor_from_raw(raw, dtype, shape, what)
    label = tensor.datatype
    field = _FIELDS.get(label)
    if field is None:
        raise BadRequest(f"{what}: {label} data can only be sent in raw_input_contents")
    wrong = [f for f in filled if f != field]
    if wrong:
        raise BadRequest(f"{what}: {label} data goes in contents.{field}, not in {wrong[0]}")
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise BadRequest(f"{what}: {len(values)} values for shape {shape} (needs {count})")
    if label == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return name, arr.reshape(shape)
    return name, convert_values(np.asarray(values), dtype, what).reshape(shape)


def _requested_outputs(
    requested: Any, limits: DecodeLimits, params: dict[str, Any], raw_inputs: bool
) -> tuple[list[str] | None, bool]:
    """The outputs asked for (None: all) and whether they go back raw: as the request says
    (``binary_data_output``, or an output's ``binary_data``), else raw when the inputs came
    raw (a client that writes raw tensors reads them: Triton's always do)."""
    raw_out: bool | None = None
    if "binary_data_output" in params:
        raw_out = _flag(params["binary_data_output"], "binary_data_output")
    if not requested:
        return None, raw_inputs if raw_out is None else raw_out
    limits.check_input_count(len(requested))
    names: list[str] = []
    for entry in requested:
        if not entry.name:
            raise BadRequest("each requested output needs a 'name'")
        out_params = parameters(entry.parameters, f"output {entry.name!r}")
        if "binary_data" in out_params and raw_out is None:
            raw_out = _flag(out_params["binary_data"], "binary_data")
        names.append(entry.name)
    return names, raw_inputs if raw_out is None else raw_out


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"parameter {key!r} must be true or false")
    return value


def encode_response(response: InferenceResponse, *, raw: bool) -> Any:
    """A ``ModelInferResponse``: every output raw, or every output typed (the protocol allows
    no mix); typed unless asked otherwise, and raw anyway when an output's datatype has no
    typed field (FP16)."""
    labels = {name: dtype_label(arr.dtype) for name, arr in response.outputs.items()}
    raw = raw or any(label not in _FIELDS for label in labels.values())
    msg = ModelInferResponse(
        model_name=response.model, model_version=str(response.version), id=response.id or ""
    )
    for name, arr in response.outputs.items():
        out = msg.outputs.add(name=name, datatype=labels[name], shape=list(arr.shape))
        if raw:
            msg.raw_output_contents.append(tensor_to_raw(arr))
            continue
        flat = arr.reshape(-1)
        if labels[name] == "BYTES":
            values: list[Any] = [x if isinstance(x, bytes) else str(x).encode() for x in flat]
        else:
            values = flat.tolist()
        getattr(out.contents, _FIELDS[labels[name]]).extend(values)
    return msg
