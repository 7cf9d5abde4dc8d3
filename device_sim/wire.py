"""Open Inference Protocol request bodies and replies, as docs/mqtt.md frames them.

A body is encoded once per payload and reused for many requests: only the ``id`` differs, so it
is spliced in front of the pre-serialized rest of the JSON header instead of re-encoding the
tensors for every request (a 32x32x3 FP32 image is ~60 kB of JSON).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from device_sim.tensors import datatype_of

BINARY_MAGIC = b"OIPB"
JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/vnd.iotgw.oip+binary"
HEADER_LENGTH = "Inference-Header-Content-Length"  # HTTP's binary tensor extension header
_LEN = struct.Struct("<I")


class RequestBody(Protocol):
    @property
    def content_type(self) -> str: ...

    def mqtt(self, request_id: str) -> bytes:
        """The MQTT payload carrying ``request_id``."""
        ...

    def http(self, request_id: str) -> tuple[bytes, int | None]:
        """The HTTP body and, for binary bodies, the JSON header's length."""
        ...


@dataclass(frozen=True, slots=True)
class OipBody:
    """An inference request with everything but its ``id`` serialized."""

    header_rest: bytes  # the JSON header without "id" and "parameters", without its "{"
    tensors: bytes  # binary section; empty for JSON framing
    binary: bool
    parameters: bytes = b""  # the request's parameters, serialized without their braces

    @property
    def content_type(self) -> str:
        return BINARY_CONTENT_TYPE if self.binary else JSON_CONTENT_TYPE

    def header(self, request_id: str, deadline_unix_ms: int | None = None) -> bytes:
        """The JSON header; ``deadline_unix_ms`` adds the request's absolute deadline (the
        gateway then also counts the time the request waited in the broker)."""
        sep = b"" if self.header_rest == b"}" else b","
        head = b'{"id":' + json.dumps(request_id).encode()
        params = self.parameters
        if deadline_unix_ms is not None:
            params += (b"," if params else b"") + b'"deadline_unix_ms":%d' % deadline_unix_ms
        if params:
            head += b',"parameters":{' + params + b"}"
        return head + sep + self.header_rest

    def mqtt(self, request_id: str, deadline_unix_ms: int | None = None) -> bytes:
        header = self.header(request_id, deadline_unix_ms)
        if not self.binary:
            return header
        return BINARY_MAGIC + _LEN.pack(len(header)) + header + self.tensors

    def http(self, request_id: str) -> tuple[bytes, int | None]:
        header = self.header(request_id)
        if not self.binary:
            return header, None
        return header + self.tensors, len(header)


@dataclass(frozen=True, slots=True)
class RawBody:
    """A recorded payload that is not a well-formed request (sent verbatim, id and all)."""

    payload: bytes
    content_type: str = JSON_CONTENT_TYPE

    def mqtt(self, request_id: str) -> bytes:
        return self.payload

    def http(self, request_id: str) -> tuple[bytes, int | None]:
        return self.payload, None


def _header_rest(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode()[1:]


def _parameters(params: dict[str, Any]) -> bytes:
    return json.dumps(params, separators=(",", ":")).encode()[1:-1]


def _tensor_bytes(arr: np.ndarray) -> bytes:
    if arr.dtype.kind in "OUS":
        # BYTES in the binary extension: each element as a 4-byte little-endian length + bytes.
        out = bytearray()
        for item in arr.ravel():
            raw = item if isinstance(item, bytes) else str(item).encode()
            out += _LEN.pack(len(raw)) + raw
        return bytes(out)
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _json_data(arr: np.ndarray) -> list[Any]:
    if arr.dtype.kind in "OUS":
        return [x.decode() if isinstance(x, bytes) else str(x) for x in arr.ravel()]
    return arr.ravel().tolist()


def encode_request(
    inputs: dict[str, np.ndarray], *, binary: bool, timeout_us: int | None = None
) -> OipBody:
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, arr in inputs.items():
        entry: dict[str, Any] = {
            "name": name,
            "datatype": datatype_of(arr),
            "shape": list(arr.shape),
        }
        if binary:
            raw = _tensor_bytes(arr)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(arr)
        entries.append(entry)
    header: dict[str, Any] = {"inputs": entries}
    params: dict[str, Any] = {}
    if timeout_us is not None:
        params["timeout"] = timeout_us
    if binary:
        params["binary_data_output"] = True
    return OipBody(_header_rest(header), b"".join(chunks), binary, _parameters(params))


def split_binary(payload: bytes) -> tuple[bytes, bytes] | None:
    """``(json_header, tensors)`` of an ``OIPB`` payload, or None if it is not one."""
    if not payload.startswith(BINARY_MAGIC) or len(payload) < 8:
        return None
    (n,) = _LEN.unpack_from(payload, 4)
    if 8 + n > len(payload):
        return None
    return payload[8 : 8 + n], payload[8 + n :]


def body_from_payload(payload: bytes) -> RequestBody:
    """A recorded MQTT payload made reusable: its ``id`` is replaced per request. Payloads that
    are not a JSON-object request are kept verbatim."""
    parts = split_binary(payload)
    binary = parts is not None
    header_bytes, tensors = parts if parts is not None else (payload, b"")
    try:
        header = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        return RawBody(payload, BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE)
    header.pop("id", None)
    params = header.pop("parameters", None)
    if params is not None and not isinstance(params, dict):
        return RawBody(payload, BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE)
    params = dict(params or {})
    params.pop("deadline_unix_ms", None)  # a recorded absolute deadline has long passed
    return OipBody(_header_rest(header), tensors, binary, _parameters(params))


@dataclass(frozen=True, slots=True)
class Reply:
    id: str | None
    status: int  # HTTP-style; 0 when the reply could not be read
    reason: str | None


def _status(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def parse_reply(payload: bytes, status_property: str | None = None) -> Reply:
    """Read the id and status of an MQTT reply (JSON, or ``OIPB`` with a JSON header).
    ``status_property`` is the MQTT 5 user property ``status`` when present."""
    parts = split_binary(payload)
    header_bytes = parts[0] if parts is not None else payload
    try:
        doc = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError):
        doc = None
    if not isinstance(doc, dict):
        return Reply(None, 0, "unreadable_reply")
    rid = doc.get("id") if isinstance(doc.get("id"), str) else None
    status = _status(status_property) or _status(doc.get("status"))
    if status is None:
        # docs/mqtt.md puts a status in every reply; a success body is recognisable anyway.
        if "outputs" not in doc or "error" in doc:
            return Reply(rid, 0, "no_status")
        status = 200
    reason = doc.get("reason") if isinstance(doc.get("reason"), str) else None
    return Reply(rid, status, reason)


def error_kind(status: int, reason: str | None) -> str:
    """The key errors are counted under: the reply's reason, else its status."""
    if reason:
        return reason
    return f"status_{status}"
