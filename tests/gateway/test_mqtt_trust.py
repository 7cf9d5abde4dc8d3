"""Trust between devices over MQTT (docs/mqtt.md, "Trust between devices"): a real Mosquitto
running the shipped deploy/mosquitto configuration and ACL, a password file made at run time,
and a gateway with its own account serving devices A and B over a shared subscription."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import getpass
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
import numpy as np
import pytest
import pytest_asyncio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import ValidationError

from gateway.main import Gateway
from gateway.mqtt.routes import Route, dedupe_key
from gateway.mqtt.trust import DeviceTrust, ReplyNamespace
from gateway.settings.schema import GatewaySettings, MqttSettings
from tests.brokers import Broker, mosquitto
from tests.gateway.helpers import Reference, random_inputs
from tests.gateway.mqtt_client import NODELAY, decode_reply, json_payload

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto"
GATEWAY_USER = "iotgw-gateway"
PASSWORDS = {
    GATEWAY_USER: "gw-secret",
    "devA": "a-secret",
    "devB": "b-secret",
    "devC": "c-secret",
    "devD": "d-secret",
}
MODEL = "sensor_mlp"
# Lines of the shipped mosquitto.conf that name the machine's ports and files: the test broker
# sets its own (a free loopback port, files under tmp, no persistence).
_MACHINE_KEYS = {
    "listener",
    "allow_anonymous",
    "password_file",
    "acl_file",
    "persistence",
    "persistence_location",
    "autosave_interval",
    "persistent_client_expiration",
}


def write_password_file(path: Path, accounts: dict[str, str], *, tool: str | None) -> None:
    """A Mosquitto password file: made by ``mosquitto_passwd`` when given, otherwise written
    in its salted SHA-512 format (``user:$6$<salt>$<sha512(password + salt)>``, base64)."""
    if tool is not None:
        path.touch()
        for user, password in accounts.items():
            subprocess.run([tool, "-b", str(path), user, password], check=True)
        return
    lines = []
    for user, password in accounts.items():
        salt = os.urandom(12)
        digest = hashlib.sha512(password.encode() + salt).digest()
        b64 = base64.b64encode
        lines.append(f"{user}:$6${b64(salt).decode()}${b64(digest).decode()}\n")
    path.write_text("".join(lines))


def shipped_config(password_file: Path) -> str:
    """deploy/mosquitto/mosquitto.conf without its machine-specific lines, with the shipped
    ACL and ``password_file``."""
    keep = [
        line
        for line in (DEPLOY / "mosquitto.conf").read_text().splitlines()
        if line.strip() and not line.startswith("#") and line.split()[0] not in _MACHINE_KEYS
    ]
    local = [
        f"password_file {password_file}",
        f"acl_file {DEPLOY / 'acl'}",
        # Started as root, Mosquitto drops to user "mosquitto", who cannot read pytest's
        # private tmp folders: the test broker stays the test's user.
        f"user {getpass.getuser()}",
    ]
    return "\n".join([*keep, *local]) + "\n"


@contextlib.contextmanager
def secured_mosquitto(folder: Path, *, tool: str | None) -> Iterator[Broker]:
    password_file = folder / "iotgw.passwd"
    write_password_file(password_file, PASSWORDS, tool=tool)
    with mosquitto(folder, extra=shipped_config(password_file), anonymous=False) as broker:
        yield broker


@dataclass
class Account:
    """An authenticated client that records every message it receives."""

    client: aiomqtt.Client
    v5: bool
    received: list[tuple[str, bytes | None, dict[str, Any]]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self) -> None:
        async for message in self.client.messages:
            assert isinstance(message.payload, bytes)
            correlation = getattr(message.properties, "CorrelationData", None)
            self.received.append((str(message.topic), correlation, decode_reply(message.payload)))
            self.arrived.set()

    async def reply_to(self, key: str) -> tuple[str, dict[str, Any]]:
        """The first message correlated with ``key`` (Correlation Data, else the JSON ``id``)."""
        async with asyncio.timeout(30):
            while True:
                for topic, correlation, reply in self.received:
                    if (correlation.decode() if correlation else reply.get("id")) == key:
                        return topic, reply
                self.arrived.clear()
                await self.arrived.wait()

    def keys(self) -> list[str]:
        return [c.decode() if c else r.get("id", "") for _, c, r in self.received]


@contextlib.asynccontextmanager
async def account(
    broker: Broker, user: str, *, v5: bool = True, subscribe: tuple[str, ...] = ()
) -> AsyncIterator[Account]:
    client = aiomqtt.Client(
        broker.host,
        broker.port,
        identifier=user,
        username=user,
        password=PASSWORDS[user],
        protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
        socket_options=NODELAY,
    )
    async with client:
        acct = Account(client, v5)
        for topic in subscribe or (f"iotgw/infer/+/res/{user}/#",):
            await client.subscribe(topic, qos=1)
        reader = asyncio.create_task(acct.read())
        try:
            yield acct
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def send(
    acct: Account,
    as_device: str,
    key: str,
    payload: bytes,
    *,
    response_topic: str | None = None,
) -> None:
    """Publish a request on ``as_device``'s request topic; MQTT 5 clients correlate by ``key``
    and name ``response_topic`` (default: the device's own reply topic)."""
    properties = None
    if acct.v5:
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = response_topic or f"iotgw/infer/{MODEL}/res/{as_device}"
        properties.CorrelationData = key.encode()
    topic = f"iotgw/infer/{MODEL}/req/{as_device}"
    await acct.client.publish(topic, payload, qos=1, properties=properties)


# The gateway and broker are shared by the module, so its async tests share its loop.
on_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    tool = shutil.which("mosquitto_passwd") or shutil.which("/usr/bin/mosquitto_passwd")
    with secured_mosquitto(tmp_path_factory.mktemp("mosquitto-trust"), tool=tool) as b:
        yield b


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway_mqtt(
    broker: Broker, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": demo_repo, "cache_dir": tmp_path_factory.mktemp("cache")},
        mqtt={
            "broker": broker.url,
            "username": GATEWAY_USER,
            "password": PASSWORDS[GATEWAY_USER],
            "client_id": GATEWAY_USER,
            "reconnect_min_s": 0.05,
        },
    )
    async with Gateway(settings) as gw:
        await gw.wait_loaded()
        assert gw.mqtt is not None
        await asyncio.wait_for(gw.mqtt.connected.wait(), 10)
        yield gw


@pytest.fixture(scope="module")
def payload_of(reference: Reference) -> Any:
    meta = reference.metadata(MODEL)
    rng = np.random.default_rng(11)

    def make(rid: str, *, wrong_shape: bool = False) -> bytes:
        inputs = random_inputs(meta, rows=1, rng=rng)
        if wrong_shape:
            inputs = {name: a[:, :3] for name, a in inputs.items()}
        return json_payload(inputs, rid)

    return make


@on_module_loop
async def test_gateway_serves_devices_with_its_own_account_over_a_shared_subscription(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any
) -> None:
    assert gateway_mqtt.mqtt is not None
    assert gateway_mqtt.mqtt.subscribed_topic == "$share/iotgw/iotgw/infer/+/req/+"
    async with account(broker, "devA") as a, account(broker, "devB") as b:
        await send(a, "devA", "a-1", payload_of("a-1"))
        await send(b, "devB", "b-1", payload_of("b-1"))
        for acct, key, device in ((a, "a-1", "devA"), (b, "b-1", "devB")):
            topic, reply = await acct.reply_to(key)
            assert (topic, reply["status"], reply["id"]) == (
                f"iotgw/infer/{MODEL}/res/{device}",
                200,
                key,
            )


@on_module_loop
async def test_a_device_cannot_read_another_devices_replies(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any
) -> None:
    # Mosquitto 2.0 grants the SUBSCRIBE (its acl_file does not check subscriptions) but never
    # delivers what the ACL does not let A read.
    snoop = ("iotgw/infer/+/res/devB/#", "iotgw/infer/+/res/+", "#", "iotgw/infer/+/res/devA/#")
    async with account(broker, "devA", subscribe=snoop) as a, account(broker, "devB") as b:
        await send(b, "devB", "b-secret-1", payload_of("b-secret-1"))
        assert (await b.reply_to("b-secret-1"))[1]["status"] == 200
        # A's own reply leaves the gateway after B's, on the same connection: once A has it,
        # B's would have arrived too had the broker delivered it.
        await send(a, "devA", "a-marker", payload_of("a-marker"))
        await a.reply_to("a-marker")
    assert set(a.keys()) == {"a-marker"}


@on_module_loop
async def test_a_device_cannot_publish_as_another(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any
) -> None:
    async with account(broker, "devA") as a, account(broker, "devB") as b:
        # Had it reached the gateway, this would be answered 400 on B's topic and B's own
        # request with the same id would be taken for its redelivery.
        await send(a, "devB", "b-2", payload_of("b-2", wrong_shape=True))
        await send(b, "devB", "b-2", payload_of("b-2"))
        _, reply = await b.reply_to("b-2")
        await send(b, "devB", "b-marker", payload_of("b-marker"))
        await b.reply_to("b-marker")
    assert reply["status"] == 200
    assert b.keys() == ["b-2", "b-marker"]
    assert a.keys() == []


@on_module_loop
@pytest.mark.parametrize(
    "outside",
    [
        "iotgw/infer/sensor_mlp/res/devB",  # another device's namespace
        "iotgw/infer/sensor_mlp/res/devAB",  # a prefix of a level is not the level
        "replies/devA",  # outside the reply tree
        "iotgw/infer/sensor_mlp/res/devA/#",  # a wildcard is never a topic name
    ],
)
async def test_response_topic_outside_the_namespace_gets_403_on_the_default_topic(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any, outside: str
) -> None:
    key = f"outside-{outside}"
    async with account(broker, "devA") as a, account(broker, "devB") as b:
        await send(a, "devA", key, payload_of(key), response_topic=outside)
        topic, reply = await a.reply_to(key)
        marker = f"b-marker-{outside}"  # unique: a reused id within the window is a duplicate
        await send(b, "devB", marker, payload_of(marker))
        await b.reply_to(marker)
    assert topic == f"iotgw/infer/{MODEL}/res/devA"
    assert (reply["status"], reply["reason"]) == (403, "forbidden_response_topic")
    assert "iotgw/infer/+/res/devA/#" in reply["error"]  # the allowed pattern, for devA
    assert b.keys() == [marker]  # nothing was published into B's namespace


@on_module_loop
async def test_a_refused_response_topic_is_logged_once_per_device_at_info(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The 403 goes where an MQTT 5 requester does not look: the operator's log must say why.
    caplog.set_level(logging.DEBUG, logger="gateway.mqtt")
    async with account(broker, "devD") as d:
        for key in ("log-1", "log-2"):
            await send(d, "devD", key, payload_of(key), response_topic="my/replies")
            await d.reply_to(key)
    refused = [r for r in caplog.records if "refused a request from device 'devD'" in r.message]
    assert [r.levelno for r in refused] == [logging.INFO, logging.DEBUG]
    line = refused[0].message
    assert "'my/replies'" in line  # the topic it asked for
    assert "'iotgw/infer/+/res/devD/#'" in line  # the pattern it must match
    assert f"went to iotgw/infer/{MODEL}/res/devD" in line  # where the 403 is


@on_module_loop
async def test_a_response_topic_under_the_devices_namespace_is_used(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any
) -> None:
    mine = "iotgw/infer/sensor_mlp/res/devA/session-7/replies"
    async with account(broker, "devA", subscribe=(mine,)) as a:
        await send(a, "devA", "deep-1", payload_of("deep-1"), response_topic=mine)
        topic, reply = await a.reply_to("deep-1")
    assert (topic, reply["status"]) == (mine, 200)


@on_module_loop
@pytest.mark.parametrize("v5", [True, False], ids=["mqtt5", "mqtt311"])
async def test_the_same_ids_from_two_devices_are_both_answered(
    gateway_mqtt: Gateway, broker: Broker, payload_of: Any, v5: bool
) -> None:
    first, second = ("devA", "devB") if v5 else ("devC", "devA")
    key = f"same-id-{v5}"
    async with account(broker, first, v5=v5) as one, account(broker, second, v5=v5) as two:
        await send(one, first, key, payload_of(key))
        await send(two, second, key, payload_of(key))
        replies = [await one.reply_to(key), await two.reply_to(key)]
    assert [reply["status"] for _, reply in replies] == [200, 200]


async def test_a_password_file_written_without_mosquitto_passwd_is_accepted(
    tmp_path: Path,
) -> None:
    with secured_mosquitto(tmp_path, tool=None) as broker:
        async with account(broker, "devC", v5=False):
            pass  # connected: the broker accepted the password


# -- the rules themselves, without a broker -------------------------------------------------


def test_reply_namespace_matches_as_a_subscription_filter() -> None:
    ns = ReplyNamespace("{prefix}/infer/+/res/{device}/#", "site/iotgw")
    allowed = ["site/iotgw/infer/m/res/A", "site/iotgw/infer/other/res/A/x/y"]
    refused = [
        "site/iotgw/infer/m/res/B",
        "site/iotgw/infer/m/res",
        "site/iotgw/infer/m/req/A",
        "iotgw/infer/m/res/A",
        "site/iotgw/infer/+/res/A",
        "",
    ]
    assert all(ns.allows(t, "m", "A") for t in allowed)
    assert not any(ns.allows(t, "m", "A") for t in refused)
    assert ns.for_device("m", "A") == "site/iotgw/infer/+/res/A/#"
    # Placeholders are filled once: an id that spells a placeholder is only itself.
    exact = ReplyNamespace("r/{model}-{device}", "p")
    assert exact.allows("r/{device}-A", "{device}", "A")
    assert not exact.allows("r/A-A", "{device}", "A")
    # As in MQTT, a leading wildcard does not reach "$" topics.
    assert not ReplyNamespace("#", "p").allows("$SYS/broker", "m", "A")


@pytest.mark.parametrize("pattern", ["a/#/b", "a/b+", "{prefix}/{owner}", "a/{device"])
def test_invalid_response_topic_patterns_are_refused_by_the_settings(pattern: str) -> None:
    with pytest.raises(ValidationError):
        MqttSettings(response_topic_pattern=pattern)


def test_user_property_identity_needs_the_broker_stamp_and_mqtt5() -> None:
    trust = DeviceTrust(
        namespace=ReplyNamespace("#", "iotgw"),
        identity="user_property",
        identity_property="iotgw-sender",
    )
    assert trust.refusal("m", "A", None, [("iotgw-sender", "A")]) is None
    for stamped in ([], [("iotgw-sender", "B")], [("iotgw-sender", "A"), ("iotgw-sender", "B")]):
        refusal = trust.refusal("m", "A", None, stamped)
        assert refusal is not None and (refusal.status, refusal.reason) == (
            403,
            "forbidden_identity",
        )
    with pytest.raises(ValidationError):
        MqttSettings(device_identity="user_property", protocol="3.1.1")


def test_dedupe_keys_of_two_devices_never_collide() -> None:
    # Separators in a device id or a correlation cannot make two requests' keys equal.
    def key(device: str, reply_topic: str, correlation: bytes) -> tuple[str, bytes] | None:
        route = Route("m", device, reply_topic, correlation, True)
        return dedupe_key(route, None)

    assert key("a", "t/a", b"1") != key("b", "t/a", b"1")
    assert key("a", "t/a", b"x/1") != key("a", "t/a/x", b"1")
    assert key("a", "t", b"1") != key("a", "t", b"2")
    assert key("a", "t", b"1") == key("a", "t", b"1")
