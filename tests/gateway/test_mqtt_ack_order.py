"""A request is acknowledged right behind its reply, not when the broker acknowledges the reply:
a broker reading the one TCP stream in order then holds both or neither, so a connection lost
between the broker taking the reply and the reply's PUBACK reaching the gateway cannot bring
the request back for a second answer (seen in ``iotgw bench chaos`` case f).

The broker here is a minimal MQTT 3.1.1 server written for this test, because the condition is
a broker that takes a reply and withholds its PUBACK, which no real broker does on purpose."""

from __future__ import annotations

import asyncio
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

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "sensor_mlp"
REQUEST_PID = 7
REQUESTS = 3


class WithholdingBroker:
    """Accepts one client, sends it ``REQUESTS`` QoS 1 requests, and records every packet the
    gateway sends back as (kind, packet id); the replies' PUBACKs are sent only once
    ``release`` is set."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.packets: list[tuple[str, int]] = []  # ("reply" | "ack", packet id)
        self.changed = asyncio.Event()
        self.release = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        kind, _ = await read_packet(reader)
        assert kind >> 4 == 1  # CONNECT
        writer.write(b"\x20\x02\x00\x00")
        kind, body = await read_packet(reader)
        assert kind >> 4 == 8  # SUBSCRIBE
        writer.write(b"\x90\x03" + body[:2] + b"\x01")
        for i, payload in enumerate(self.payloads):
            writer.write(publish_qos1(REQUEST_PID + i, f"iotgw/infer/{MODEL}/req/dev0", payload))
        withheld: list[bytes] = []
        releasing: asyncio.Task[bool] | None = asyncio.create_task(self.release.wait())
        reading = asyncio.create_task(read_packet(reader))
        while True:
            waiting = {reading} if releasing is None else {reading, releasing}
            done, _ = await asyncio.wait(waiting, return_when="FIRST_COMPLETED")
            if releasing in done:
                for pid in withheld:
                    writer.write(b"\x40\x02" + pid)  # the replies' PUBACKs, at last
                withheld.clear()
                releasing = None
            if reading not in done:
                continue
            kind, body = reading.result()
            reading = asyncio.create_task(read_packet(reader))
            if kind >> 4 == 3:  # a reply, QoS 1
                topic_len = int.from_bytes(body[:2], "big")
                pid = body[2 + topic_len : 4 + topic_len]
                self.packets.append(("reply", int.from_bytes(pid, "big")))
                if self.release.is_set():
                    writer.write(b"\x40\x02" + pid)
                else:
                    withheld.append(pid)
            elif kind >> 4 == 4:  # the gateway acknowledges a request
                self.packets.append(("ack", int.from_bytes(body[:2], "big")))
            elif kind >> 4 == 12:
                writer.write(b"\xd0\x00")  # PINGRESP
            self.changed.set()


@pytest_asyncio.fixture(loop_scope="module")
async def withholding(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Gateway, WithholdingBroker]]:
    tmp_path = tmp_path_factory.mktemp("ack-order")
    payloads = [sensor_mlp_request(f"r{i}") for i in range(REQUESTS)]
    broker = WithholdingBroker(payloads)
    port = await broker.start()
    settings = gateway_on_test_broker(port, demo_repo, tmp_path, client_id="gw-ack-order")
    async with connected_gateway(settings) as gateway:
        yield gateway, broker
    assert broker.server is not None
    broker.server.close()


async def test_each_request_is_acknowledged_right_behind_its_reply(
    withholding: tuple[Gateway, WithholdingBroker],
) -> None:
    gw, broker = withholding
    adapter = gw.mqtt
    assert adapter is not None

    async def seen(count: int) -> None:
        while len(broker.packets) < count:
            broker.changed.clear()
            await broker.changed.wait()

    # Every reply and every request's acknowledgement arrive while the broker withholds the
    # replies' PUBACKs: the acknowledgement does not wait for them.
    await asyncio.wait_for(seen(2 * REQUESTS), 60)
    replies = [pid for kind, pid in broker.packets if kind == "reply"]
    acks = [pid for kind, pid in broker.packets if kind == "ack"]
    assert sorted(acks) == list(range(REQUEST_PID, REQUEST_PID + REQUESTS))
    assert len(replies) == REQUESTS
    # ... and each acknowledgement comes after a reply on the stream: the broker cannot hold a
    # request's acknowledgement without the reply written before it.
    for i, (kind, _) in enumerate(broker.packets):
        if kind == "ack":
            assert sum(k == "reply" for k, _ in broker.packets[:i]) > sum(
                k == "ack" for k, _ in broker.packets[:i]
            ), broker.packets
    # Answered and acknowledged, a request still holds its place until its reply's PUBACK.
    assert adapter.in_flight == REQUESTS
    broker.release.set()
    assert await adapter.wait_idle(30), adapter.in_flight
    assert adapter._awaiting == 0
