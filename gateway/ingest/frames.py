"""Messages between the serving process and its ingest processes: a 4-byte length, a 1-byte
form, then the message.

Requests and replies (the hot path) are a small JSON head (orjson) followed by the tensors'
raw bytes, read back with ``np.frombuffer``: about 5 µs each way for a request of one row,
against 20-25 µs for pickle. Everything else (catalogs, counts) is pickled; pickle is safe
here because both ends are this gateway: the socket lives in a directory only the gateway's
user can open. A tensor of Python objects (BYTES) makes its message take the pickled form."""

from __future__ import annotations

import asyncio
import math
import pickle
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from gateway.types import InferenceRequest, InferenceResponse

_LENGTH = struct.Struct("!I")
_HEAD = struct.Struct("!I")
_PICKLED, _REQUEST, _RESPONSE = b"K", b"Q", b"P"
# A frame carries one request or one reply; the edge has already bounded their bodies.
MAX_FRAME_BYTES = 1 << 30

# Message kinds (first element of every tuple).
HELLO = "hello"  # ingest -> serving: (HELLO, worker index, pid)
CATALOG = "catalog"  # serving -> ingest: (CATALOG, Catalog)
INFER = "infer"  # ingest -> serving: (INFER, seq, InferenceRequest, transport)
REPLY = "reply"  # serving -> ingest: (REPLY, seq, InferenceResponse)
ERROR = "error"  # serving -> ingest: (ERROR, seq, error class name, message, retry_after)
COUNTS = "counts"  # ingest -> serving: (COUNTS, {counter: {labels: increment}})
LIVE = "live"  # ingest -> serving: (LIVE, {"http": bool, "mqtt": bool | None})
STATE = "state"  # ingest -> serving: (STATE, {"mqtt_connected" | "mqtt_in_flight" | ...: number})


class FrameError(Exception):
    """The other side sent something that is not a frame of this protocol."""


def encode(message: tuple[Any, ...]) -> bytes:
    kind = message[0]
    parts: list[Any] | None = None
    if kind == INFER:
        _, seq, request, transport = message
        parts = _tensor_parts(
            _REQUEST,
            {
                "s": seq,
                "t": transport,
                "m": request.model,
                "v": request.version,
                "i": request.id,
                "o": request.outputs,
                "to": request.timeout_s,
                "p": request.priority,
            },
            request.inputs,
        )
    elif kind == REPLY:
        _, seq, response = message
        parts = _tensor_parts(
            _RESPONSE,
            {
                "s": seq,
                "m": response.model,
                "v": response.version,
                "i": response.id,
                "tm": response.timings,
            },
            response.outputs,
        )
    if parts is None:
        parts = [_PICKLED, pickle.dumps(message, protocol=5)]
    body = b"".join(parts)
    return _LENGTH.pack(len(body)) + body


def _tensor_parts(
    form: bytes, head: dict[str, Any], tensors: Mapping[str, np.ndarray]
) -> list[Any] | None:
    arrays = []
    for array in tensors.values():
        if array.dtype.hasobject:
            return None  # no raw bytes to send: the pickled form
        arrays.append(np.ascontiguousarray(array))
    head["x"] = [[name, a.dtype.str, a.shape] for name, a in zip(tensors, arrays, strict=True)]
    encoded = orjson.dumps(head)
    return [form, _HEAD.pack(len(encoded)), encoded, *(a.data.cast("B") for a in arrays)]


def _tensors(body: bytes, offset: int, specs: list[list[Any]]) -> dict[str, np.ndarray]:
    out = {}
    for name, dtype_str, shape in specs:
        dtype = np.dtype(dtype_str)
        count = math.prod(shape)
        out[name] = np.frombuffer(body, dtype, count, offset).reshape(shape)
        offset += count * dtype.itemsize
    if offset != len(body):
        raise FrameError(f"frame holds {len(body) - offset} bytes beyond its tensors")
    return out


def decode(body: bytes) -> tuple[Any, ...]:
    form = body[:1]
    if form == _PICKLED:
        message = pickle.loads(body[1:])
        if not isinstance(message, tuple) or not message:
            raise FrameError(f"not a message: {type(message).__name__}")
        return message
    if form not in (_REQUEST, _RESPONSE):
        raise FrameError(f"unknown frame form {form!r}")
    (size,) = _HEAD.unpack_from(body, 1)
    start = 1 + _HEAD.size
    head = orjson.loads(body[start : start + size])
    tensors = _tensors(body, start + size, head["x"])
    if form == _REQUEST:
        request = InferenceRequest(
            model=head["m"],
            inputs=tensors,
            version=head["v"],
            id=head["i"],
            outputs=head["o"],
            timeout_s=head["to"],
            priority=head["p"],
        )
        return (INFER, head["s"], request, head["t"])
    response = InferenceResponse(
        model=head["m"], version=head["v"], outputs=tensors, id=head["i"], timings=head["tm"]
    )
    return (REPLY, head["s"], response)


async def read(reader: asyncio.StreamReader) -> tuple[Any, ...] | None:
    """The next message, or None at a clean end of stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("stream ended inside a frame header") from None
        return None
    (size,) = _LENGTH.unpack(head)
    if size > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("stream ended inside a frame") from None
    return decode(body)


class FrameWriter:
    """Sends messages on ``writer``, coalescing those sent in one pass of the event loop into one
    write: under load each side produces many replies per wake-up, and one system call for all
    of them (instead of one each) is most of what this hop costs."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._parts: list[bytes] = []
        self._scheduled = False

    def send(self, message: tuple[Any, ...]) -> None:
        self._parts.append(encode(message))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def buffered(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    def _flush(self) -> None:
        self._scheduled = False
        parts, self._parts = self._parts, []
        if parts and not self.writer.is_closing():
            self.writer.write(b"".join(parts))

    def close(self) -> None:
        self._flush()
        self.writer.close()
