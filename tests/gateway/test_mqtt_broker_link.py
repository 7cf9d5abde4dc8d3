"""The gateway's own link to the broker, against a real Mosquitto: TLS (``mqtts://``, a CA made
by trustme) with a user name and password from a password file, refusals that leave it
disconnected with the reason logged, and a broker restart after which it subscribes again."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
import trustme

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.brokers import Broker, free_port, mosquitto
from tests.gateway.helpers import Reference, make_repo, metric_samples, random_inputs
from tests.gateway.mqtt_client import NODELAY, Device, device, json_payload, outputs_of
from tests.gateway.test_mqtt_trust import write_password_file

pytestmark = pytest.mark.asyncio(loop_scope="function")

MODEL = "sensor_mlp"
PASSWORDS = {"gw": "gw-secret", "dev-tls": "dev-secret"}
# Far beyond any real wait for a connection or a log line, on the busiest machine.
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def mlp_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("repo"), demo_repo, {MODEL: None})


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@contextlib.contextmanager
def tls_mosquitto(folder: Path, ca: trustme.CA) -> Iterator[Broker]:
    """A Mosquitto whose one listener speaks TLS only (a certificate for 127.0.0.1 issued by
    ``ca``) and admits only the accounts of ``PASSWORDS``."""
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    password_file = folder / "passwd"
    write_password_file(password_file, PASSWORDS, tool=None)
    extra = (
        f"certfile {folder / 'server.pem'}\n"
        f"keyfile {folder / 'server.pem'}\n"
        f"password_file {password_file}\n"
        # Started as root, Mosquitto would drop to user "mosquitto", who cannot read these.
        f"user {getpass.getuser()}\n"
    )
    with mosquitto(folder, extra=extra, anonymous=False) as broker:
        yield broker


def gateway_settings(repo: Path, cache: Path, broker_url: str, **mqtt: Any) -> GatewaySettings:
    return GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": cache},
        mqtt={
            "broker": broker_url,
            "client_id": "gw-link",
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.2,
            **mqtt,
        },
    )


@contextlib.asynccontextmanager
async def tls_device(broker: Broker, ca: trustme.CA, user: str) -> AsyncIterator[Device]:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    client = aiomqtt.Client(
        "127.0.0.1",
        broker.port,
        identifier=user,
        username=user,
        password=PASSWORDS[user],
        protocol=aiomqtt.ProtocolVersion.V5,
        tls_context=context,
        socket_options=NODELAY,
    )
    async with client:
        dev = Device(client, user, True, "iotgw")
        await dev.start()
        try:
            yield dev
        finally:
            await dev.stop()


async def until(check: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """Wait, checking often, until ``check()`` holds; fail after DEADLINE_S."""
    async with asyncio.timeout(DEADLINE_S):
        while True:
            result = check()
            if result if isinstance(result, bool) else await result:
                return
            await asyncio.sleep(0.02)
    raise AssertionError(what)  # pragma: no cover (the timeout raises first)


async def test_gateway_over_tls_with_a_password_serves_devices(
    mlp_repo: Path, tmp_path: Path, ca: trustme.CA, reference: Reference
) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "gw.password").write_text(PASSWORDS["gw"] + "\n")
    inputs = random_inputs(reference.metadata(MODEL), 2, np.random.default_rng(8))
    with tls_mosquitto(tmp_path, ca) as broker:
        settings = gateway_settings(
            mlp_repo,
            tmp_path / "cache",
            f"mqtts://127.0.0.1:{broker.port}",
            ca_file=tmp_path / "ca.pem",
            username="gw",
            password_file=tmp_path / "gw.password",
        )
        async with Gateway(settings) as gw:
            await gw.wait_loaded()
            assert gw.mqtt is not None
            await asyncio.wait_for(gw.mqtt.connected.wait(), DEADLINE_S)
            async with tls_device(broker, ca, "dev-tls") as dev:
                reply = await dev.request(MODEL, json_payload(inputs, "t1"), "t1")
    assert reply["status"] == 200
    want = reference.infer(MODEL, inputs)["probabilities"]
    np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("untrusted-certificate", "CERTIFICATE_VERIFY_FAILED"),
        ("wrong-password", "Not authorized"),
    ],
)
async def test_a_refused_link_stays_down_and_says_why(
    mlp_repo: Path,
    tmp_path: Path,
    ca: trustme.CA,
    caplog: pytest.LogCaptureFixture,
    case: str,
    reason: str,
) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    caplog.set_level(logging.WARNING, logger="gateway.mqtt")
    with tls_mosquitto(tmp_path, ca) as broker:
        url = f"mqtts://127.0.0.1:{broker.port}"
        mqtt: dict[str, Any] = {"username": "gw", "password": PASSWORDS["gw"]}
        if case == "wrong-password":
            mqtt = {**mqtt, "password": "not-the-password", "ca_file": tmp_path / "ca.pem"}
        # untrusted-certificate: no ca_file, so the system's CAs, which never signed it
        async with Gateway(gateway_settings(mlp_repo, tmp_path / "cache", url, **mqtt)) as gw:
            await gw.wait_loaded()
            assert gw.mqtt is not None

            def refusals() -> list[str]:
                return [r.getMessage() for r in caplog.records if "lost or refused" in r.msg]

            # Two attempts refused: the gateway keeps retrying and never counts as connected.
            await until(lambda: len(refusals()) >= 2, f"no refusal logged:\n{caplog.text}")
            assert not gw.mqtt.connected.is_set()
    assert all(reason in message for message in refusals()), refusals()


def _reconnects(gw: Gateway) -> float:
    return sum(
        value
        for name, _, value in metric_samples(gw.metrics.render().decode())
        if name == "iotgw_mqtt_reconnects_total"
    )


async def test_after_a_broker_restart_the_gateway_subscribes_again_and_serves(
    mlp_repo: Path, tmp_path: Path, reference: Reference
) -> None:
    port = free_port()
    inputs = random_inputs(reference.metadata(MODEL), 1, np.random.default_rng(9))
    want = reference.infer(MODEL, inputs)["probabilities"]
    settings = gateway_settings(mlp_repo, tmp_path / "cache", f"mqtt://127.0.0.1:{port}")
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    async with Gateway(settings) as gw:
        await gw.wait_loaded()
        assert gw.mqtt is not None
        with mosquitto(tmp_path / "first", port=port) as first:
            await asyncio.wait_for(gw.mqtt.connected.wait(), DEADLINE_S)
            async with device(first.port, "dev-before") as dev:
                before = await dev.request(MODEL, json_payload(inputs, "b1"), "b1")
        mqtt = gw.mqtt
        await until(lambda: not mqtt.connected.is_set(), "the broker's loss went unnoticed")
        # A new broker on the same port, with no memory of the gateway's session or
        # subscription: a gateway that only reconnected, without subscribing, gets nothing.
        with mosquitto(tmp_path / "second", port=port) as second:
            await asyncio.wait_for(gw.mqtt.connected.wait(), DEADLINE_S)
            async with device(second.port, "dev-after") as dev:
                after = await dev.request(MODEL, json_payload(inputs, "a1"), "a1")
        assert _reconnects(gw) >= 1
    for reply in (before, after):
        assert reply["status"] == 200
        np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5)
