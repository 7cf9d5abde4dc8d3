"""Requests at the edges of the MQTT contract, on a live gateway and a real Mosquitto: topics
the subscription matches but that name no model or no device, model names no repository holds,
and requests published at QoS 2. Each is answered as docs/mqtt.md says (or, when there is no
device to answer, acknowledged and dropped), and the gateway keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.brokers import Broker
from tests.gateway.helpers import Reference, make_repo, random_inputs
from tests.gateway.mqtt_client import (
    Device,
    device,
    json_payload,
    mqtt_gateway,
    outputs_of,
    response_topic,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "sensor_mlp"


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["5", "3.1.1"])
async def gw(
    request: pytest.FixtureRequest,
    broker: Broker,
    demo_repo: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Gateway]:
    tmp = tmp_path_factory.mktemp("edges")
    async with mqtt_gateway(
        make_repo(tmp / "repo", demo_repo, {MODEL: None}),
        tmp,
        broker=broker.url,
        protocol=request.param,
        client_id=f"gw-edges-{request.param}",
    ) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def inputs(reference: Reference) -> dict[str, np.ndarray]:
    return random_inputs(reference.metadata(MODEL), 1, np.random.default_rng(6))


def _properties(dev: Device, model: str, key: str) -> Properties | None:
    if not dev.v5:
        return None
    props = Properties(PacketTypes.PUBLISH)
    props.ResponseTopic = response_topic("iotgw", model, dev.device_id)
    props.CorrelationData = key.encode()
    return props


async def _marker(dev: Device, inputs: dict[str, np.ndarray], key: str) -> dict[str, Any]:
    """A good request published after the others and its reply: replies to anything taken
    before it would have come by then (one publisher's messages keep their order)."""
    reply = await dev.request(MODEL, json_payload(inputs, key), key)
    assert reply["status"] == 200
    return reply


async def _publish_on(dev: Device, topic: str, key: str, inputs: dict[str, np.ndarray]) -> None:
    await dev.client.publish(
        topic, json_payload(inputs, key), qos=1, properties=_properties(dev, MODEL, key)
    )


@pytest.mark.parametrize("device_v5", [True, False], ids=["dev-mqtt5", "dev-mqtt311"])
async def test_a_topic_without_a_device_is_acknowledged_and_the_gateway_keeps_serving(
    gw: Gateway, broker: Broker, inputs: dict[str, np.ndarray], device_v5: bool
) -> None:
    tag = f"{device_v5}-{gw.settings.mqtt.protocol}"
    async with device(broker.port, f"dev-nodev-{tag}", v5=device_v5) as dev:
        # Matched by the subscription (an empty level), but there is no device to answer.
        await _publish_on(dev, f"iotgw/infer/{MODEL}/req/", "no-device", inputs)
        await _marker(dev, inputs, f"marker-{tag}")
    assert gw.mqtt is not None
    assert await gw.mqtt.wait_idle(30), gw.mqtt.in_flight  # taken and acknowledged
    assert [key for key, _ in dev.replies] == [f"marker-{tag}"]


@pytest.mark.parametrize("device_v5", [True, False], ids=["dev-mqtt5", "dev-mqtt311"])
async def test_a_topic_without_a_model_gets_404(
    gw: Gateway, broker: Broker, inputs: dict[str, np.ndarray], device_v5: bool
) -> None:
    tag = f"{device_v5}-{gw.settings.mqtt.protocol}"
    dev_id = f"dev-nomodel-{tag}"
    async with device(broker.port, dev_id, v5=device_v5) as dev:
        await _publish_on(dev, f"iotgw/infer//req/{dev_id}", "no-model", inputs)
        await _marker(dev, inputs, f"marker-{tag}")
    assert [(key, reply["status"]) for key, reply in dev.replies] == [
        ("no-model", 404),
        (f"marker-{tag}", 200),
    ]


@pytest.mark.parametrize("device_v5", [True, False], ids=["dev-mqtt5", "dev-mqtt311"])
async def test_model_names_no_repository_holds_get_404(
    gw: Gateway, broker: Broker, inputs: dict[str, np.ndarray], device_v5: bool
) -> None:
    tag = f"{device_v5}-{gw.settings.mqtt.protocol}"
    names = ["no such model", "x" * 200, "sensor_mlp_", "SENSOR_MLP", "..", "%s"]
    async with device(broker.port, f"dev-names-{tag}", v5=device_v5) as dev:
        futures = []
        for i, name in enumerate(names):
            key = f"name-{i}-{tag}"
            futures.append(await dev.publish(name, json_payload(inputs, key), key))
        replies = [await asyncio.wait_for(f, 30) for f in futures]
        await _marker(dev, inputs, f"marker-{tag}")
    assert [(r["status"], r["reason"]) for r in replies] == [(404, "not_found")] * len(names)
    served = ", ".join(gw.service.registry.model_names())
    assert [r["error"] for r in replies] == [
        f"unknown model {n!r}; served: {served}" for n in names
    ]
    assert len(dev.replies) == len(names) + 1  # each answered once


@pytest.mark.parametrize("device_v5", [True, False], ids=["dev-mqtt5", "dev-mqtt311"])
async def test_a_qos2_request_is_answered_exactly_once(
    gw: Gateway,
    broker: Broker,
    reference: Reference,
    inputs: dict[str, np.ndarray],
    device_v5: bool,
) -> None:
    tag = f"{device_v5}-{gw.settings.mqtt.protocol}"
    dev_id = f"dev-qos2-{tag}"
    async with device(broker.port, dev_id, v5=device_v5) as dev:
        keys = [f"q2-{i}-{tag}" for i in range(5)]
        futures = [await dev.publish(MODEL, json_payload(inputs, k), k, qos=2) for k in keys]
        replies = [await asyncio.wait_for(f, 30) for f in futures]
        await _marker(dev, inputs, f"marker-{tag}")
    want = reference.infer(MODEL, inputs)["probabilities"]
    for reply in replies:
        assert reply["status"] == 200
        np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5)
    assert [key for key, _ in dev.replies] == [*keys, f"marker-{tag}"]


async def test_a_qos2_subscription_is_refused_by_the_settings() -> None:
    with pytest.raises(ValueError, match="qos"):
        GatewaySettings.load(mqtt={"qos": 2})
