"""A flood answered faster than the broker reads holds bounded memory in the gateway: once more
than ``mqtt.max_unsent_packets`` packets wait to be written, the gateway stops reading requests
until half are written, and every request is still answered once the broker reads again.

The broker here is a minimal MQTT 3.1.1 server written for this test, because the condition is
a broker that keeps sending while it does not read, which no real broker does on purpose. It
speaks just enough of the protocol (CONNACK, SUBACK, PUBLISH, PUBACK, PINGRESP) and its receive
buffer is kept small, so that the gateway's socket fills after a few hundred replies."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.main import Gateway
from tests.gateway.mqtt_packets import (
    connected_gateway,
    gateway_on_test_broker,
    publish_qos1,
    read_packet,
    sensor_mlp_request,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

MODEL = "sensor_mlp"
REQUESTS = 6000
# Long ids, echoed in every reply: the gateway's socket buffer (autotuned up to 4 MB) fills
# after a few thousand replies instead of tens of thousands.
ID_PAD = "x" * 1000
MAX_UNSENT = 64
RECEIVE_MAXIMUM = 16
BACKLOG = 32


class SlowReadingBroker:
    """Accepts one client, sends it ``REQUESTS`` QoS 1 requests, and reads nothing back until
    ``read`` is set; then answers PUBLISHes with PUBACK and records replies and acks."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.read = asyncio.Event()
        self.replies: dict[str, list[int]] = {}  # request id -> statuses of its replies
        self.acked: set[int] = set()  # request packet ids the gateway acknowledged
        self.done = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # inherited when accepted
        sock.bind(("127.0.0.1", 0))
        self.server = await asyncio.start_server(self._client, sock=sock)
        return int(sock.getsockname()[1])

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, _ = await read_packet(reader)
        assert kind >> 4 == 1  # CONNECT
        writer.write(b"\x20\x02\x00\x00")
        kind, body = await read_packet(reader)
        assert kind >> 4 == 8  # SUBSCRIBE
        writer.write(b"\x90\x03" + body[:2] + b"\x01")
        flood = asyncio.create_task(self._flood(writer))
        await self.read.wait()
        while not self.done.is_set():
            kind, body = await read_packet(reader)
            if kind >> 4 == 3:  # a reply
                topic_len = int.from_bytes(body[:2], "big")
                offset = 2 + topic_len
                if (kind >> 1) & 3:
                    writer.write(b"\x40\x02" + body[offset : offset + 2])  # PUBACK it
                    offset += 2
                doc = json.loads(body[offset:])
                self.replies.setdefault(doc["id"], []).append(doc["status"])
            elif kind >> 4 == 4:  # the gateway acknowledges a request
                self.acked.add(int.from_bytes(body[:2], "big"))
            elif kind >> 4 == 12:
                writer.write(b"\xd0\x00")  # PINGRESP
            if len(self.replies) == REQUESTS and len(self.acked) == REQUESTS:
                self.done.set()
        await flood

    async def _flood(self, writer: asyncio.StreamWriter) -> None:
        for pid, payload in enumerate(self.payloads, start=1):
            writer.write(publish_qos1(pid, f"iotgw/infer/{MODEL}/req/dev{pid % 7}", payload))
            await writer.drain()  # blocks while the gateway does not read: that is the point


@pytest_asyncio.fixture(loop_scope="module")
async def flooded(
    demo_repo: Path, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, SlowReadingBroker]]:
    payloads = [sensor_mlp_request(f"r{i}-{ID_PAD}") for i in range(REQUESTS)]
    broker = SlowReadingBroker(payloads)
    port = await broker.start()
    settings = gateway_on_test_broker(
        port,
        demo_repo,
        tmp_path,
        client_id="gw-read-gate",
        receive_maximum=RECEIVE_MAXIMUM,
        max_backlog=BACKLOG,
        max_unsent_packets=MAX_UNSENT,
    )
    async with connected_gateway(settings) as gateway:
        yield gateway, broker
    assert broker.server is not None
    broker.server.close()


async def test_the_gateway_stops_reading_while_its_replies_cannot_leave(
    flooded: tuple[Gateway, SlowReadingBroker],
) -> None:
    gw, broker = flooded
    adapter = gw.mqtt
    assert adapter is not None and adapter._connection is not None
    unsent = adapter._connection.client._out_packet
    pauses = gw.metrics.mqtt_read_pauses
    most = 0
    # Until the gateway paused: the broker reads nothing, so replies pile up unsent.
    for _ in range(30_000):
        most = max(most, len(unsent))
        if pauses._value.get() > 0:
            break
        await asyncio.sleep(0.001)
    assert pauses._value.get() > 0, f"never paused; {len(unsent)} packets unsent"
    for _ in range(300):  # paused: what waits stays bounded (in flight and backlog may answer)
        most = max(most, len(unsent))
        await asyncio.sleep(0.001)
    assert most <= MAX_UNSENT + 2 * (RECEIVE_MAXIMUM + BACKLOG) + 2, most

    broker.read.set()  # the broker reads again: everything is answered, once
    await asyncio.wait_for(broker.done.wait(), 120)
    assert sorted(broker.replies) == sorted(f"r{i}-{ID_PAD}" for i in range(REQUESTS))
    assert all(len(statuses) == 1 for statuses in broker.replies.values())
    statuses = [s[0] for s in broker.replies.values()]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= RECEIVE_MAXIMUM
    assert broker.acked == set(range(1, REQUESTS + 1))
    assert await adapter.wait_idle(30), adapter.in_flight
