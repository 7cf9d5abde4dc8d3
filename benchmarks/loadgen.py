"""The HTTP load generator the benchmarks share: a closed loop of clients, bounded in requests
and in time, with either aiohttp's client or ``RawHttpConnection``, a minimal HTTP/1.1 client
that costs the shared cores a fraction of what aiohttp's does per request.

A ``LoadJob`` says what to send and for how long; ``run_load`` runs it in this process,
``run_http_job`` in a client process (``benchmarks.clients``), ``split_job`` cuts it into one
share per client process and ``merge_load`` makes one figure of the shares again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from benchmarks.common import machine_busy_seconds, process_cpu_seconds
from gateway.codecs.oip import HEADER_LENGTH

Send = Callable[[], Awaitable[tuple[int, bytes]]]


# -- the wire: one pre-encoded request -------------------------------------------------------


def encode_request(
    input_name: str, arr: np.ndarray, request_id: str | None = None
) -> tuple[bytes, int]:
    """Binary tensor framing: JSON header, then the raw little-endian FP32 rows. Returns the
    body and the header's length (``Inference-Header-Content-Length``)."""
    header: dict[str, Any] = {} if request_id is None else {"id": request_id}
    header["inputs"] = [
        {
            "name": input_name,
            "shape": list(arr.shape),
            "datatype": "FP32",
            "parameters": {"binary_data_size": arr.nbytes},
        }
    ]
    header["parameters"] = {"binary_data_output": True}
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + np.ascontiguousarray(arr, dtype="<f4").tobytes(), len(head)


def decode_response(payload: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """The outputs of a reply: JSON, or the binary framing when ``header_length`` is given."""
    if header_length is None:
        doc = json.loads(payload)
        return {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in doc["outputs"]}
    doc = json.loads(payload[:header_length])
    out: dict[str, np.ndarray] = {}
    offset = header_length
    for o in doc["outputs"]:
        size = o["parameters"]["binary_data_size"]
        assert o["datatype"] == "FP32", o
        out[o["name"]] = np.frombuffer(payload[offset : offset + size], "<f4").reshape(o["shape"])
        offset += size
    return out


@dataclass(frozen=True, slots=True)
class LoadJob:
    url: str
    body: bytes
    header_length: int  # 0: ``body`` is plain JSON (application/json), not the binary framing
    rows_per_request: int
    concurrency: int
    duration_s: float
    max_requests: int
    warmup_s: float
    timeout_s: float
    start_at: float | None = None  # time.time() at which every client process starts timing
    server_pid: int | None = None  # whose CPU time to read over the timed window
    client: str = "aiohttp"  # or "raw": RawHttpConnection


# -- the raw client --------------------------------------------------------------------------


class RawHttpConnection(asyncio.Protocol):
    """A minimal HTTP/1.1 keep-alive client connection: writes a request pre-encoded once
    (request line, headers and body in one bytes object) and reads one reply framed by its
    Content-Length. It checks the status line and the length, nothing more: a load generator
    that costs the shared cores a fraction of what aiohttp's client does per request."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._body_start = -1
        self._end = -1
        self._status = 0
        self.sent_at = 0.0
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int) -> RawHttpConnection:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(cls, host, port)  # asyncio sets TCP_NODELAY
        return proto

    @property
    def waiting(self) -> bool:
        """A request is out and its reply not read yet."""
        return self._waiter is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.fail(ConnectionResetError("the server closed the connection"))

    def fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def request(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        if self.closed or self._transport is None:
            raise ConnectionResetError("connection closed")
        assert self._waiter is None, "one request at a time per connection"
        self._waiter = asyncio.get_running_loop().create_future()
        self.sent_at = time.perf_counter()
        self._transport.write(data)
        return self._waiter

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._end < 0 and not self._read_head():
            return
        if len(self._buf) < self._end:
            return
        body = bytes(self._buf[self._body_start : self._end])
        del self._buf[: self._end]
        self._end = -1
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))

    def _read_head(self) -> bool:
        """Status and Content-Length of the reply in the buffer; False until the head is in."""
        head_end = self._buf.find(b"\r\n\r\n")
        if head_end < 0:
            return False
        head = bytes(self._buf[:head_end]).lower()
        self._status = int(head[9:12])
        pos = head.find(b"\r\ncontent-length:")
        if pos < 0:
            self.fail(ValueError("reply without Content-Length"))
            self.close()
            return False
        stop = head.find(b"\r\n", pos + 2)
        length = int(head[pos + 17 : stop if stop >= 0 else None])
        self._body_start = head_end + 4
        self._end = self._body_start + length
        return True


def _content_headers(header_length: int) -> dict[str, str]:
    """The binary framing's headers, or JSON's when ``header_length`` is 0."""
    if header_length == 0:
        return {"Content-Type": "application/json"}
    return {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}


def encode_http_request(url: str, body: bytes, header_length: int) -> tuple[str, int, bytes]:
    """(host, port, the whole HTTP/1.1 request as bytes) for ``RawHttpConnection``."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    kind = "".join(f"{k}: {v}\r\n" for k, v in _content_headers(header_length).items())
    head = f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\n{kind}Content-Length: {len(body)}\r\n\r\n"
    return host, int(port or 80), head.encode() + body


# -- senders: one per client of the closed loop ------------------------------------------------


async def _aiohttp_senders(stack: contextlib.AsyncExitStack, job: LoadJob) -> list[Send]:
    headers = _content_headers(job.header_length)
    body, url = job.body, job.url
    session = await stack.enter_async_context(
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=job.concurrency, limit_per_host=job.concurrency),
            timeout=aiohttp.ClientTimeout(total=job.timeout_s),
        )
    )

    async def post() -> tuple[int, bytes]:
        async with session.post(url, data=body, headers=headers) as resp:
            return resp.status, await resp.read()

    return [post] * job.concurrency


