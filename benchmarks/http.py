"""HTTP benchmark: the gateway against the limits it is held to (``iotgw bench http``).

For ``sensor_mlp`` and ``vision_cnn`` (ONNX Runtime), side by side in one run:

1. **The limit.** The same runtime (``models.backends.load_runtime``) called in this process, no
   gateway: (intra-op threads, instances) in {(1, 1), (cores, 1), (1, cores), (1, cores + 1)}
   times batch sizes 1, 2, 4, ... up to the model's maximum, as rows/s, every configuration once
   per round. The best is the limit.
2. **The gateway at saturation.** ``iotgw serve`` in its own process (loopback, port 0), knobs set
   through ``PUT /admin/models/{m}/versions/1/knobs``: the limit's intra-op threads, its
   instances or one more, and the two largest batch sizes whose batch costs at most a quarter of
   the model's SLO; the fastest of those four. Load: a closed loop of N clients, one row per
   request in the binary tensor framing (JSON header + raw FP32, ``binary_data_output``), body
   pre-encoded once. Setups tried at those knobs, at a few N: the aiohttp client
   in the benchmark process, the aiohttp client split over 2 processes, and a minimal raw
   asyncio HTTP/1.1 client (``RawHttpConnection``, a few times cheaper per request: the client
   shares the cores with the server here, unlike devices in production). The fastest setup whose
   p99 stays under the SLO with nothing lost (and the fastest aiohttp one) are then measured
   again between runs of the limit (L G L G ... L); the ratio is the median over rounds of the
   gateway's rows/s over the mean of the two limit runs around it.
   Beside it, the CPU each row costs (gateway server + client, against the limit), which other
   work on a shared machine moves much less than wall-clock rates.
3. **Low load.** One sequential client: a bare aiohttp echo server (its own process, same
   machine, same body, same route shape) against the gateway on ``sensor_mlp`` with
   ``batch_timeout_ms=0``; client-measured send -> reply p50 and p99, with the aiohttp client
   (headline) and the raw one. Overhead = gateway - echo, per round. The in-process batch-1
   runtime time is shown beside it: that part is compute, not overhead.

Every figure is warmed up and repeated (5 runs, median quoted with min and max; ``--quick``: 1-2
short runs, the whole pipeline in well under a minute). Results: ``benchmarks/results/http.json``
(``http.quick.json`` in quick mode, or under ``--out``). Servers and client processes are stopped
on the way out, whatever happens (and die with the benchmark if it is killed).

Run with ``iotgw bench http [--quick] [--out DIR]`` or ``python -m benchmarks.http``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from benchmarks.clients import ClientProcesses
from benchmarks.common import (
    MIN_FULL_RUNS,
    Repeated,
    ServerProcess,
    fmt_repeated,
    format_table,
    machine_busy_seconds,
    machine_info,
    now_iso,
    percentiles,
    process_cpu_seconds,
    python_argv,
    usable_cores,
    write_results,
)

NAME = "http"
MODELS = ("sensor_mlp", "vision_cnn")
LOW_LOAD_MODEL = "sensor_mlp"
HEADER_LENGTH = "Inference-Header-Content-Length"
HOST = "127.0.0.1"
ECHO_READY = "echo listening on port"
# One batch may cost at most this fraction of the model's SLO in the gateway: the rest is
# left for waiting behind the batch ahead and for the batch to fill.
BATCH_SLO_FRACTION = 0.25
# Little's law cap on the closed loop: N in flight at X rows/s wait N/X; keep it under half the SLO.
CLOSED_LOOP_SLO_FRACTION = 0.5
MAX_CLOSED_LOOP = 128


# A load generator setup: (client kind, processes); kind "aiohttp" or "raw" (RawHttpConnection);
# 0 processes: the client runs in the benchmark process itself.
Setup = tuple[str, int]
# The cheapest client, so that the knob comparison leaves the gateway the most CPU.
KNOB_SWEEP_SETUP: Setup = ("raw", 0)


@dataclass(frozen=True, slots=True)
class Plan:
    """How much to measure. ``FULL`` for the committed figures, ``QUICK`` for CI."""

    quick: bool
    repeats: int  # runs of every sweep figure
    headline_repeats: int  # paired runs of the limit and the gateway
    thread_configs: tuple[tuple[int, int], ...] | None  # (intra-op, instances); None: per cores
    batch_sizes: tuple[int, ...] | None  # None: 1, 2, 4, ... up to the model's maximum
    inproc_run_s: float
    inproc_warmup_s: float
    limit_headline_run_s: float
    gw_sweep_run_s: float
    gw_headline_run_s: float
    gw_warmup_s: float
    client_setups: tuple[Setup, ...]
    low_requests: int
    low_warmup_s: float
    max_requests_per_run: int
    client_timeout_s: float
    startup_timeout_s: float


FULL = Plan(
    quick=False,
    repeats=MIN_FULL_RUNS,
    headline_repeats=MIN_FULL_RUNS,
    thread_configs=None,
    batch_sizes=None,
    inproc_run_s=0.3,
    inproc_warmup_s=0.2,
    limit_headline_run_s=2.5,
    gw_sweep_run_s=1.2,
    gw_headline_run_s=3.0,
    gw_warmup_s=0.3,
    client_setups=(("aiohttp", 0), ("aiohttp", 2), ("raw", 0)),
    low_requests=1500,
    low_warmup_s=0.5,
    max_requests_per_run=500_000,
    client_timeout_s=10.0,
    startup_timeout_s=180.0,
)
QUICK = Plan(
    quick=True,
    repeats=1,
    headline_repeats=2,
    thread_configs=((1, 1), (1, min(2, usable_cores()))),
    batch_sizes=(1, 4, 16),
    inproc_run_s=0.15,
    inproc_warmup_s=0.05,
    limit_headline_run_s=0.3,
    gw_sweep_run_s=0.6,
    gw_headline_run_s=0.8,
    gw_warmup_s=0.2,
    client_setups=(("aiohttp", 0), ("aiohttp", 2), ("raw", 0)),
    low_requests=200,
    low_warmup_s=0.2,
    max_requests_per_run=50_000,
    client_timeout_s=10.0,
    startup_timeout_s=50.0,
)


# -- the wire: one pre-encoded request per model --------------------------------------------


def encode_request(input_name: str, arr: np.ndarray) -> tuple[bytes, int]:
    """Binary tensor framing: JSON header, then the raw little-endian FP32 rows."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": input_name,
                    "shape": list(arr.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": arr.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        },
        separators=(",", ":"),
    ).encode()
    return header + np.ascontiguousarray(arr, dtype="<f4").tobytes(), len(header)


def decode_response(payload: bytes, header_length: int | None) -> dict[str, np.ndarray]:
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


# -- the load generator (closed loop, bounded in requests and in time) -----------------------


@dataclass(frozen=True, slots=True)
class LoadJob:
    url: str
    body: bytes
    header_length: int
    rows_per_request: int
    concurrency: int
    duration_s: float
    max_requests: int
    warmup_s: float
    timeout_s: float
    start_at: float | None = None  # time.time() at which every client process starts timing
    server_pid: int | None = None  # whose CPU time to read over the timed window
    client: str = "aiohttp"  # or "raw": RawHttpConnection


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
        if self._end < 0:
            head_end = self._buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = bytes(self._buf[:head_end]).lower()
            self._status = int(head[9:12])
            pos = head.find(b"\r\ncontent-length:")
            if pos < 0:
                self.fail(ValueError("reply without Content-Length"))
                self.close()
                return
            stop = head.find(b"\r\n", pos + 2)
            length = int(head[pos + 17 : stop if stop >= 0 else None])
            self._body_start = head_end + 4
            self._end = self._body_start + length
        if len(self._buf) < self._end:
            return
        body = bytes(self._buf[self._body_start : self._end])
        del self._buf[: self._end]
        self._end = -1
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, body))


