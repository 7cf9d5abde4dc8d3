"""``iotgw serve`` without ``--broker``: the managed Mosquitto child (MQTT 5 with a shared
subscription, gone when the gateway stops or is killed) and the embedded brokers' password
file (anonymous clients refused, the gateway with its credentials serves)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import numpy as np
import pytest

from gateway.brokers.mosquitto import broker_dir
from tests.brokers import free_port
from tests.gateway.helpers import make_repo
from tests.gateway.mqtt_client import NODELAY, Device, json_payload, outputs_of
from tests.gateway.serve_process import (
    Serve,
    mosquitto_children,
    port_free,
    serve,
    serve_command,
    wait_gone,
)

pytestmark = pytest.mark.slow

INPUTS = {"features": np.random.default_rng(2).standard_normal((1, 32)).astype(np.float32)}


@pytest.fixture(scope="module")
def small_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("repo"), demo_repo, {"sensor_mlp": None})


@contextlib.asynccontextmanager
async def client_device(
    port: int, device_id: str, *, v5: bool, username: str | None = None, password: str | None = None
) -> AsyncIterator[Device]:
    client = aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=device_id,
        username=username,
        password=password,
        protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        socket_options=NODELAY,
    )
    async with client:
        dev = Device(client, device_id, v5, "iotgw")
        await dev.start()
        try:
            yield dev
        finally:
            await dev.stop()


async def round_trip(port: int, device_id: str, *, v5: bool, **credentials: str) -> None:
    async with client_device(port, device_id, v5=v5, **credentials) as dev:
        reply = await dev.request(
            "sensor_mlp", json_payload(INPUTS, f"{device_id}-1"), f"{device_id}-1"
        )
    assert reply["status"] == 200, reply
    assert outputs_of(reply)["probabilities"].shape[0] == 1


def start_embedded(
    small_repo: Path, folder: Path, port: int, *args: str
) -> contextlib.AbstractContextManager[Serve]:
    return serve(small_repo, folder, "--mqtt-port", str(port), *args)


async def test_serve_runs_mosquitto_speaks_mqtt5_and_stops_it(
    small_repo: Path, tmp_path: Path
) -> None:
    port = free_port()
    config = broker_dir(tmp_path, port) / "mosquitto.conf"
    with start_embedded(small_repo, tmp_path, port) as gw:
        gw.wait_ready()
        assert len(mosquitto_children(config)) == 1
        log = gw.text()
        assert "embedded MQTT broker (mosquitto, MQTT 5" in log
        assert "subscribed to $share/iotgw/iotgw/infer/+/req/+" in log
        await round_trip(port, "dev-mosq", v5=True)
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0
    assert mosquitto_children(config) == []
    assert port_free(port)
    # Its store is kept under the cache directory for the next start.
    assert "persistence_location" in config.read_text()


async def test_mosquitto_dies_with_a_killed_gateway(small_repo: Path, tmp_path: Path) -> None:
    port = free_port()
    config = broker_dir(tmp_path, port) / "mosquitto.conf"
    with start_embedded(small_repo, tmp_path, port) as gw:
        gw.wait_ready()
        assert len(mosquitto_children(config)) == 1
        gw.process.send_signal(signal.SIGKILL)
        gw.process.wait()
    wait_gone(config)  # the kernel signals the orphan (PR_SET_PDEATHSIG)
    assert port_free(port)


def password_file(folder: Path, users: dict[str, str]) -> Path:
    """A password file as ``mosquitto_passwd`` writes it (PBKDF2-SHA512 hashes)."""
    path = folder / "passwd"
    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.fail("mosquitto_passwd is not installed (it comes with mosquitto)", pytrace=False)
    for user, password in users.items():
        create = [] if path.exists() else ["-c"]
        subprocess.run([tool, "-b", *create, str(path), user, password], check=True)
    return path


@pytest.mark.parametrize("broker", ["mosquitto", "amqtt"])
async def test_password_file_refuses_anonymous_and_admits_the_gateway(
    small_repo: Path, tmp_path: Path, broker: str
) -> None:
    passwords = password_file(tmp_path, {"gateway": "gw-secret", "dev-auth": "dev-secret"})
    port = free_port()
    args = ("--embedded-broker", broker, "--embedded-password-file", str(passwords))
    credentials = {"IOTGW_MQTT__USERNAME": "gateway", "IOTGW_MQTT__PASSWORD": "gw-secret"}
    v5 = broker == "mosquitto"
    with serve(small_repo, tmp_path, "--mqtt-port", str(port), *args, env=credentials) as gw:
        gw.wait_ready()  # ready includes subscribed: the gateway's login was accepted
        with pytest.raises(aiomqtt.MqttError):
            await round_trip(port, "dev-anon", v5=v5)
        with pytest.raises(aiomqtt.MqttError):
            await round_trip(port, "dev-auth", v5=v5, username="dev-auth", password="wrong")
        await round_trip(port, "dev-auth", v5=v5, username="dev-auth", password="dev-secret")
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0


async def test_two_gateways_on_one_machine_keep_their_own_brokers(
    small_repo: Path, tmp_path: Path
) -> None:
    """One cache directory, two gateways on two MQTT ports: two brokers, each with its own
    configuration and store, each serving its gateway; a third start that fails (HTTP port
    busy) leaves both running brokers' files as they were."""
    one, two = free_port(), free_port()
    configs = [broker_dir(tmp_path, port) / "mosquitto.conf" for port in (one, two)]
    with start_embedded(small_repo, tmp_path, one) as first:
        first.wait_ready()
        with start_embedded(small_repo, tmp_path, two) as second:
            second.wait_ready()
            before = [(c.read_bytes(), c.stat().st_mtime_ns) for c in configs]
            for port, config in zip((one, two), configs, strict=True):
                assert f"listener {port} " in config.read_text()
            assert [len(mosquitto_children(c)) for c in configs] == [1, 1]
            await round_trip(one, "dev-one", v5=True)
            await round_trip(two, "dev-two", v5=True)
            failed = await asyncio.to_thread(
                subprocess.run,
                serve_command(
                    small_repo, tmp_path, first.http_port, "--mqtt-port", str(free_port())
                ),
                capture_output=True,
                timeout=120,
            )
            assert failed.returncode == 1
            assert [(c.read_bytes(), c.stat().st_mtime_ns) for c in configs] == before
            await round_trip(one, "dev-one-again", v5=True)
            second.process.send_signal(signal.SIGTERM)
            assert second.wait_exit() == 0
        first.process.send_signal(signal.SIGTERM)
        assert first.wait_exit() == 0
    assert [mosquitto_children(c) for c in configs] == [[], []]