async def _raw_senders(stack: contextlib.AsyncExitStack, job: LoadJob) -> list[Send]:
    host, port, raw = encode_http_request(job.url, job.body, job.header_length)
    conns = [await RawHttpConnection.open(host, port) for _ in range(job.concurrency)]
    for c in conns:
        stack.callback(c.close)

    def sender(i: int) -> Send:
        async def send() -> tuple[int, bytes]:
            if conns[i].closed:
                conns[i] = await RawHttpConnection.open(host, port)
            return await conns[i].request(raw)

        return send

    async def watchdog() -> None:  # the raw client's request timeout
        while True:
            await asyncio.sleep(min(0.5, job.timeout_s / 4))
            now = time.perf_counter()
            for c in conns:
                if c.waiting and now - c.sent_at > job.timeout_s:
                    c.fail(TimeoutError(f"no reply within {job.timeout_s:g} s"))
                    c.close()

    dog = asyncio.create_task(watchdog())
    stack.callback(dog.cancel)
    return [sender(i) for i in range(job.concurrency)]


# -- the closed loop ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    """What the clients of one run counted."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    issued: int = 0
    ok: int = 0
    late: int = 0
    lost: int = 0
    last: float = 0.0
    reply_len: int = -1
    # JSON replies carry floats as text, whose length varies with the digits: only binary
    # replies have one length.
    fixed_length: bool = True

    def judge(self, status: int, reply: bytes) -> int:
        """The status, or -2 for a 200 whose length differs from the first good reply's."""
        if status != 200 or not self.fixed_length:
            return status
        if self.reply_len < 0:
            self.reply_len = len(reply)
        elif len(reply) != self.reply_len:
            self.errors["reply of unexpected length"] += 1
            return -2
        return status

    def count(self, status: int, t0: float, t1: float, until: float) -> None:
        if status != 200:
            self.lost += 1
            if status > 0:
                self.errors[f"HTTP {status}"] += 1
        elif t1 <= until:
            self.ok += 1
            self.latencies.append(t1 - t0)
            self.last = max(self.last, t1)
        else:
            self.late += 1  # answered, but after the window closed


async def _client(send: Send, until: float, record: bool, tally: _Tally, job: LoadJob) -> None:
    """One client: its next request as soon as the reply to its last one is in."""
    clock = time.perf_counter
    while clock() < until and not (record and tally.issued >= job.max_requests):
        if record:
            tally.issued += 1
        t0 = clock()
        try:
            status, reply = await send()
        except Exception as exc:  # every request without an answer is lost
            status, reply = -1, b""
            tally.errors[type(exc).__name__] += 1
        t1 = clock()
        status = tally.judge(status, reply)
        if record:
            tally.count(status, t0, t1, until)