def encode_http_request(url: str, body: bytes, header_length: int) -> tuple[str, int, bytes]:
    """(host, port, the whole HTTP/1.1 request as bytes) for ``RawHttpConnection``."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    head = (
        f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\n"
        f"Content-Type: application/octet-stream\r\n"
        f"{HEADER_LENGTH}: {header_length}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return host, int(port or 80), head.encode() + body


async def run_load(job: LoadJob) -> dict[str, Any]:
    """``job.concurrency`` requests always in flight (each client sends its next request when
    the reply to its last one arrived), for ``duration_s`` or ``max_requests``, after a warm-up.
    Latency is send -> whole reply read, per request, at the client. A reply that is not a 200,
    or whose length differs from the first good reply's, or that never comes, is lost."""
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    state = {"issued": 0, "ok": 0, "late": 0, "lost": 0, "last": 0.0, "reply_len": -1}
    clock = time.perf_counter
    stack = contextlib.AsyncExitStack()
    senders: list[Callable[[], Awaitable[tuple[int, bytes]]]] = []
    async with stack:
        if job.client == "aiohttp":
            headers = {
                "Content-Type": "application/octet-stream",
                HEADER_LENGTH: str(job.header_length),
            }
            body, url = job.body, job.url
            session = await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(
                        limit=job.concurrency, limit_per_host=job.concurrency
                    ),
                    timeout=aiohttp.ClientTimeout(total=job.timeout_s),
                )
            )

            async def post() -> tuple[int, bytes]:
                async with session.post(url, data=body, headers=headers) as resp:
                    return resp.status, await resp.read()

            senders = [post] * job.concurrency
        elif job.client == "raw":
            host, port, raw = encode_http_request(job.url, job.body, job.header_length)
            conns = [await RawHttpConnection.open(host, port) for _ in range(job.concurrency)]
            for c in conns:
                stack.callback(c.close)

            def raw_sender(i: int) -> Callable[[], Awaitable[tuple[int, bytes]]]:
                async def send() -> tuple[int, bytes]:
                    if conns[i].closed:
                        conns[i] = await RawHttpConnection.open(host, port)
                    return await conns[i].request(raw)

                return send

            senders = [raw_sender(i) for i in range(job.concurrency)]

            async def watchdog() -> None:  # the raw client's request timeout
                while True:
                    await asyncio.sleep(min(0.5, job.timeout_s / 4))
                    now = clock()
                    for c in conns:
                        if c._waiter is not None and now - c.sent_at > job.timeout_s:
                            c.fail(TimeoutError(f"no reply within {job.timeout_s:g} s"))
                            c.close()

            dog = asyncio.create_task(watchdog())
            stack.callback(dog.cancel)
        else:
            raise ValueError(f"unknown client {job.client!r}")

        async def client(
            send: Callable[[], Awaitable[tuple[int, bytes]]], until: float, record: bool
        ) -> None:
            while True:
                if clock() >= until or (record and state["issued"] >= job.max_requests):
                    return
                if record:
                    state["issued"] += 1
                t0 = clock()
                try:
                    status, reply = await send()
                except Exception as exc:  # every request without an answer is lost
                    status, reply = -1, b""
                    errors[type(exc).__name__] += 1
                t1 = clock()
                if status == 200:
                    if state["reply_len"] < 0:
                        state["reply_len"] = len(reply)
                    elif len(reply) != state["reply_len"]:
                        status = -2
                        errors["reply of unexpected length"] += 1
                if not record:
                    continue
                if status != 200:
                    state["lost"] += 1
                    if status > 0:
                        errors[f"HTTP {status}"] += 1
                elif t1 <= until:
                    state["ok"] += 1
                    latencies.append(t1 - t0)
                    state["last"] = max(state["last"], t1)
                else:
                    state["late"] += 1  # answered, but after the window closed

        if job.warmup_s > 0:
            warm_until = clock() + job.warmup_s
            await asyncio.gather(*(client(send, warm_until, False) for send in senders))
            errors.clear()
        if job.start_at is not None:
            await asyncio.sleep(max(0.0, job.start_at - time.time()))
        server0 = process_cpu_seconds(job.server_pid) if job.server_pid else None
        busy0 = machine_busy_seconds()
        cpu0 = time.process_time()
        start = clock()
        until = start + job.duration_s
        await asyncio.gather(*(client(send, until, True) for send in senders))
        cpu1 = time.process_time()
        end = clock()
        server1 = process_cpu_seconds(job.server_pid) if job.server_pid else None
        busy1 = machine_busy_seconds()
    # Stopped by the request bound: the window ends at the last answer.
    elapsed = job.duration_s if state["issued"] < job.max_requests else state["last"] - start
    elapsed = max(elapsed, 1e-9)
    return {
        "issued": state["issued"],
        "answered": state["ok"],
        "answered_after_window": state["late"],
        "lost": state["lost"],
        "errors": dict(errors),
        "elapsed_s": elapsed,
        "rows_per_s": state["ok"] * job.rows_per_request / elapsed,
        "latencies_s": latencies,
        "client_cpu_s": cpu1 - cpu0,
        "client_wall_s": end - start,
        "server_cpu_cores": (
            (server1 - server0) / (end - start)
            if server0 is not None and server1 is not None
            else None
        ),
        "machine_busy_cores": (
            (busy1 - busy0) / (end - start) if busy0 is not None and busy1 is not None else None
        ),
    }


def run_http_job(job: LoadJob) -> dict[str, Any]:
    """A client process's job runner (``benchmarks.clients``): one share of the closed loop."""
    return asyncio.run(run_load(job))


