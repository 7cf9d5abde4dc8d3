"""Just enough MQTT 3.1.1 framing for the tests' own minimal brokers: the conditions they set
up (a broker that stops reading, or that withholds a PUBACK) are ones no real broker offers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.gateway.helpers import GENEROUS_TIMEOUT_US, make_repo


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


async def read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(first byte, body) of the next packet."""
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return first, await reader.readexactly(length)


def publish_qos1(pid: int, topic: str, payload: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic.encode() + pid.to_bytes(2, "big") + payload
    return bytes([0x32]) + varint(len(body)) + body


def sensor_mlp_request(request_id: str) -> bytes:
    """One sensor_mlp request (a 32-float row) as JSON, with a deadline no test reaches."""
    row = np.linspace(-1, 1, 32, dtype=np.float32).tolist()
    return json.dumps(
        {
            "id": request_id,
            "inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": row}],
            "parameters": {"timeout": GENEROUS_TIMEOUT_US},
        }
    ).encode()


def gateway_on_test_broker(
    port: int, demo_repo: Path, folder: Path, **mqtt: object
) -> GatewaySettings:
    """A gateway serving sensor_mlp over HTTP on a free port and over MQTT 3.1.1 from the
    test's own broker on ``port`` (no shared subscription), with ``mqtt`` settings added."""
    return GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={
            "model_repo": make_repo(folder / "repo", demo_repo, {"sensor_mlp": None}),
            "cache_dir": folder,
        },
        mqtt={
            "broker": f"mqtt://127.0.0.1:{port}",
            "protocol": "3.1.1",
            "shared_subscription": "off",
            **mqtt,
        },
    )


@contextlib.asynccontextmanager
async def connected_gateway(settings: GatewaySettings) -> AsyncIterator[Gateway]:
    """The gateway, its models loaded and its MQTT session up."""
    async with Gateway(settings) as gateway:
        await gateway.wait_loaded()
        assert gateway.mqtt is not None
        await asyncio.wait_for(gateway.mqtt.connected.wait(), 30)
        yield gateway
