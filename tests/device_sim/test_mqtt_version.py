"""The simulator and the recorder follow the broker's MQTT version: MQTT 5 with Mosquitto; with
an MQTT 3.1.1-only broker (amqtt, what ``iotgw serve`` embeds when Mosquitto is not installed)
they fall back to 3.1.1 with one log line, or, when MQTT 5 was asked for explicitly, fail with
one line naming the option; a broker that never answers an MQTT 5 CONNECT costs one connect
timeout, never a hang."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from device_sim.arrivals import Constant
from device_sim.cli import main
from device_sim.endpoints import BrokerAddress
from device_sim.recorder import RecordOptions, record
from device_sim.runner import SimOptions, simulate
from device_sim.scenario import single_phase
from tests.brokers import free_port
from tests.device_sim.conftest import Mosquitto
from tests.device_sim.responders import METADATA, MqttResponder


@contextlib.asynccontextmanager
async def amqtt_broker() -> AsyncIterator[int]:
    """A real amqtt broker (MQTT 3.1.1 only) in this event loop, as the gateway embeds it."""
    from amqtt.broker import Broker

    port = free_port()
    broker = Broker(
        {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
    )
    await broker.start()
    try:
        yield port
    finally:
        await broker.shutdown()


async def _read_packet(reader: asyncio.StreamReader) -> bytes:
    """One MQTT control packet: fixed header, variable-length remaining length, the rest."""
    head = await reader.readexactly(1)
    length, shift, raw = 0, 0, b""
    while True:
        byte = await reader.readexactly(1)
        raw += byte
        length |= (byte[0] & 0x7F) << shift
        shift += 7
        if not byte[0] & 0x80:
            break
    return head + raw + await reader.readexactly(length)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def silent_to_mqtt5(upstream_port: int) -> AsyncIterator[int]:
    """A front for the broker on ``upstream_port`` that says nothing to an MQTT 5 CONNECT
    (as some 3.1.1 brokers do) and relays every other connection unchanged."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connect = await _read_packet(reader)
        level = connect[connect.index(b"MQTT") + 4]
        if level == 5:
            await reader.read()  # silence until the client gives up
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        up_writer.write(connect)
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


def _sim(broker_port: int, metadata: Path, **overrides: Any) -> SimOptions:
    options: dict[str, Any] = {
        "broker": f"mqtt://127.0.0.1:{broker_port}",
        "scenario": single_phase(Constant(20), 1.0),
        "devices": 3,
        "models": ("toy",),
        "metadata_files": (metadata,),
    }
    return SimOptions(**(options | overrides))


@pytest.fixture
def metadata(tmp_path: Path) -> Path:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(METADATA))
    return path


async def test_default_transport_falls_back_to_311_on_amqtt(
    metadata: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with amqtt_broker() as port, MqttResponder(port, service_s=0.002, v5=False):
        with caplog.at_level(logging.WARNING, logger="device_sim"):
            result = await simulate(_sim(port, metadata), progress=None)
    assert result.run_info["transport"] == "mqtt311"
    assert result.ledger.counters.ok == len(result.plan) == 20
    notices = [r.getMessage() for r in caplog.records if r.name == "device_sim"]
    assert len(notices) == 1, notices
    assert "refused MQTT 5" in notices[0] and "using MQTT 3.1.1" in notices[0]
    assert "--transport mqtt311" in notices[0]


async def test_default_transport_is_mqtt5_on_mosquitto(
    mosquitto: Mosquitto, metadata: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with MqttResponder(mosquitto.port, service_s=0.002):
        with caplog.at_level(logging.WARNING, logger="device_sim"):
            result = await simulate(_sim(mosquitto.port, metadata), progress=None)
    assert result.run_info["transport"] == "mqtt5"
    assert result.ledger.counters.ok == len(result.plan)
    assert not [r for r in caplog.records if r.name == "device_sim"]


async def test_explicit_mqtt5_on_amqtt_fails_with_one_line_naming_the_option(
    metadata: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with amqtt_broker() as port:
        argv = ["run", "--transport", "mqtt5", "--arrival", "constant", "--rate", "5"]
        argv += ["--duration", "1", "--model", "toy", "--metadata", str(metadata)]
        argv += ["--broker", f"mqtt://127.0.0.1:{port}", "--out", str(tmp_path / "out")]
        code = await asyncio.to_thread(main, argv)
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "refused MQTT 5" in err[0] and "use --transport mqtt311" in err[0]
    assert not (tmp_path / "out" / "summary.json").exists()


async def test_record_follows_the_broker_version(tmp_path: Path, metadata: Path) -> None:
    async with amqtt_broker() as port, MqttResponder(port, service_s=0.002, v5=False):
        trace = tmp_path / "capture.csv"
        ready = asyncio.Event()
        options = RecordOptions(
            BrokerAddress.parse(f"mqtt://127.0.0.1:{port}"), trace, max_count=10, duration_s=20
        )
        recording = asyncio.create_task(record(options, ready))
        try:
            await asyncio.wait_for(ready.wait(), 20)
            await simulate(_sim(port, metadata, scenario=single_phase(Constant(10), 1.0)), None)
            assert await asyncio.wait_for(recording, 20) == 10
        finally:
            recording.cancel()


async def test_record_explicit_mqtt5_names_the_protocol_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with amqtt_broker() as port:
        argv = ["record", "--protocol", "5", "--out", str(tmp_path / "t.csv")]
        argv += ["--broker", f"mqtt://127.0.0.1:{port}", "--duration-s", "1"]
        code = await asyncio.to_thread(main, argv)
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "use --protocol 3.1.1" in err[0], err


async def test_a_broker_silent_to_mqtt5_costs_one_connect_timeout(
    metadata: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        amqtt_broker() as upstream,
        silent_to_mqtt5(upstream) as port,
        MqttResponder(port, service_s=0.002, v5=False),
    ):
        with caplog.at_level(logging.WARNING, logger="device_sim"):
            result = await simulate(_sim(port, metadata, connect_timeout_s=1.0), None)
        assert result.run_info["transport"] == "mqtt311"
        assert result.ledger.counters.ok == len(result.plan)
        notices = [r.getMessage() for r in caplog.records if r.name == "device_sim"]
        assert len(notices) == 1 and "did not answer an MQTT 5 CONNECT within 1 s" in notices[0]
        with pytest.raises(ConnectionError, match="use --transport mqtt311"):
            await simulate(_sim(port, metadata, transport="mqtt5", connect_timeout_s=1.0), None)
