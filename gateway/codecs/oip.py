"""Open Inference Protocol (KServe v2) inference bodies: JSON tensors and the binary tensor
extension (a JSON header of ``Inference-Header-Content-Length`` bytes, then raw little-endian
tensors in input order, each sized by its ``binary_data_size`` parameter).

One implementation for every transport: HTTP and MQTT both call these functions.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.codecs import json_codec
from gateway.codecs.datatypes import dtype_label, numpy_dtype
from gateway.codecs.limits import DEFAULT_LIMITS, DecodeLimits, check_scalar_parameters, load_json
from gateway.errors import BadRequest, DeadlineUnmeetable, GatewayError
from gateway.types import InferenceRequest, InferenceResponse

HEADER_LENGTH = "Inference-Header-Content-Length"
# Binary framing where there are no headers (MQTT): magic, u32 LE JSON header length, header,
# tensors. See docs/mqtt.md.
FRAME_MAGIC = b"OIPB"
_FRAME_PREFIX = struct.Struct("<4sI")
_MAX_PRIORITY = 1_000_000


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Which outputs go in the binary section; the rest are JSON."""

    binary_all: bool = False
    binary: frozenset[str] = frozenset()
    json: frozenset[str] = frozenset()  # outputs that asked for JSON: their choice wins

    def is_binary(self, name: str) -> bool:
        return name in self.binary or (self.binary_all and name not in self.json)


