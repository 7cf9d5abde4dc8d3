"""MQTT devices against a real Mosquitto: many devices on one loop, each its own client, Nagle
off, JSON and binary framing, QoS 0, shared connections, a broker that is not there."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import aiomqtt
import pytest

from device_sim.arrivals import Constant
from device_sim.endpoints import BrokerAddress
from device_sim.mqtt_devices import MqttLink, MqttOptions
from device_sim.runner import SimOptions, Transport, simulate
from device_sim.scenario import single_phase
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, MqttResponder


@pytest.fixture
def toy_metadata(tmp_path: Path) -> Path:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps([METADATA]))  # a list of models is accepted too
    return path


async def test_hundreds_of_devices_each_with_its_own_connection(
    mosquitto: Mosquitto, toy_metadata: Path
) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.005) as responder:
        result = await simulate(
            SimOptions(
                broker=mosquitto.url,
                scenario=single_phase(Constant(300), 2.0),
                devices=250,
                models=("toy",),
                metadata_files=(toy_metadata,),
            ),
            progress=None,
        )
    assert result.run_info["connections"] == 250
    assert result.ledger.counters.ok == 600
    assert sum(responder.seen.values()) == 600
    assert set(responder.seen) <= set(result.plan.devices)
    assert len(responder.seen) > 200  # 600 requests spread over 250 devices at random


async def test_devices_can_share_connections(mosquitto: Mosquitto, toy_metadata: Path) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.002) as responder:
        result = await simulate(
            SimOptions(
                transport="mqtt311",
                broker=mosquitto.url,
                scenario=single_phase(Constant(100), 1.0),
                devices=20,
                connections=3,
                models=("toy",),
                metadata_files=(toy_metadata,),
            ),
            progress=None,
        )
    assert result.run_info["connections"] == 3
    assert result.ledger.counters.ok == 100
    assert len(responder.seen) > 10  # replies found their device behind a shared connection


@pytest.mark.parametrize("transport", ["mqtt5", "mqtt311"])
async def test_binary_framing_round_trips(
    mosquitto: Mosquitto, toy_metadata: Path, transport: Transport
) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.002) as responder:
        result = await simulate(
            SimOptions(
                transport=transport,
                broker=mosquitto.url,
                scenario=single_phase(Constant(50), 1.0),
                devices=5,
                models=("toy",),
                metadata_files=(toy_metadata,),
                binary=True,
            ),
            progress=None,
        )
    assert responder.binary_requests == 50
    assert result.ledger.counters.ok == 50


async def test_qos0_requests_are_answered(mosquitto: Mosquitto, toy_metadata: Path) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.002):
        result = await simulate(
            SimOptions(
                broker=mosquitto.url,
                qos=0,
                scenario=single_phase(Constant(50), 1.0),
                devices=5,
                models=("toy",),
                metadata_files=(toy_metadata,),
            ),
            progress=None,
        )
    assert result.ledger.counters.ok == 50


async def test_device_sockets_have_nagle_off(mosquitto: Mosquitto) -> None:
    options = MqttOptions(BrokerAddress.parse(mosquitto.url))
    async with MqttLink(options, "nodelay-check", ["d0"]) as link:
        # paho's socket is the only way to look at the option actually set on the connection.
        sock = link.client._client.socket()
        assert isinstance(sock, socket.socket)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


async def test_a_missing_broker_fails_the_run_at_connect(toy_metadata: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    with pytest.raises(aiomqtt.MqttError):
        await simulate(
            SimOptions(
                broker=f"mqtt://127.0.0.1:{closed_port}",
                scenario=single_phase(Constant(10), 1.0),
                devices=3,
                models=("toy",),
                metadata_files=(toy_metadata,),
            ),
            progress=None,
        )