def merge_load(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One figure from the shares of several client processes (timed over the same window)."""
    merged_errors: Counter[str] = Counter()
    for r in results:
        merged_errors.update(r["errors"])
    latencies = [x for r in results for x in r["latencies_s"]]
    return {
        "issued": sum(r["issued"] for r in results),
        "answered": sum(r["answered"] for r in results),
        "answered_after_window": sum(r["answered_after_window"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "errors": dict(merged_errors),
        "elapsed_s": max(r["elapsed_s"] for r in results),
        "rows_per_s": sum(r["rows_per_s"] for r in results),
        "latencies_s": latencies,
        "client_cpu_s": sum(r["client_cpu_s"] for r in results),
        "client_wall_s": max(r["client_wall_s"] for r in results),
        # Every process read the server and the machine over (almost) the same window: one
        # reading is enough.
        "server_cpu_cores": results[0]["server_cpu_cores"],
        "machine_busy_cores": results[0]["machine_busy_cores"],
    }


# -- servers --------------------------------------------------------------------------------


def _http(method: str, url: str, doc: Any = None, timeout_s: float = 60.0) -> tuple[int, Any]:
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _clean_env() -> dict[str, str]:
    """This environment without IOTGW_* variables: the gateway runs on its defaults plus the
    options given here, whatever the caller's shell sets."""
    return {k: v for k, v in os.environ.items() if not k.startswith("IOTGW_")}


def start_gateway(
    repo: Path,
    workdir: Path,
    timeout_s: float,
    *,
    tuner_args: Sequence[str] = ("--no-tuner",),  # the configurations compared are set here
    env: Mapping[str, str] | None = None,
    log_name: str = "gateway.log",
) -> tuple[ServerProcess, str]:
    """``iotgw serve`` over HTTP only (no broker to compete for the cores), ready to serve."""
    argv = python_argv(
        "gateway.cli",
        "serve",
        "--host",
        HOST,
        "--http-port",
        "0",
        "--model-repo",
        str(repo),
        "--cache-dir",
        str(workdir / "cache"),
        "--log-level",
        "INFO",
        "--no-mqtt",
        *tuner_args,
    )
    server = ServerProcess(argv, log_path=workdir / log_name, env={**_clean_env(), **(env or {})})
    try:
        port = int(server.wait_for_log(r"HTTP listening on http://[^:]+:(\d+)", timeout_s)[1])
        base = f"http://{HOST}:{port}"
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                status, _ = _http("GET", f"{base}/v2/health/ready", timeout_s=5)
                if status == 200:
                    break
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not get ready:\n{server.log_text()[-4000:]}")
            time.sleep(0.1)
    except BaseException:
        server.stop()
        raise
    return server, base


def set_knobs(base: str, model: str, knobs: dict[str, Any]) -> dict[str, Any]:
    status, doc = _http("PUT", f"{base}/admin/models/{model}/versions/1/knobs", knobs)
    if status != 200:
        raise RuntimeError(f"setting knobs {knobs} of {model} failed: HTTP {status} {doc}")
    return dict(doc["knobs"])


def start_echo(workdir: Path, timeout_s: float) -> tuple[ServerProcess, str]:
    server = ServerProcess(
        python_argv("benchmarks.http", "--serve-echo"),
        log_path=workdir / "echo.log",
        env=_clean_env(),
    )
    try:
        port = int(server.wait_for_log(ECHO_READY + r" (\d+)", timeout_s)[1])
    except BaseException:
        server.stop()
        raise
    return server, f"http://{HOST}:{port}"


def serve_echo(host: str = HOST, port: int = 0) -> None:
    """The bare aiohttp echo the gateway's round trip is held against: the same route shape,
    reads the whole body and sends it back with the same framing header. Nothing else."""

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {}
        length = request.headers.get(HEADER_LENGTH)
        if length is not None:
            headers[HEADER_LENGTH] = length
        return web.Response(body=body, content_type="application/octet-stream", headers=headers)

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/v2/models/{model}/versions/{version}/infer", echo)
        app.router.add_post("/v2/models/{model}/infer", echo)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"{ECHO_READY} {bound}", flush=True)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(run())


# -- the models and the in-process limit ----------------------------------------------------