def decode_request(
    body: bytes,
    *,
    model: str,
    version: int | None,
    header_length: int | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> tuple[InferenceRequest, OutputFormat]:
    """Parse an inference request body (JSON, or JSON header + binary tensors). An error raised
    once the header is read carries the request's ``id`` (``GatewayError.request_id``), so the
    reply can name the request it refuses."""
    header = _header(body, header_length)
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    try:
        return _decode_header(header, body, model, version, header_length, limits)
    except GatewayError as exc:
        exc.request_id = request_id
        raise


def _header(body: bytes, header_length: int | None) -> dict[str, Any]:
    if header_length is None:
        header = load_json(body)
    else:
        if not 0 <= header_length <= len(body):
            raise BadRequest(
                f"the JSON header length ({HEADER_LENGTH} over HTTP, the OIPB frame's over "
                f"MQTT) is {header_length} but the body has {len(body)} bytes"
            )
        header = load_json(body[:header_length])
    if not isinstance(header, dict):
        raise BadRequest("the request body must be a JSON object")
    return header


def _decode_header(
    header: dict[str, Any],
    body: bytes,
    model: str,
    version: int | None,
    header_length: int | None,
    limits: DecodeLimits,
) -> tuple[InferenceRequest, OutputFormat]:
    binary = b"" if header_length is None else body[header_length:]
    params = _parameters(header.get("parameters"), what="request")
    # Parameters first: a request whose deadline has passed is refused before its tensors are
    # built (the cheapest refusal is what overload needs most).
    timeout_s, priority = scheduling(params)
    binary_all = _bool_param(params, "binary_data_output") or _bool_param(params, "binary_data")
    inputs = _decode_inputs(header.get("inputs"), binary, limits)
    outputs, binary_outputs, json_outputs = _requested_outputs(header.get("outputs"), limits)
    request = InferenceRequest(
        model=model,
        version=_version_param(params) if version is None else version,
        inputs=inputs,
        id=header.get("id"),
        outputs=outputs,
        timeout_s=timeout_s,
        priority=priority,
    )
    return request, OutputFormat(binary_all, binary_outputs, json_outputs)


def _decode_inputs(raw_inputs: Any, binary: bytes, limits: DecodeLimits) -> dict[str, np.ndarray]:
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("'inputs' must be a non-empty list")
    limits.check_input_count(len(raw_inputs))
    inputs: dict[str, np.ndarray] = {}
    offset = elements = 0
    for i, entry in enumerate(raw_inputs):
        name, arr, used = _decode_input(entry, i, binary, offset, limits)
        if name in inputs:
            raise BadRequest(f"input {name!r} is given twice")
        inputs[name] = arr
        offset += used
        elements += arr.size
        limits.check_elements(elements)
    if offset != len(binary):
        raise BadRequest(f"binary section has {len(binary)} bytes but the inputs declare {offset}")
    return inputs


def _requested_outputs(
    raw_outputs: Any, limits: DecodeLimits
) -> tuple[list[str] | None, frozenset[str], frozenset[str]]:
    """The outputs asked for (None: all), and which of them asked for binary or for JSON."""
    if raw_outputs is None:
        return None, frozenset(), frozenset()
    if not isinstance(raw_outputs, list):
        raise BadRequest("'outputs' must be a list")
    limits.check_input_count(len(raw_outputs))
    outputs: list[str] = []
    binary_outputs: set[str] = set()
    json_outputs: set[str] = set()
    for entry in raw_outputs:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest("each requested output needs a string 'name'")
        out_params = _parameters(entry.get("parameters"), what=f"output {entry['name']!r}")
        if "binary_data" in out_params:
            chosen = binary_outputs if _bool_param(out_params, "binary_data") else json_outputs
            chosen.add(entry["name"])
        outputs.append(entry["name"])
    return outputs, frozenset(binary_outputs), frozenset(json_outputs)


def _version_param(params: dict[str, Any]) -> int | None:
    if "model_version" not in params:
        return None
    raw_version = params["model_version"]
    if not isinstance(raw_version, str | int) or not str(raw_version).isdigit():
        raise BadRequest("parameter 'model_version' must be a positive integer")
    return int(raw_version)


def encode_response(response: InferenceResponse, fmt: OutputFormat) -> tuple[bytes, int | None]:
    """The reply body and, when it has a binary section, the JSON header's length."""
    as_json = [a for n, a in response.outputs.items() if not fmt.is_binary(n)]
    writer = json_codec.writer_for(as_json)
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, arr in response.outputs.items():
        entry: dict[str, Any] = {
            "name": name,
            "datatype": dtype_label(arr.dtype),
            "shape": list(arr.shape),
        }
        if fmt.is_binary(name):
            raw = tensor_to_raw(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _to_json_data(arr, writer)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": response.model, "model_version": str(response.version)}
    if response.id is not None:
        body["id"] = response.id
    body["outputs"] = outputs
    header = writer.dumps(body)
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


def encode_error(message: str) -> bytes:
    return json_codec.dumps({"error": message})


def unframe(payload: bytes) -> tuple[bytes, int | None]:
    """A framed payload -> (body, JSON header length); a plain JSON payload -> (payload, None)."""
    if not payload.startswith(FRAME_MAGIC):
        return payload, None
    if len(payload) < _FRAME_PREFIX.size:
        raise BadRequest("binary frame is shorter than its 8-byte prefix")
    _, header_length = _FRAME_PREFIX.unpack_from(payload)
    return payload[_FRAME_PREFIX.size :], header_length


def frame(body: bytes, header_length: int) -> bytes:
    return _FRAME_PREFIX.pack(FRAME_MAGIC, header_length) + body


# -- inputs ----------------------------------------------------------------------------------


def _decode_input(
    entry: Any, index: int, binary: bytes, offset: int, limits: DecodeLimits
) -> tuple[str, np.ndarray, int]:
    if not isinstance(entry, dict):
        raise BadRequest(f"inputs[{index}] must be an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{index}] needs a string 'name'")
    what = f"input {name!r}"
    dtype = numpy_dtype(entry.get("datatype"), what=what)
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequest(f"{what}: 'shape' must be a list of non-negative integers")
    count = limits.check_shape(shape, what)
    params = _parameters(entry.get("parameters"), what=what)
    size = params.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise BadRequest(f"{what}: 'binary_data_size' must be a non-negative integer")
        if "data" in entry:
            raise BadRequest(f"{what}: give either 'data' or 'binary_data_size', not both")
        if offset + size > len(binary):
            raise BadRequest(
                f"{what}: declares {size} binary bytes but only {len(binary) - offset} remain "
                "in the binary section"
            )
        arr = tensor_from_raw(binary[offset : offset + size], dtype, shape, what)
        return name, arr, size
    if "data" not in entry:
        raise BadRequest(f"{what}: needs 'data' or a 'binary_data_size' parameter")
    limits.check_data_depth(entry["data"], what)
    return name, _from_json_data(entry["data"], dtype, shape, count, what), 0


def tensor_from_raw(raw: bytes, dtype: np.dtype, shape: list[int], what: str) -> np.ndarray:
    count = math.prod(shape)
    if dtype == np.dtype(object):
        items = _unpack_bytes_elements(raw, what)
        if len(items) != count:
            raise BadRequest(f"{what}: {len(items)} BYTES elements for shape {shape}")
        arr = np.empty(count, dtype=object)
        arr[:] = items
        return arr.reshape(shape)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise BadRequest(
            f"{what}: binary data has {len(raw)} bytes, shape {shape} of "
            f"{dtype_label(dtype)} needs {expected}"
        )
    return (
        np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)
    )


def _unpack_bytes_elements(raw: bytes, what: str) -> list[bytes]:
    items: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise BadRequest(f"{what}: truncated BYTES element length")
        (n,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise BadRequest(f"{what}: BYTES element of {n} bytes overruns the data")
        items.append(raw[pos : pos + n])
        pos += n
    return items


def _from_json_data(
    data: Any, dtype: np.dtype, shape: list[int], count: int, what: str
) -> np.ndarray:
    if not isinstance(data, list):
        if isinstance(data, str) and dtype != np.dtype(object):
            # Counted as one value, a string would be refused for its count, not for what it is.
            raise BadRequest(
                f"{what}: 'data' is a string; {dtype_label(dtype)} data is a list of {count} "
                f"number{'s' * (count != 1)} (nested or flat), or binary tensor data"
            )
        data = [data]
    if dtype == np.dtype(object):
        flat = _flatten(data, what)
        if not all(isinstance(x, str) for x in flat):
            raise BadRequest(f"{what}: BYTES data must be strings")
        if len(flat) != count:
            raise BadRequest(f"{what}: {len(flat)} values for shape {shape}")
        arr = np.empty(count, dtype=object)
        arr[:] = [x.encode() for x in flat]
        return arr.reshape(shape)
    try:
        values = np.asarray(data)
    except ValueError:
        raise BadRequest(f"{what}: 'data' is ragged (nested lists of unequal lengths)") from None
    if values.size != count:
        if values.dtype.kind not in "biuf":
            convert_values(values, dtype, what)  # wrong in kind first (strings, nulls): say that
        raise BadRequest(
            f"{what}: {values.size} value{'s' * (values.size != 1)} for shape {shape} "
            f"(needs {count})"
        )
    return convert_values(values, dtype, what).reshape(shape)


def convert_values(values: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """JSON numbers -> ``dtype``, refusing what would change a value (floats into an integer
    tensor, out-of-range integers, strings or nulls into numbers)."""
    kind = values.dtype.kind
    if values.size == 0:
        return values.astype(dtype)
    if dtype.kind == "b":
        if kind != "b":
            raise BadRequest(f"{what}: BOOL data must be true/false")
        return values.astype(dtype)
    if kind not in "iuf" or (kind == "f" and dtype.kind in "iu"):
        got = {"b": "booleans", "U": "strings", "O": "mixed or null values", "f": "floats"}.get(
            kind, values.dtype.name
        )
        raise BadRequest(f"{what}: {got} are not valid {dtype_label(dtype)} data")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise BadRequest(f"{what}: value out of range for {dtype_label(dtype)}")
    if dtype.kind == "f" and kind == "f":
        # A finite number beyond the type's range would silently become infinity.
        finite = np.abs(values[np.isfinite(values)])
        if finite.size and finite.max() > np.finfo(dtype).max:
            raise BadRequest(f"{what}: value out of range for {dtype_label(dtype)}")
    return values.astype(dtype)


def _flatten(data: Any, what: str) -> list[Any]:
    out: list[Any] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


# -- outputs ---------------------------------------------------------------------------------


def tensor_to_raw(arr: np.ndarray) -> bytes:
    if arr.dtype == np.dtype(object):
        parts = []
        for item in arr.reshape(-1):
            raw = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _to_json_data(arr: np.ndarray, writer: json_codec.Writer) -> Any:
    flat = arr.reshape(-1)
    if arr.dtype == np.dtype(object):
        return [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in flat]
    return writer.value(flat)


# -- parameters ------------------------------------------------------------------------------


def _parameters(value: Any, *, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{what}: 'parameters' must be an object")
    check_scalar_parameters(value, what)
    return value


def version_parameter(params: dict[str, Any]) -> int | None:
    """The ``model_version`` parameter, for a request whose address names no version."""
    return _version_param(params)


def scheduling(params: dict[str, Any]) -> tuple[float | None, int]:
    """The request's time budget (``timeout``, ``deadline_unix_ms``) and ``priority`` from its
    parameters: one reading for every transport that carries Open Inference Protocol ones."""
    return _timeout(params), _int_param(params, "priority", 0, _MAX_PRIORITY)


def _bool_param(params: dict[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if not isinstance(value, bool):
        raise BadRequest(f"parameter {key!r} must be true or false")
    return value


def _int_param(params: dict[str, Any], key: str, default: int, upper: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= upper:
        raise BadRequest(f"parameter {key!r} must be an integer in [0, {upper}]")
    return value


_BUDGET_KEYS = (b"timeout", b"deadline_unix_ms", b"\\u")
"""What a body that names a budget of its own holds (``_timeout``), a key spelt with escapes
included (a JSON string may write any letter as ``\\uXXXX``)."""


def may_name_budget(body: bytes) -> bool:
    """Whether ``body`` may name a budget of its own (a ``timeout`` or ``deadline_unix_ms``
    parameter): false only when none can be in it. A byte search (29 us on vision_cnn's
    15 kB JSON body), asked only of a request admission would refuse."""
    return any(key in body for key in _BUDGET_KEYS)


def _timeout(params: dict[str, Any]) -> float | None:
    """The request's time budget from now: the ``timeout`` parameter (microseconds, as in
    Triton; 0 or absent: the model SLO), capped by ``deadline_unix_ms``, an absolute deadline
    on the device's wall clock. A relative timeout starts when the gateway reads the request,
    so time spent queued in an MQTT broker is invisible to it; an absolute deadline is not
    (it needs clocks kept in step, e.g. by NTP)."""
    value = params.get("timeout")
    timeout_s: float | None = None
    if value is not None and value != 0:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise BadRequest("parameter 'timeout' must be a non-negative number of microseconds")
        timeout_s = float(value) / 1e6
    deadline = params.get("deadline_unix_ms")
    if deadline is None:
        return timeout_s
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
        raise BadRequest("parameter 'deadline_unix_ms' must be a positive Unix time in ms")
    remaining = float(deadline) / 1000.0 - time.time()
    if remaining <= 0:
        raise DeadlineUnmeetable(
            f"the request's deadline (deadline_unix_ms) passed {-remaining * 1000:.0f} ms "
            "before the gateway read it (queued in the broker or the network)"
        )
    return remaining if timeout_s is None else min(timeout_s, remaining)