async def _timed_window(job: LoadJob, senders: list[Send], tally: _Tally) -> dict[str, Any]:
    """The warm-up, then the timed run, with the CPU readings around it."""
    if job.warmup_s > 0:
        warm_until = time.perf_counter() + job.warmup_s
        await asyncio.gather(*(_client(s, warm_until, False, tally, job) for s in senders))
        tally.errors.clear()
    if job.start_at is not None:
        await asyncio.sleep(max(0.0, job.start_at - time.time()))
    server0 = process_cpu_seconds(job.server_pid) if job.server_pid else None
    busy0 = machine_busy_seconds()
    cpu0 = time.process_time()
    start = time.perf_counter()
    until = start + job.duration_s
    await asyncio.gather(*(_client(s, until, True, tally, job) for s in senders))
    cpu1 = time.process_time()
    end = time.perf_counter()
    server1 = process_cpu_seconds(job.server_pid) if job.server_pid else None
    busy1 = machine_busy_seconds()
    wall = end - start
    return {
        "start": start,
        "client_cpu_s": cpu1 - cpu0,
        "client_wall_s": wall,
        "server_cpu_cores": _rate(server0, server1, wall),
        "machine_busy_cores": _rate(busy0, busy1, wall),
    }


def _rate(before: float | None, after: float | None, wall_s: float) -> float | None:
    return None if before is None or after is None else (after - before) / wall_s


async def run_load(job: LoadJob) -> dict[str, Any]:
    """``job.concurrency`` requests always in flight (each client sends its next request when
    the reply to its last one arrived), for ``duration_s`` or ``max_requests``, after a warm-up.
    Latency is send -> whole reply read, per request, at the client. A reply that is not a 200,
    or whose length differs from the first good reply's, or that never comes, is lost."""
    tally = _Tally(fixed_length=job.header_length > 0)
    async with contextlib.AsyncExitStack() as stack:
        if job.client == "aiohttp":
            senders = await _aiohttp_senders(stack, job)
        elif job.client == "raw":
            senders = await _raw_senders(stack, job)
        else:
            raise ValueError(f"unknown client {job.client!r}")
        readings = await _timed_window(job, senders, tally)
    start = readings.pop("start")
    # Stopped by the request bound: the window ends at the last answer.
    stopped_early = tally.issued >= job.max_requests
    elapsed = max(tally.last - start if stopped_early else job.duration_s, 1e-9)
    return {
        "issued": tally.issued,
        "answered": tally.ok,
        "answered_after_window": tally.late,
        "lost": tally.lost,
        "errors": dict(tally.errors),
        "elapsed_s": elapsed,
        "rows_per_s": tally.ok * job.rows_per_request / elapsed,
        "latencies_s": tally.latencies,
        **readings,
    }


def run_http_job(job: LoadJob) -> dict[str, Any]:
    """A client process's job runner (``benchmarks.clients``): one share of the closed loop."""
    return asyncio.run(run_load(job))


def split_job(job: LoadJob, processes: int, start_delay_s: float = 0.5) -> list[LoadJob]:
    """``job`` cut into one share per client process, each with a part of the clients and of
    the request bound, all timed from a common start after every process warmed up."""
    if job.concurrency < processes:
        raise ValueError(f"{job.concurrency} clients cannot be split over {processes} processes")
    start_at = time.time() + job.warmup_s + start_delay_s
    return [
        dataclasses.replace(
            job,
            concurrency=job.concurrency // processes + (i < job.concurrency % processes),
            max_requests=max(1, job.max_requests // processes),
            start_at=start_at,
        )
        for i in range(processes)
    ]


def merge_load(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One figure from the shares of several client processes (timed over the same window)."""
    merged_errors: Counter[str] = Counter()
    for r in results:
        merged_errors.update(r["errors"])
    return {
        "issued": sum(r["issued"] for r in results),
        "answered": sum(r["answered"] for r in results),
        "answered_after_window": sum(r["answered_after_window"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "errors": dict(merged_errors),
        "elapsed_s": max(r["elapsed_s"] for r in results),
        "rows_per_s": sum(r["rows_per_s"] for r in results),
        "latencies_s": [x for r in results for x in r["latencies_s"]],
        "client_cpu_s": sum(r["client_cpu_s"] for r in results),
        "client_wall_s": max(r["client_wall_s"] for r in results),
        # Every process read the server and the machine over (almost) the same window: one
        # reading is enough.
        "server_cpu_cores": results[0]["server_cpu_cores"],
        "machine_busy_cores": results[0]["machine_busy_cores"],
    }
