"""Stand-ins for the gateway with a known, fixed service time, written from docs/mqtt.md and the
Open Inference Protocol alone (they share no code with device_sim, so a misreading of the
contract on either side shows up as a failing test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from collections import Counter
from typing import Any

import aiomqtt
from aiohttp import web
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

_SUCCESS_OUTPUT = {"name": "y", "datatype": "FP32", "shape": [1, 1]}


def parse_request(payload: bytes) -> tuple[dict[str, Any], bytes, bool]:
    """(JSON header, binary section, was binary) of an MQTT request payload."""
    if payload.startswith(b"OIPB"):
        (n,) = struct.unpack_from("<I", payload, 4)
        return json.loads(payload[8 : 8 + n]), payload[8 + n :], True
    return json.loads(payload), b"", False


def success_reply(model: str, request_id: str | None, binary: bool) -> bytes:
    body: dict[str, Any] = {"model_name": model, "model_version": "1", "status": 200}
    if request_id is not None:
        body["id"] = request_id
    if not binary:
        body["outputs"] = [{**_SUCCESS_OUTPUT, "data": [0.5]}]
        return json.dumps(body).encode()
    raw = struct.pack("<f", 0.5)
    body["outputs"] = [{**_SUCCESS_OUTPUT, "parameters": {"binary_data_size": len(raw)}}]
    header = json.dumps(body).encode()
    return b"OIPB" + struct.pack("<I", len(header)) + header + raw


def error_reply(request_id: str | None, status: int, reason: str) -> bytes:
    body = {"id": request_id, "status": status, "error": f"test {reason}", "reason": reason}
    return json.dumps(body).encode()


class MqttResponder:
    """Subscribes to every request, waits ``service_s``, answers per docs/mqtt.md.

    ``drop_every=k`` leaves every k-th request received unanswered; ``error_every=k`` answers
    every k-th with a ``queue_full`` error instead. ``seen`` counts requests per device id;
    ``stamps`` holds, per request id, ``time.perf_counter()`` when the request was taken and
    just before its reply was published (the simulator's clock: both run in one process)."""

    def __init__(
        self,
        port: int,
        *,
        service_s: float = 0.02,
        drop_every: int = 0,
        error_every: int = 0,
        prefix: str = "iotgw",
        answer_twice: bool = False,
        v5: bool = True,
    ) -> None:
        self.port = port
        self.v5 = v5
        self.service_s = service_s
        self.drop_every = drop_every
        self.error_every = error_every
        self.prefix = prefix
        self.answer_twice = answer_twice
        self.received = 0
        self.dropped = 0
        self.errors = 0
        self.seen: Counter[str] = Counter()
        self.stamps: dict[str, tuple[float, float]] = {}
        self.binary_requests = 0
        self._stack = contextlib.AsyncExitStack()
        # With answer_twice, the two copies of a reply leave back to back, never interleaved
        # with another request's: whoever reads them in order sees each duplicate next to its
        # first copy.
        self._pair = asyncio.Lock()

    async def __aenter__(self) -> MqttResponder:
        client = aiomqtt.Client(
            "127.0.0.1",
            self.port,
            identifier="test-responder",
            protocol=aiomqtt.ProtocolVersion.V5 if self.v5 else aiomqtt.ProtocolVersion.V311,
            # Like any MQTT peer here: without it Nagle's algorithm delays replies by ~40 ms.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        self._client = await self._stack.enter_async_context(client)
        await client.subscribe(f"{self.prefix}/infer/+/req/+", qos=1)
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._reader = self._tasks.create_task(self._serve())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._reader.cancel()
        await self._stack.aclose()

    async def _serve(self) -> None:
        async for message in self._client.messages:
            taken = time.perf_counter()
            self.received += 1
            _, _, model, _, device = str(message.topic).split("/")
            self.seen[device] += 1
            if self.drop_every and self.received % self.drop_every == 0:
                self.dropped += 1
                continue
            error = bool(self.error_every and self.received % self.error_every == 0)
            self._tasks.create_task(self._answer(message, model, device, error, taken))

    async def _answer(
        self, message: aiomqtt.Message, model: str, device: str, error: bool, taken: float
    ) -> None:
        await asyncio.sleep(self.service_s)
        payload = bytes(message.payload)
        header, _, binary = parse_request(payload)
        self.binary_requests += binary
        request_id = header.get("id")
        self.stamps[str(request_id)] = (taken, time.perf_counter())
        if error:
            self.errors += 1
            body = error_reply(request_id, 503, "queue_full")
        else:
            body = success_reply(model, request_id, binary)
        props_in = message.properties
        response_topic = getattr(props_in, "ResponseTopic", None) if props_in else None
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [("status", "503" if error else "200")]
        if response_topic:
            props.CorrelationData = props_in.CorrelationData  # type: ignore[union-attr]
            topic = response_topic
        else:
            topic = f"{self.prefix}/infer/{model}/res/{device}"
        async with self._pair:
            for _ in range(2 if self.answer_twice else 1):
                await self._client.publish(
                    topic, body, qos=1, properties=props if self.v5 else None
                )


COUNTS = web.AppKey("counts", Counter)
# Per request id: time.perf_counter() when the request was read and when its reply was ready.
STAMPS = web.AppKey("stamps", dict)
METADATA = {
    "name": "toy",
    "versions": ["1"],
    "platform": "onnxruntime_onnx",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
}


def http_app(service_s: float = 0.02, error_every: int = 0) -> web.Application:
    """``GET /v2/models/toy`` and ``POST /v2/models/{m}/infer`` with a fixed service time."""
    counts = Counter[str]()
    stamps: dict[str, tuple[float, float]] = {}

    async def metadata(request: web.Request) -> web.Response:
        if request.match_info["model"] != "toy":
            return web.json_response({"error": "unknown model"}, status=404)
        return web.json_response(METADATA)

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        taken = time.perf_counter()
        counts["received"] += 1
        n = counts["received"]  # this request's number; the counter moves on during the sleep
        header_length = request.headers.get("Inference-Header-Content-Length")
        header = json.loads(body[: int(header_length)] if header_length else body)
        await asyncio.sleep(service_s)
        if error_every and n % error_every == 0:
            return web.json_response({"error": "queue full"}, status=503)
        x = header["inputs"][0]
        assert x["name"] == "x" and x["datatype"] == "FP32" and x["shape"] == [1, 4]
        stamps[str(header.get("id"))] = (taken, time.perf_counter())
        return web.json_response(
            {
                "model_name": request.match_info["model"],
                "id": header.get("id"),
                "outputs": [{**_SUCCESS_OUTPUT, "data": [0.5]}],
            }
        )

    app = web.Application()
    app[COUNTS] = counts
    app[STAMPS] = stamps
    app.router.add_get("/v2/models/{model}", metadata)
    app.router.add_post("/v2/models/{model}/infer", infer)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> Any:
    """Run ``app`` on a free loopback port; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