@dataclass
class Model:
    name: str
    version: Any  # models.repository.ModelVersion
    input_name: str
    row_shape: tuple[int, ...]
    output_names: tuple[str, ...]
    max_batch_size: int
    slo_ms: float
    default_timeout_ms: float
    body: bytes = b""
    header_length: int = 0
    row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def inputs(self, rows: int, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((rows, *self.row_shape)).astype(np.float32)
        return {self.input_name: x}

    def batch_sizes(self, plan: Plan) -> list[int]:
        if plan.batch_sizes is not None:
            return [b for b in plan.batch_sizes if b <= self.max_batch_size]
        sizes = [2**i for i in range(int(math.log2(self.max_batch_size)) + 1)]
        if sizes[-1] != self.max_batch_size:
            sizes.append(self.max_batch_size)
        return sizes

    def url(self, base: str) -> str:
        return f"{base}/v2/models/{self.name}/versions/1/infer"


def build_repository(dest: Path) -> Path:
    """The demo repository's ``sensor_mlp`` and ``vision_cnn`` (same weights and configs as
    ``models.demo``), without the TensorFlow twins: serving those would load TensorFlow into
    the gateway, which costs memory and start-up time and has nothing to do with this figure."""
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    for demo in DEMO_MODELS:
        if demo.name in MODELS:
            write_model_version(demo, dest / demo.name / str(VERSION))
    return dest


def load_models(repo: Path) -> dict[str, Model]:
    from models.backends import load_runtime
    from models.repository import ModelVersion, scan_repository
    from models.runtime import Threads

    out: dict[str, Model] = {}
    for v in scan_repository(repo):
        if not isinstance(v, ModelVersion):
            raise RuntimeError(f"benchmark repository is broken: {v}")
        rt = load_runtime(v, Threads(1, 1))
        md = rt.metadata
        rt.close()
        (inp,) = md.inputs
        if inp.dtype != "float32":
            raise RuntimeError(f"{v.name}: the benchmark sends FP32, the model wants {inp.dtype}")
        model = Model(
            name=v.name,
            version=v,
            input_name=inp.name,
            row_shape=tuple(inp.shape[1:]),
            output_names=tuple(o.name for o in md.outputs),
            max_batch_size=v.config.max_batch_size,
            slo_ms=v.config.slo_ms,
            default_timeout_ms=v.config.batching.batch_timeout_ms,
        )
        model.row = model.inputs(1, seed=42)[model.input_name]
        model.body, model.header_length = encode_request(model.input_name, model.row)
        out[v.name] = model
    return {name: out[name] for name in MODELS}


class InprocessRunner:
    """``instances`` sessions of one model with ``intra`` intra-op threads each, run flat out
    from as many Python threads (ONNX Runtime releases the GIL while it computes)."""

    def __init__(self, model: Model, intra: int, instances: int) -> None:
        from models.backends import load_runtime
        from models.runtime import Threads

        self.model = model
        self.intra = intra
        self.runtimes = [load_runtime(model.version, Threads(intra, 1)) for _ in range(instances)]

    def rows_per_s(
        self, inputs: dict[str, np.ndarray], duration_s: float
    ) -> tuple[float, float, float | None]:
        """(rows/s, CPU cores this process used meanwhile, CPU cores other processes used
        meanwhile). Every instance runs at least one batch; the window ends when the last batch
        ends."""
        rows = next(iter(inputs.values())).shape[0]
        n = len(self.runtimes)
        counts = [0] * n
        ends = [0.0] * n
        barrier = threading.Barrier(n + 1)
        start_box: list[float] = []

        def work(i: int) -> None:
            rt = self.runtimes[i]
            barrier.wait()
            until = start_box[0] + duration_s
            calls = 0
            while True:
                rt.infer(inputs)
                calls += 1
                now = time.perf_counter()
                if now >= until:
                    break
            counts[i] = calls
            ends[i] = now

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        busy0 = machine_busy_seconds()
        cpu0 = time.process_time()
        start_box.append(time.perf_counter())
        barrier.wait()
        for t in threads:
            t.join()
        cpu1 = time.process_time()
        busy1 = machine_busy_seconds()
        elapsed = max(ends) - start_box[0]
        used = (cpu1 - cpu0) / elapsed
        others = None
        if busy0 is not None and busy1 is not None:
            others = max(0.0, (busy1 - busy0) / elapsed - used)
        return sum(counts) * rows / elapsed, used, others

    def call_latencies(self, inputs: dict[str, np.ndarray], count: int) -> list[float]:
        rt = self.runtimes[0]
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            rt.infer(inputs)
            out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        for rt in self.runtimes:
            rt.close()


# -- the benchmark --------------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return seconds * 1e3


def _load_figure(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs of one gateway/echo load configuration -> one ``runs`` entry."""
    pct = [percentiles([_ms(x) for x in r["latencies_s"]]) for r in results]
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    return {
        "rows_per_s": Repeated.of(r["rows_per_s"] for r in results),
        "requests_per_s": Repeated.of(r["answered"] / r["elapsed_s"] for r in results),
        "p50_ms": Repeated.of(p["p50"] for p in pct),
        "p95_ms": Repeated.of(p["p95"] for p in pct),
        "p99_ms": Repeated.of(p["p99"] for p in pct),
        "answered": sum(r["answered"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "errors": dict(errors),
        "client_cpu_cores": Repeated.of(r["client_cpu_s"] / r["client_wall_s"] for r in results),
        "server_cpu_cores": _repeated_or_none([r["server_cpu_cores"] for r in results]),
        # What other processes on the machine used meanwhile: the machine's busy cores minus
        # the server and the client.
        "other_processes_cpu_cores": _repeated_or_none(
            [
                max(
                    0.0,
                    r["machine_busy_cores"]
                    - r["server_cpu_cores"]
                    - r["client_cpu_s"] / r["client_wall_s"],
                )
                if r["machine_busy_cores"] is not None and r["server_cpu_cores"] is not None
                else None
                for r in results
            ]
        ),
    }


class Bench:
    def __init__(self, plan: Plan, workdir: Path, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.workdir = workdir
        self.log = log
        self.runs: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {"plan": asdict(plan)}
        self.clients: dict[int, ClientProcesses] = {}
        self.runners: dict[tuple[str, int, int], InprocessRunner] = {}
        self.gateway: ServerProcess | None = None
        self.echo: ServerProcess | None = None

    def close(self) -> None:
        for clients in self.clients.values():
            clients.close()
        for server in (self.gateway, self.echo):
            if server is not None:
                server.stop()
        for runner in self.runners.values():
            runner.close()

    # -- load on a server ---------------------------------------------------------------

    def load(
        self,
        *,
        url: str,
        model: Model,
        concurrency: int,
        setup: Setup,
        duration_s: float,
        warmup_s: float,
        max_requests: int | None = None,
        server: ServerProcess | None = None,
    ) -> dict[str, Any]:
        """One closed-loop run with ``setup`` = (client kind, processes); 0 processes: the
        client runs in this process."""
        kind, processes = setup
        max_requests = max_requests or self.plan.max_requests_per_run
        common: dict[str, Any] = {
            "url": url,
            "body": model.body,
            "header_length": model.header_length,
            "rows_per_request": 1,
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "timeout_s": self.plan.client_timeout_s,
            "server_pid": server.pid if server is not None else None,
            "client": kind,
        }
        if processes == 0:
            job = LoadJob(concurrency=concurrency, max_requests=max_requests, **common)
            return asyncio.run(run_load(job))
        if concurrency < processes:
            raise ValueError(f"{concurrency} clients cannot be split over {processes} processes")
        clients = self.clients.get(processes)
        if clients is None:
            clients = self.clients[processes] = ClientProcesses(processes, run_http_job)
        shares = [
            concurrency // processes + (i < concurrency % processes) for i in range(processes)
        ]
        # A common start, after every process has connected and warmed up.
        start_at = time.time() + warmup_s + 0.5
        jobs = [
            LoadJob(
                concurrency=share,
                max_requests=max(1, max_requests // processes),
                start_at=start_at,
                **common,
            )
            for share in shares
        ]
        timeout = warmup_s + duration_s + 60 + self.plan.client_timeout_s
        return merge_load(clients.run(jobs, timeout_s=timeout))

    # -- phase 1: the in-process limit ----------------------------------------------------

    def runner(self, model: Model, intra: int, instances: int) -> InprocessRunner:
        key = (model.name, intra, instances)
        if key not in self.runners:
            self.runners[key] = InprocessRunner(model, intra, instances)
        return self.runners[key]

    def inprocess_sweep(self, models: dict[str, Model]) -> dict[str, dict[str, Any]]:
        plan = self.plan
        cores = usable_cores()
        thread_configs = tuple(
            dict.fromkeys(plan.thread_configs or ((1, 1), (cores, 1), (1, cores), (1, cores + 1)))
        )
        self.config["thread_configs"] = thread_configs
        grid = [
            (m, intra, inst, b)
            for m in models.values()
            for intra, inst in thread_configs
            for b in m.batch_sizes(plan)
        ]
        inputs = {(m.name, b): m.inputs(b) for m, _, _, b in grid}
        self.log(f"in-process sweep: {len(grid)} configurations x {plan.repeats} runs")
        for m, intra, inst, b in grid:  # warm-up: sessions built, every shape seen once
            self.runner(m, intra, inst).rows_per_s(inputs[m.name, b], plan.inproc_warmup_s)
        rates: dict[tuple[str, int, int, int], list[float]] = {k: [] for k in grid_keys(grid)}
        used_cores: dict[tuple[str, int, int, int], list[float]] = {k: [] for k in grid_keys(grid)}
        for _ in range(plan.repeats):  # rounds: every configuration once per round
            for m, intra, inst, b in grid:
                rate, used, _ = self.runner(m, intra, inst).rows_per_s(
                    inputs[m.name, b], plan.inproc_run_s
                )
                rates[m.name, intra, inst, b].append(rate)
                used_cores[m.name, intra, inst, b].append(used)
        best: dict[str, dict[str, Any]] = {}
        for m in models.values():
            entries = []
            for (name, intra, inst, b), values in rates.items():
                if name != m.name:
                    continue
                r = Repeated.of(values)
                batch_ms = _ms(b * inst / r.median)
                entry: dict[str, Any] = {
                    "figure": "inprocess_limit_sweep",
                    "model": name,
                    "intra_op_threads": intra,
                    "instances": inst,
                    "batch_size": b,
                    "rows_per_s": r,
                    "batch_ms": batch_ms,
                    "cpu_cores": Repeated.of(used_cores[name, intra, inst, b]),
                }
                self.runs.append(entry)
                entries.append(entry)
            limit = max(entries, key=lambda e: e["rows_per_s"].median)
            # Batch sizes the gateway may use with the limit's threads and instances: those
            # whose batch costs at most a quarter of the SLO (queueing behind one batch and
            # filling the next must fit too).
            same = [
                e
                for e in entries
                if (e["intra_op_threads"], e["instances"])
                == (limit["intra_op_threads"], limit["instances"])
            ]
            budget = BATCH_SLO_FRACTION * m.slo_ms
            fitting = [e for e in same if e["batch_ms"] <= budget] or [
                min(same, key=lambda e: e["batch_ms"])
            ]
            best[m.name] = {
                "limit": limit,
                "fitting": sorted(fitting, key=lambda e: e["batch_size"]),
            }
            self.log(
                f"  {m.name}: limit {limit['rows_per_s'].median:,.0f} rows/s at batch "
                f"{limit['batch_size']} (intra {limit['intra_op_threads']}, instances "
                f"{limit['instances']}); batches within {budget:g} ms: "
                f"{[e['batch_size'] for e in fitting]}"
            )
        return best

    # -- phase 2 and 3: the gateway at saturation ------------------------------------------

    def knob_candidates(self, model: Model, best: dict[str, Any]) -> list[dict[str, Any]]:
        """Gateway knobs to try: the limit's intra-op threads; its instances, and one more
        (an instance with a batch ready while another waits for the event loop to hand it its
        next batch); the two largest batch sizes within the SLO budget (every batch pays a
        fixed cost in the gateway: the executor crossing and the event-loop round trips)."""
        limit = best["limit"]
        batches = [e["batch_size"] for e in best["fitting"]][-2:]
        out = []
        for conc in dict.fromkeys((limit["instances"], limit["instances"] + 1)):
            for b in batches:
                out.append(
                    {
                        "max_batch_size": b,
                        "batch_timeout_ms": model.default_timeout_ms,
                        "concurrency": conc,
                        "intra_op_threads": limit["intra_op_threads"],
                        "inter_op_threads": 1,
                    }
                )
        return out[-1:] if self.plan.quick else out

    def closed_loop_sizes(
        self, model: Model, knobs: dict[str, Any], limit_rate: float
    ) -> list[int]:
        """Requests in flight to try: enough that a full batch waits whenever an instance
        frees up ((instances + 1) x batch), and more; capped by Little's law so that waiting
        stays under half the SLO at the limit's rate."""
        b, inst = knobs["max_batch_size"], knobs["concurrency"]
        cap = self.closed_loop_cap(model, limit_rate)
        sizes = sorted({max(2, min(n, cap)) for n in ((inst + 1) * b, 2 * inst * b, 3 * inst * b)})
        if len(sizes) == 1 and cap >= 8:
            sizes.insert(0, cap // 4)
        return sizes[-1:] if self.plan.quick else sizes

    @staticmethod
    def closed_loop_cap(model: Model, limit_rate: float) -> int:
        return max(
            2, min(MAX_CLOSED_LOOP, int(CLOSED_LOOP_SLO_FRACTION * model.slo_ms / 1e3 * limit_rate))
        )

    def gateway_knob_sweep(
        self, base: str, models: dict[str, Model], best: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """The knobs the gateway saturates best with (raw client, N = (concurrency + 1) x
        batch): returns per model the knobs, as the gateway reports them."""
        plan = self.plan
        chosen: dict[str, dict[str, Any]] = {}
        for m in models.values():
            candidates = self.knob_candidates(m, best[m.name])
            cap = self.closed_loop_cap(m, best[m.name]["limit"]["rows_per_s"].median)
            self.log(f"gateway knob sweep {m.name}: {len(candidates)} configurations")
            results: list[list[dict[str, Any]]] = [[] for _ in candidates]
            applied: list[dict[str, Any]] = [{} for _ in candidates]
            for _ in range(plan.repeats):
                for i, knobs in enumerate(candidates):
                    applied[i] = set_knobs(base, m.name, knobs)
                    n = max(2, min(cap, (knobs["concurrency"] + 1) * knobs["max_batch_size"]))
                    results[i].append(
                        self.load(
                            url=m.url(base),
                            model=m,
                            concurrency=n,
                            setup=KNOB_SWEEP_SETUP,
                            duration_s=plan.gw_sweep_run_s,
                            warmup_s=plan.gw_warmup_s,
                            server=self.gateway,
                        )
                    )
            entries = []
            for knobs, rs in zip(applied, results, strict=True):
                fig = _load_figure(rs)
                n = max(2, min(cap, (knobs["concurrency"] + 1) * knobs["max_batch_size"]))
                entry: dict[str, Any] = {
                    "figure": "gateway_knob_sweep",
                    "model": m.name,
                    "knobs": knobs,
                    **_setup_fields(KNOB_SWEEP_SETUP),
                    "closed_loop_concurrency": n,
                    "slo_ms": m.slo_ms,
                    **fig,
                    "meets_slo": fig["lost"] == 0 and fig["p99_ms"].median <= m.slo_ms,
                }
                self.runs.append(entry)
                entries.append(entry)
                self.log(
                    f"  batch {knobs['max_batch_size']:3d} concurrency {knobs['concurrency']} "
                    f"N={n:3d}: {fig['rows_per_s'].median:9,.1f} rows/s  "
                    f"p99 {fig['p99_ms'].median:7.2f} ms  lost {fig['lost']}"
                )
            chosen[m.name] = self.pick(entries)["knobs"]
            self.config.setdefault("gateway_saturation_knobs", {})[m.name] = chosen[m.name]
        return chosen

    def gateway_saturation(
        self,
        base: str,
        models: dict[str, Model],
        best: dict[str, dict[str, Any]],
        gw_knobs: dict[str, dict[str, Any]],
    ) -> dict[str, list[dict[str, Any]]]:
        """Every (client setup, N) at the chosen knobs: returns per model the sweep entries."""
        plan = self.plan
        out: dict[str, list[dict[str, Any]]] = {}
        for m in models.values():
            knobs = set_knobs(base, m.name, gw_knobs[m.name])
            sizes = self.closed_loop_sizes(m, knobs, best[m.name]["limit"]["rows_per_s"].median)
            combos = [
                (setup, n) for setup in plan.client_setups for n in sizes if n >= max(setup[1], 1)
            ]
            self.log(f"gateway sweep {m.name}: knobs {knobs}; N in {sizes}")
            results: dict[tuple[Setup, int], list[dict[str, Any]]] = {c: [] for c in combos}
            for _ in range(plan.repeats):
                for setup, n in combos:
                    results[setup, n].append(
                        self.load(
                            url=m.url(base),
                            model=m,
                            concurrency=n,
                            setup=setup,
                            duration_s=plan.gw_sweep_run_s,
                            warmup_s=plan.gw_warmup_s,
                            server=self.gateway,
                        )
                    )
            entries = []
            for (setup, n), rs in results.items():
                fig = _load_figure(rs)
                entry: dict[str, Any] = {
                    "figure": "gateway_saturation_sweep",
                    "model": m.name,
                    **_setup_fields(setup),
                    "closed_loop_concurrency": n,
                    "offered": f"closed loop, {n} requests in flight",
                    "slo_ms": m.slo_ms,
                    "knobs": knobs,
                    **fig,
                    "meets_slo": fig["lost"] == 0 and fig["p99_ms"].median <= m.slo_ms,
                }
                self.runs.append(entry)
                entries.append(entry)
                self.log(
                    f"  {setup[0]:7s} x{max(setup[1], 1)} N={n:3d}: "
                    f"{fig['rows_per_s'].median:9,.1f} rows/s  p99 {fig['p99_ms'].median:7.2f} ms"
                    f"  lost {fig['lost']}"
                )
            out[m.name] = entries
        return out

    @staticmethod
    def pick(entries: list[dict[str, Any]], client: str | None = None) -> dict[str, Any]:
        """The fastest setup whose median p99 meets the SLO with nothing lost (the fastest of
        all when none does; the entry says so)."""
        pool = [e for e in entries if client is None or e["client_kind"] == client]
        ok = [e for e in pool if e["meets_slo"]]
        return max(ok or pool, key=lambda e: e["rows_per_s"].median)

    def paired_headline(
        self,
        base: str,
        models: dict[str, Model],
        best: dict[str, dict[str, Any]],
        gw_knobs: dict[str, dict[str, Any]],
        sweeps: dict[str, list[dict[str, Any]]],
    ) -> dict[str, dict[str, dict[str, Any]]]:
        """The ratio, from runs of the limit and of the gateway taken in turns: the fastest
        setup overall ("headline") and the fastest with the aiohttp client ("aiohttp")."""
        plan = self.plan
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for m in models.values():
            limit = best[m.name]["limit"]
            runner = self.runner(m, limit["intra_op_threads"], limit["instances"])
            inputs = m.inputs(limit["batch_size"])
            picks = {"headline": self.pick(sweeps[m.name])}
            aio = self.pick(sweeps[m.name], "aiohttp")
            if aio is not picks["headline"]:
                picks["aiohttp"] = aio
            knobs = set_knobs(base, m.name, gw_knobs[m.name])
            limit_rates: list[float] = []
            limit_cores: list[float] = []
            limit_others: list[float | None] = []
            gw_results: dict[str, list[dict[str, Any]]] = {k: [] for k in picks}
            runner.rows_per_s(inputs, plan.inproc_warmup_s)
            self.log(
                f"paired runs {m.name}: "
                + ", ".join(
                    f"{k}: {p['client']} N={p['closed_loop_concurrency']}" for k, p in picks.items()
                )
            )
            # Limit, gateway, limit, gateway, ..., limit: each round's limit is the mean of the
            # runs just before and just after its gateway runs, so that drifting background load
            # on a shared machine hits both sides of every pair alike.
            rate, used, others = runner.rows_per_s(inputs, plan.limit_headline_run_s)
            limit_rates.append(rate)
            limit_cores.append(used)
            limit_others.append(others)
            for _ in range(plan.headline_repeats):
                for key, p in picks.items():
                    gw_results[key].append(
                        self.load(
                            url=m.url(base),
                            model=m,
                            concurrency=p["closed_loop_concurrency"],
                            setup=(p["client_kind"], p["client_processes"]),
                            duration_s=plan.gw_headline_run_s,
                            warmup_s=plan.gw_warmup_s,
                            server=self.gateway,
                        )
                    )
                rate, used, others = runner.rows_per_s(inputs, plan.limit_headline_run_s)
                limit_rates.append(rate)
                limit_cores.append(used)
                limit_others.append(others)
            round_limit = [(a + b) / 2 for a, b in itertools.pairwise(limit_rates)]
            lim = Repeated.of(limit_rates)
            lim_per_core = Repeated.of(r / c for r, c in zip(limit_rates, limit_cores, strict=True))
            out[m.name] = {}
            for key, p in picks.items():
                fig = _load_figure(gw_results[key])
                pair_ratios = Repeated.of(
                    g["rows_per_s"] / li for g, li in zip(gw_results[key], round_limit, strict=True)
                )
                ratio = pair_ratios.median
                cpu = _cpu_efficiency(gw_results[key], lim_per_core)
                entry: dict[str, Any] = {
                    "figure": "throughput_ratio",
                    "model": m.name,
                    "headline": key == "headline",
                    "limit": {
                        "rows_per_s": lim,
                        "batch_size": limit["batch_size"],
                        "intra_op_threads": limit["intra_op_threads"],
                        "instances": limit["instances"],
                        "where": "this process, models.backends.load_runtime, no gateway",
                        "cpu_cores": Repeated.of(limit_cores),
                        "rows_per_cpu_s": lim_per_core,
                        "other_processes_cpu_cores": _repeated_or_none(limit_others),
                    },
                    "gateway": {
                        **_setup_fields((p["client_kind"], p["client_processes"])),
                        "closed_loop_concurrency": p["closed_loop_concurrency"],
                        "offered": p["offered"],
                        "rows_per_request": 1,
                        "knobs": knobs,
                        "slo_ms": m.slo_ms,
                        "setup_met_slo_in_sweep": p["meets_slo"],
                        **fig,
                    },
                    "ratio": ratio,
                    "ratio_how": "median over rounds of gateway rows/s / the mean of the limit "
                    "runs just before and after it",
                    "ratio_per_pair": pair_ratios,
                    "ratio_of_medians": fig["rows_per_s"].median / lim.median,
                    **cpu,
                }
                self.runs.append(entry)
                out[m.name][key] = entry
                self.log(
                    f"  {m.name} ({p['client']}): gateway {fig['rows_per_s'].median:,.1f} / "
                    f"limit {lim.median:,.1f} rows/s: ratio {ratio:.3f} (median of rounds)"
                )
            out[m.name].setdefault("aiohttp", out[m.name]["headline"])
        return out

    # -- phase 4: low load ----------------------------------------------------------------

    def low_load(self, base: str, echo_base: str, model: Model) -> dict[str, dict[str, Any]]:
        """One sequential client, echo and gateway in turns, per client kind."""
        plan = self.plan
        knobs = set_knobs(
            base,
            model.name,
            {
                "batch_timeout_ms": 0,
                "concurrency": 1,
                "intra_op_threads": 1,
                "inter_op_threads": 1,
            },
        )
        self.config["low_load_knobs"] = knobs
        runner = self.runner(model, 1, 1)
        one_row = {model.input_name: model.row}
        runner.call_latencies(one_row, 200)  # warm-up
        kinds = ("aiohttp", "raw")
        echo_runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        gw_runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        gw_server: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        rt_runs: list[list[float]] = []
        for _ in range(plan.headline_repeats):
            for kind in kinds:
                for url, server in (
                    (model.url(echo_base), self.echo),
                    (model.url(base), self.gateway),
                ):
                    r = self.load(
                        url=url,
                        model=model,
                        concurrency=1,
                        setup=(kind, 0),
                        duration_s=120.0,
                        warmup_s=plan.low_warmup_s,
                        max_requests=plan.low_requests,
                        server=server,
                    )
                    if server is self.echo:
                        echo_runs[kind].append(r)
                        continue
                    gw_runs[kind].append(r)
                    status, stats = _http(
                        "GET",
                        f"{base}/admin/models/{model.name}/versions/1/stats"
                        f"?window_s={max(1.0, r['elapsed_s'])}",
                    )
                    if status == 200:
                        gw_server[kind].append(stats)
            rt_runs.append(runner.call_latencies(one_row, plan.low_requests))
        rt_p = [percentiles([_ms(x) for x in lat]) for lat in rt_runs]
        runtime: dict[str, Any] = {
            "intra_op_threads": 1,
            "p50_ms": Repeated.of(p["p50"] for p in rt_p),
            "p99_ms": Repeated.of(p["p99"] for p in rt_p),
        }
        out = {}
        for kind in kinds:
            echo = _load_figure(echo_runs[kind])
            gw = _load_figure(gw_runs[kind])
            server_side = gw_server[kind]
            entry: dict[str, Any] = {
                "figure": "low_load_latency",
                "model": model.name,
                "headline": kind == "aiohttp",
                **_setup_fields((kind, 0)),
                "offered": "one sequential client (next request sent when the reply is in)",
                "requests_per_run": plan.low_requests,
                "request_body_bytes": len(model.body),
                "echo": {"where": "separate process, same machine, loopback", **echo},
                "gateway": {"where": "separate process (iotgw serve)", "knobs": knobs, **gw},
                "gateway_server_side": {
                    "p50_ms": (
                        Repeated.of(s["p50_ms"] for s in server_side) if server_side else None
                    ),
                    "p99_ms": (
                        Repeated.of(s["p99_ms"] for s in server_side) if server_side else None
                    ),
                    "what": "the gateway's own /stats: service entry -> result, no HTTP, codec",
                },
                "inprocess_runtime_batch1": runtime,
                "p50_overhead_ms": _paired_diff(gw["p50_ms"], echo["p50_ms"]),
                "p99_overhead_ms": _paired_diff(gw["p99_ms"], echo["p99_ms"]),
            }
            self.runs.append(entry)
            out[kind] = entry
            self.log(
                f"  {kind}: echo p50 {echo['p50_ms'].median:.3f} ms, gateway p50 "
                f"{gw['p50_ms'].median:.3f} ms, overhead {entry['p50_overhead_ms'].median:.3f} "
                f"ms (runtime batch 1: {runtime['p50_ms'].median:.3f} ms)"
            )
        return out


def _repeated_or_none(values: Sequence[float | None]) -> Repeated | None:
    if not values or any(v is None for v in values):
        return None
    return Repeated.of(v for v in values if v is not None)


def _cpu_efficiency(results: Sequence[dict[str, Any]], limit_per_core: Repeated) -> dict[str, Any]:
    """Rows per CPU-second, gateway against limit. On a machine that other work shares, the
    wall-clock ratio moves with whatever else runs; the CPU each row costs does much less, and
    says what the ratio would be where the cores are all ours and all busy."""
    if any(r["server_cpu_cores"] is None for r in results):
        return {}
    server = Repeated.of(r["rows_per_s"] / max(r["server_cpu_cores"], 1e-9) for r in results)
    both = Repeated.of(
        r["rows_per_s"] / max(r["server_cpu_cores"] + r["client_cpu_s"] / r["client_wall_s"], 1e-9)
        for r in results
    )
    return {
        "gateway_rows_per_server_cpu_s": server,
        "gateway_rows_per_cpu_s_with_client": both,
        "cpu_efficiency_ratio": both.median / limit_per_core.median,
        "cpu_efficiency_ratio_server_only": server.median / limit_per_core.median,
    }


def _paired_diff(a: Repeated, b: Repeated) -> Repeated:
    return Repeated.of(x - y for x, y in zip(a.values, b.values, strict=True))


def grid_keys(grid: Sequence[tuple[Model, int, int, int]]) -> list[tuple[str, int, int, int]]:
    return [(m.name, intra, inst, b) for m, intra, inst, b in grid]


def _setup_fields(setup: Setup) -> dict[str, Any]:
    kind, processes = setup
    what = {"aiohttp": "aiohttp client", "raw": "raw asyncio HTTP/1.1 client"}[kind]
    where = "in the benchmark process" if processes == 0 else f"split over {processes} processes"
    return {"client": f"{what}, {where}", "client_kind": kind, "client_processes": processes}


def check_replies(base: str, models: dict[str, Model]) -> dict[str, float]:
    """The gateway answers what the runtime computes (one request per model)."""
    from models.backends import load_runtime
    from models.runtime import Threads

    diffs = {}
    for m in models.values():
        req = urllib.request.Request(
            m.url(base),
            data=m.body,
            method="POST",
            headers={
                "Content-Type": "application/octet-stream",
                HEADER_LENGTH: str(m.header_length),
            },
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            length = resp.headers.get(HEADER_LENGTH)
            got = decode_response(resp.read(), int(length) if length else None)
        rt = load_runtime(m.version, Threads(1, 1))
        want = rt.infer({m.input_name: m.row})
        rt.close()
        worst = 0.0
        for name in m.output_names:
            if got[name].shape != want[name].shape:
                raise AssertionError(
                    f"{m.name}.{name}: shape {got[name].shape} != {want[name].shape}"
                )
            worst = max(worst, float(np.max(np.abs(got[name] - want[name]))))
        if worst > 1e-4:
            raise AssertionError(f"{m.name}: gateway and runtime differ by {worst}")
        diffs[m.name] = worst
    return diffs


def _client_short(r: dict[str, Any]) -> str:
    procs = r["client_processes"]
    return f"{r['client_kind']}" + (f" x{procs} procs" if procs else "")


def print_tables(runs: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    sweep = [r for r in runs if r["figure"] == "inprocess_limit_sweep"]
    print("\nIn-process runtime (the limit): rows/s, median [min-max]")
    print(
        format_table(
            ["model", "intra", "inst", "batch", "rows/s", "batch ms", "cores"],
            [
                [
                    r["model"],
                    r["intra_op_threads"],
                    r["instances"],
                    r["batch_size"],
                    fmt_repeated(r["rows_per_s"]),
                    r["batch_ms"],
                    r["cpu_cores"].median,
                ]
                for r in sweep
            ],
        )
    )
    kns = [r for r in runs if r["figure"] == "gateway_knob_sweep"]
    print(
        "\nGateway knobs at saturation (raw client, N = (concurrency + 1) x batch): "
        "median [min-max]"
    )
    print(
        format_table(
            ["model", "batch", "conc", "intra", "N", "rows/s", "p99 ms", "lost", "srv cores"],
            [
                [
                    r["model"],
                    r["knobs"]["max_batch_size"],
                    r["knobs"]["concurrency"],
                    r["knobs"]["intra_op_threads"],
                    r["closed_loop_concurrency"],
                    fmt_repeated(r["rows_per_s"]),
                    fmt_repeated(r["p99_ms"]),
                    r["lost"],
                    r["server_cpu_cores"].median if r["server_cpu_cores"] else float("nan"),
                ]
                for r in kns
            ],
        )
    )
    gws = [r for r in runs if r["figure"] == "gateway_saturation_sweep"]
    print("\nGateway at saturation, sweep (1 row per request, closed loop): median [min-max]")
    print(
        format_table(
            [
                "model",
                "client",
                "N",
                "rows/s",
                "p50 ms",
                "p99 ms",
                "lost",
                "srv cores",
                "cli cores",
            ],
            [
                [
                    r["model"],
                    _client_short(r),
                    r["closed_loop_concurrency"],
                    fmt_repeated(r["rows_per_s"]),
                    fmt_repeated(r["p50_ms"]),
                    fmt_repeated(r["p99_ms"]),
                    r["lost"],
                    r["server_cpu_cores"].median if r["server_cpu_cores"] else float("nan"),
                    r["client_cpu_cores"].median,
                ]
                for r in gws
            ],
        )
    )
    heads = [r for r in runs if r["figure"] == "throughput_ratio"]
    print("\nThroughput, limit and gateway in turns (L G L G ... L): median [min-max]")
    print(
        format_table(
            [
                "model",
                "client",
                "N",
                "limit rows/s",
                "gateway rows/s",
                "ratio (rounds)",
                "ratio of medians",
                "gw p99 ms",
                "lost",
                "CPU ratio",
                "CPU ratio srv",
                "others L/G",
            ],
            [
                [
                    r["model"] + (" *" if r["headline"] else ""),
                    _client_short(r["gateway"]),
                    r["gateway"]["closed_loop_concurrency"],
                    fmt_repeated(r["limit"]["rows_per_s"]),
                    fmt_repeated(r["gateway"]["rows_per_s"]),
                    fmt_repeated(r["ratio_per_pair"]),
                    r["ratio_of_medians"],
                    fmt_repeated(r["gateway"]["p99_ms"]),
                    r["gateway"]["lost"],
                    r.get("cpu_efficiency_ratio", float("nan")),
                    r.get("cpu_efficiency_ratio_server_only", float("nan")),
                    _others(r["limit"]) + "/" + _others(r["gateway"]),
                ]
                for r in heads
            ],
        )
    )
    print(
        "(* the headline setup: the fastest that met the SLO with nothing lost. CPU ratio: "
        "gateway rows per CPU-second of server + client, over the limit's rows per CPU-second; "
        "srv: server CPU only. others: CPU cores that other processes on the machine used "
        "during the limit / gateway runs)"
    )
    for r in (r for r in runs if r["figure"] == "low_load_latency"):
        print(
            f"\nLow load, {r['model']}, one sequential {r['client_kind']} client: "
            "ms, median [min-max]" + ("  (headline)" if r["headline"] else "")
        )
        rt = r["inprocess_runtime_batch1"]
        rows = [
            [
                "bare aiohttp echo",
                fmt_repeated(r["echo"]["p50_ms"]),
                fmt_repeated(r["echo"]["p99_ms"]),
                r["echo"]["lost"],
            ],
            [
                "gateway",
                fmt_repeated(r["gateway"]["p50_ms"]),
                fmt_repeated(r["gateway"]["p99_ms"]),
                r["gateway"]["lost"],
            ],
            [
                "gateway - echo (paired)",
                fmt_repeated(r["p50_overhead_ms"]),
                fmt_repeated(r["p99_overhead_ms"]),
                "-",
            ],
            [
                "in-process runtime, batch 1",
                fmt_repeated(rt["p50_ms"]),
                fmt_repeated(rt["p99_ms"]),
                "-",
            ],
        ]
        server = r["gateway_server_side"]
        if server["p50_ms"] is not None:
            rows.append(
                [
                    "gateway server-side (/stats)",
                    fmt_repeated(server["p50_ms"]),
                    fmt_repeated(server["p99_ms"]),
                    "-",
                ]
            )
        print(format_table(["", "p50", "p99", "lost"], rows))
    print("\nSummary")
    print(format_table(["figure", "value"], [[k, v] for k, v in summary.items()]))


def _median_or_none(part: dict[str, Any]) -> float | None:
    r = part.get("other_processes_cpu_cores")
    return None if r is None else r.median


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _others(part: dict[str, Any]) -> str:
    r = part.get("other_processes_cpu_cores")
    return "-" if r is None else f"{r.median:.2f}"


def _lost(runs: list[dict[str, Any]]) -> int:
    total = 0
    for r in runs:
        total += int(r.get("lost", 0))
        for part in ("gateway", "echo"):
            if isinstance(r.get(part), dict):
                total += int(r[part].get("lost", 0))
    return total


def run(plan: Plan, out_dir: Path | None) -> Path:
    created = now_iso()
    machine = machine_info()
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="iotgw-bench-http-"))
    bench = Bench(plan, workdir, log)
    try:
        repo = build_repository(workdir / "repo")
        models = load_models(repo)
        log(f"starting the gateway (repository {repo})")
        bench.gateway, base = start_gateway(repo, workdir, plan.startup_timeout_s)
        bench.config["gateway"] = {
            "argv": bench.gateway.argv,
            "where": "separate process on the same machine, loopback",
            "repository": "models.demo's sensor_mlp and vision_cnn (ONNX), same weights/config",
        }
        diffs = check_replies(base, models)
        log(f"gateway replies match the runtime (max abs diff {diffs})")
        best = bench.inprocess_sweep(models)
        gw_knobs = bench.gateway_knob_sweep(base, models, best)
        sweeps = bench.gateway_saturation(base, models, best, gw_knobs)
        heads = bench.paired_headline(base, models, best, gw_knobs, sweeps)
        log("low load")
        bench.echo, echo_base = start_echo(workdir, plan.startup_timeout_s)
        low = bench.low_load(base, echo_base, models[LOW_LOAD_MODEL])
    finally:
        bench.close()
        shutil.rmtree(workdir, ignore_errors=True)

    mlp, cnn = heads["sensor_mlp"], heads["vision_cnn"]
    lo, lo_raw = low["aiohttp"], low["raw"]
    summary = {
        "cnn_throughput_ratio": round(cnn["headline"]["ratio"], 4),
        "p50_overhead_ms": round(lo["p50_overhead_ms"].median, 4),
        "mlp_throughput_ratio": round(mlp["headline"]["ratio"], 5),
        "cnn_throughput_ratio_aiohttp_client": round(cnn["aiohttp"]["ratio"], 4),
        "mlp_throughput_ratio_aiohttp_client": round(mlp["aiohttp"]["ratio"], 5),
        "cnn_client": cnn["headline"]["gateway"]["client"],
        "mlp_client": mlp["headline"]["gateway"]["client"],
        "cnn_limit_rows_per_s": round(cnn["headline"]["limit"]["rows_per_s"].median, 1),
        "cnn_gateway_rows_per_s": round(cnn["headline"]["gateway"]["rows_per_s"].median, 1),
        "mlp_limit_rows_per_s": round(mlp["headline"]["limit"]["rows_per_s"].median, 1),
        "mlp_gateway_rows_per_s": round(mlp["headline"]["gateway"]["rows_per_s"].median, 1),
        "cnn_cpu_efficiency_ratio": _round(cnn["headline"].get("cpu_efficiency_ratio"), 4),
        "cnn_cpu_efficiency_ratio_server_only": _round(
            cnn["headline"].get("cpu_efficiency_ratio_server_only"), 4
        ),
        "cnn_other_processes_cpu_cores_limit_gateway": [
            _round(_median_or_none(cnn["headline"]["limit"]), 3),
            _round(_median_or_none(cnn["headline"]["gateway"]), 3),
        ],
        "p99_overhead_ms": round(lo["p99_overhead_ms"].median, 4),
        "echo_p50_ms": round(lo["echo"]["p50_ms"].median, 4),
        "gateway_p50_ms": round(lo["gateway"]["p50_ms"].median, 4),
        "p50_overhead_ms_raw_client": round(lo_raw["p50_overhead_ms"].median, 4),
        "mlp_runtime_batch1_p50_ms": round(lo["inprocess_runtime_batch1"]["p50_ms"].median, 4),
        "lost_requests_headline": sum(
            int(e["gateway"]["lost"])
            for h in heads.values()
            for e in {id(e): e for e in h.values()}.values()
        )
        + int(lo["gateway"]["lost"])
        + int(lo["echo"]["lost"]),
        "lost_requests_all_runs": _lost(bench.runs),
        "runs_per_figure": min(plan.repeats, plan.headline_repeats),
        "meets_cnn_ratio_target_0_85": cnn["headline"]["ratio"] >= 0.85,
        "meets_p50_overhead_target_1ms": lo["p50_overhead_ms"].median <= 1.0,
    }
    bench.config.update(
        {
            "models": {
                m.name: {
                    "runtime": m.version.config.runtime,
                    "max_batch_size": m.max_batch_size,
                    "slo_ms": m.slo_ms,
                    "request_body_bytes": len(m.body),
                    "rows_per_request": 1,
                }
                for m in models.values()
            },
            "protocol": "OIP v2 binary tensor extension: JSON header + raw FP32, "
            "binary_data_output=true, HTTP/1.1 keep-alive, loopback",
            "limit": "models.backends.load_runtime in this process; best of "
            "(intra-op threads, instances) x batch sizes",
            "gateway_knob_rule": "the limit's intra-op threads; concurrency = the limit's "
            "instances or one more; the two largest batch sizes whose in-process batch costs "
            f"<= {BATCH_SLO_FRACTION} x SLO; the fastest of these four (raw client, "
            "N = (concurrency + 1) x batch) meeting the SLO with nothing lost",
            "closed_loop_rule": "N in {(instances + 1), 2 x instances, 3 x instances} x batch, "
            "capped at "
            f"{CLOSED_LOOP_SLO_FRACTION} x SLO x limit rows/s and {MAX_CLOSED_LOOP}",
            "choice": "fastest (client setup, N) whose median p99 <= SLO with nothing lost",
            "clients": {
                "aiohttp": "aiohttp.ClientSession, body and headers built once",
                "raw": "RawHttpConnection: asyncio protocol, whole request pre-encoded once, "
                "checks status and Content-Length",
            },
            "cores_shared": "client, gateway and in-process runs share this machine's cores "
            "(and whatever else runs on it: see the load averages)",
            "wall_s": round(time.monotonic() - t_start, 1),
        }
    )
    path = write_results(
        NAME,
        quick=plan.quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=bench.runs,
        config=bench.config,
        created=created,
    )
    print_tables(bench.runs, summary)
    print(f"\nwrote {path}")
    return path


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir)
    return 0


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http", description=__doc__)
    p.add_argument("--quick", action="store_true", help="seconds, to check it still works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_echo:
        serve_echo()
        return 0
    return main(quick=args.quick, out_dir=args.out)


if __name__ == "__main__":
    sys.exit(_cli())
