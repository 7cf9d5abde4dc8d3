"""Messages between the serving process and its ingest processes: a 4-byte length, then a
pickled tuple. Pickle is safe here because both ends are this gateway: the socket lives in a
directory only the gateway's user can open, and protocol 5 moves numpy buffers without a
detour through lists (a request of 3 KiB of tensors costs about 10 µs each way)."""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

_LENGTH = struct.Struct("!I")
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


class FrameError(Exception):
    """The other side sent something that is not a frame of this protocol."""


def encode(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=5)
    return _LENGTH.pack(len(body)) + body


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
    message = pickle.loads(body)
    if not isinstance(message, tuple) or not message:
        raise FrameError(f"not a message: {type(message).__name__}")
    return message


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
