"""The amqtt fallback broker (MQTT 3.1.1 only) refuses an MQTT 5 client out loud: CONNACK with
reason 0x84 (Unsupported Protocol Version) and a closed connection, never silence; MQTT 3.1.1
clients are served as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiomqtt
import pytest
import pytest_asyncio

from gateway.brokers.embedded import AmqttBroker

pytestmark = pytest.mark.asyncio(loop_scope="session")

# An MQTT 5 CONNECT as mosquitto_rr sends it: clean start, keep-alive 60, the Request Response
# Information property, client id "rr". Read as 3.1.1, its property bytes shift every field.
_PROPERTIES = b"\x19\x01"
_BODY = b"\x00\x04MQTT\x05\x02\x00\x3c" + bytes([len(_PROPERTIES)]) + _PROPERTIES + b"\x00\x02rr"
MQTT5_CONNECT = bytes([0x10, len(_BODY)]) + _BODY
# A guard only: the refusal must come long before it.
GUARD_S = 20.0


@pytest_asyncio.fixture(loop_scope="session", name="broker")
async def broker_fixture() -> AsyncIterator[AmqttBroker]:
    broker = AmqttBroker(port=0)
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


async def test_a_raw_mqtt5_connect_gets_connack_0x84_and_a_close(broker: AmqttBroker) -> None:
    reader, writer = await asyncio.open_connection(broker.host, broker.port)
    try:
        writer.write(MQTT5_CONNECT)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), GUARD_S)  # until the broker closes
    finally:
        writer.close()
    assert reply[0] == 0x20, reply  # CONNACK
    assert reply[3] == 0x84  # Unsupported Protocol Version
    assert b"MQTT 3.1.1" in reply  # the reason string says which version to use


async def test_an_mqtt5_client_reports_the_refusal(broker: AmqttBroker) -> None:
    client = aiomqtt.Client(
        broker.host, broker.port, protocol=aiomqtt.ProtocolVersion.V5, timeout=GUARD_S
    )
    with pytest.raises(aiomqtt.MqttError) as caught:
        async with client:
            pass
    assert "nsupported protocol version" in str(caught.value), caught.value


async def test_an_mqtt311_client_is_served(broker: AmqttBroker) -> None:
    async with (
        aiomqtt.Client(broker.host, broker.port, protocol=aiomqtt.ProtocolVersion.V311) as sub,
        aiomqtt.Client(broker.host, broker.port, protocol=aiomqtt.ProtocolVersion.V311) as pub,
    ):
        await sub.subscribe("t/amqtt", qos=1)
        await pub.publish("t/amqtt", b"hello", qos=1)
        async with asyncio.timeout(GUARD_S):
            message = await anext(aiter(sub.messages))
    assert message.payload == b"hello"
