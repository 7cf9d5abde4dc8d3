"""A test device speaking the MQTT wire contract of docs/mqtt.md: MQTT 5 (Response Topic +
Correlation Data) or MQTT 3.1.1 (reply topic per device, matched by ``id``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.gateway.helpers import GENEROUS_TIMEOUT_US, json_request

NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


def framed_binary_request(inputs: Mapping[str, np.ndarray], *, id: str) -> bytes:
    header = json.dumps(
        {
            "id": id,
            "inputs": [
                {
                    "name": n,
                    "datatype": "FP32",
                    "shape": list(a.shape),
                    "parameters": {"binary_data_size": a.nbytes},
                }
                for n, a in inputs.items()
            ],
            "parameters": {"timeout": GENEROUS_TIMEOUT_US},
        }
    ).encode()
    raw = b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in inputs.values())
    return b"OIPB" + struct.pack("<I", len(header)) + header + raw


def decode_reply(payload: bytes) -> dict[str, Any]:
    """The reply as a dict; binary outputs are turned into ``data`` lists."""
    if not payload.startswith(b"OIPB"):
        return json.loads(payload)
    (length,) = struct.unpack_from("<I", payload, 4)
    head = json.loads(payload[8 : 8 + length])
    binary = payload[8 + length :]
    offset = 0
    for out in head["outputs"]:
        size = out["parameters"]["binary_data_size"]
        out["data"] = np.frombuffer(binary[offset : offset + size], dtype="<f4").tolist()
        offset += size
    return head


def outputs_of(reply: dict[str, Any]) -> dict[str, np.ndarray]:
    return {
        o["name"]: np.asarray(o["data"], dtype=np.float32).reshape(o["shape"])
        for o in reply["outputs"]
    }


def response_topic(prefix: str, model: str, device_id: str) -> str:
    """The Response Topic an MQTT 5 device names: under its own reply topic (docs/mqtt.md)."""
    return f"{prefix}/infer/{model}/res/{device_id}/r"


class Device:
    """One device with its own client id; ``request`` publishes and waits for its reply."""

    def __init__(self, client: aiomqtt.Client, device_id: str, v5: bool, prefix: str) -> None:
        self.client = client
        self.device_id = device_id
        self.v5 = v5
        self.prefix = prefix
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.replies: list[tuple[str | None, dict[str, Any]]] = []  # (key, reply) of every reply
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Its reply namespace: the per-device reply topic (MQTT 3.1.1, or a gateway that speaks
        # MQTT 3.1.1 to the broker and so never sees the Response Topic) and, below it, the
        # Response Topic an MQTT 5 device names.
        await self.client.subscribe(f"{self.prefix}/infer/+/res/{self.device_id}/#", qos=1)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _read(self) -> None:
        async for message in self.client.messages:
            assert isinstance(message.payload, bytes)
            reply = decode_reply(message.payload)
            correlation = getattr(message.properties, "CorrelationData", None)
            key = correlation.decode() if correlation is not None else reply.get("id")
            self.replies.append((key, reply))
            future = self._waiting.pop(key, None) if key is not None else None
            if future is not None and not future.done():
                future.set_result(reply)

    async def publish(
        self, model: str, payload: bytes, key: str, *, qos: int = 1
    ) -> asyncio.Future[Any]:
        """Publish a request whose reply is matched by ``key`` (Correlation Data, or ``id``)."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        properties = None
        if self.v5:
            properties = Properties(PacketTypes.PUBLISH)
            properties.ResponseTopic = response_topic(self.prefix, model, self.device_id)
            properties.CorrelationData = key.encode()
        await self.client.publish(
            f"{self.prefix}/infer/{model}/req/{self.device_id}",
            payload,
            qos=qos,
            properties=properties,
        )
        return future

    async def request(self, model: str, payload: bytes, key: str) -> dict[str, Any]:
        future = await self.publish(model, payload, key)
        return await asyncio.wait_for(future, 30)


@contextlib.asynccontextmanager
async def device(
    port: int,
    device_id: str,
    *,
    v5: bool = True,
    prefix: str = "iotgw",
    password: str | None = None,
) -> AsyncIterator[Device]:
    """A connected device; with ``password`` it authenticates as user ``device_id``."""
    client = aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=device_id,
        username=device_id if password is not None else None,
        password=password,
        protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        socket_options=NODELAY,
        max_inflight_messages=1000,
    )
    async with client:
        dev = Device(client, device_id, v5, prefix)
        await dev.start()
        try:
            yield dev
        finally:
            await dev.stop()


def json_payload(inputs: Mapping[str, np.ndarray], id: str) -> bytes:
    return json.dumps(json_request(inputs, id=id)).encode()


async def flood(
    port: int, model: str, inputs: Mapping[str, np.ndarray], *, requests: int, device_id: str
) -> list[dict[str, Any]]:
    """``requests`` published back to back at QoS 1 by one MQTT 3.1.1 device (each with a
    generous deadline, so that only the gateway's bounds can refuse one), then every reply."""
    async with device(port, device_id, v5=False) as dev:
        futures = []
        for i in range(requests):
            body = json.loads(json_payload(inputs, f"flood-{i}"))
            body["parameters"] = {"timeout": GENEROUS_TIMEOUT_US}
            futures.append(await dev.publish(model, json.dumps(body).encode(), body["id"]))
        return [await asyncio.wait_for(f, 30) for f in futures]


@contextlib.asynccontextmanager
async def mqtt_gateway(repo: Path, cache_dir: Path, **mqtt: Any) -> AsyncIterator[Gateway]:
    """An in-process gateway serving ``repo`` over HTTP (a free port) and MQTT (``mqtt``
    settings: at least ``broker``), yielded once its models are loaded and it is subscribed."""
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": cache_dir},
        mqtt={"reconnect_min_s": 0.05, **mqtt},
    )
    async with Gateway(settings) as gateway:
        await gateway.wait_loaded()
        assert gateway.mqtt is not None
        await asyncio.wait_for(gateway.mqtt.connected.wait(), 30)
        yield gateway
