"""The MQTT adapter against a real Mosquitto (MQTT 5 and 3.1.1) and the embedded broker."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.brokers import Broker
from tests.gateway.helpers import Reference, metric_samples, random_inputs
from tests.gateway.mqtt_client import (
    device,
    framed_binary_request,
    json_payload,
    outputs_of,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


def mqtt_settings(repo: Path, cache: Path, **mqtt: object) -> GatewaySettings:
    return GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": cache},
        mqtt={"reconnect_min_s": 0.05, **mqtt},
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["5", "3.1.1"])
async def gateway_mqtt(
    request: pytest.FixtureRequest,
    broker: Broker,
    demo_repo: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Gateway]:
    """A gateway connected to Mosquitto with MQTT 5 (shared subscription) or MQTT 3.1.1."""
    settings = mqtt_settings(
        demo_repo,
        tmp_path_factory.mktemp("cache"),
        broker=broker.url,
        protocol=request.param,
        client_id=f"gw-test-{request.param}",
    )
    async with Gateway(settings) as gw:
        await gw.wait_loaded()
        assert gw.mqtt is not None
        await asyncio.wait_for(gw.mqtt.connected.wait(), 10)
        yield gw


async def test_subscription_is_shared_on_mqtt5(gateway_mqtt: Gateway) -> None:
    assert gateway_mqtt.mqtt is not None
    topic = gateway_mqtt.mqtt.subscribed_topic
    if gateway_mqtt.settings.mqtt.protocol == "5":
        assert topic == "$share/iotgw/iotgw/infer/+/req/+"
    else:
        assert topic == "iotgw/infer/+/req/+"


@pytest.mark.parametrize("device_v5", [True, False], ids=["dev-mqtt5", "dev-mqtt311"])
@pytest.mark.parametrize("model", ["sensor_mlp", "vision_cnn_tf", "sensor_fusion"])
async def test_round_trip_json_and_binary(
    gateway_mqtt: Gateway, broker: Broker, reference: Reference, model: str, device_v5: bool
) -> None:
    rng = np.random.default_rng(7)
    meta = reference.metadata(model)
    tag = f"{model}-{device_v5}-{gateway_mqtt.settings.mqtt.protocol}"
    async with device(broker.port, f"dev-{tag}", v5=device_v5) as dev:
        sent = []
        for i in range(6):
            inputs = random_inputs(meta, rows=1 + i % 3, rng=rng)
            rid = f"{tag}-{i}"
            payload = framed_binary_request(inputs, id=rid) if i % 2 else json_payload(inputs, rid)
            sent.append((rid, inputs, await dev.publish(model, payload, rid)))
        for rid, inputs, future in sent:
            reply = await asyncio.wait_for(future, 30)
            assert reply["id"] == rid
            assert reply["status"] == 200  # binary replies carry it in their JSON header too
            assert reply["model_name"] == model
            got = outputs_of(reply)
            want = reference.infer(model, inputs)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    # Every reply was matched to its request once (correlation data / id).
    assert sorted(k or "" for k, _ in dev.replies) == sorted(rid for rid, _, _ in sent)


async def test_bad_payloads_get_error_replies_and_good_ones_are_served(
    gateway_mqtt: Gateway, broker: Broker, reference: Reference
) -> None:
    meta = reference.metadata("sensor_mlp")
    rng = np.random.default_rng(3)
    good = random_inputs(meta, rows=1, rng=rng)
    wrong_shape = {"features": rng.standard_normal((1, 5)).astype(np.float32)}
    proto = gateway_mqtt.settings.mqtt.protocol
    limit = gateway_mqtt.settings.mqtt.max_payload_bytes
    # (model, key, payload, expected status, words the error must contain)
    bad: list[tuple[str, str, bytes, int, str]] = [
        ("sensor_mlp", "garbage", b"\x00\xffnot json at all", 400, "malformed JSON"),
        (
            "sensor_mlp",
            "truncated",
            framed_binary_request(good, id=f"truncated-{proto}")[:-8],
            400,
            "binary",
        ),
        ("sensor_mlp", "shape", json_payload(wrong_shape, f"shape-{proto}"), 400, "shape"),
        ("no_such_model", "unknown", json_payload(good, f"unknown-{proto}"), 404, "no_such_model"),
        ("sensor_mlp", "huge", b"{" + b" " * limit + b"}", 413, "exceeds the limit"),
    ]
    async with device(broker.port, f"dev-bad-{proto}", v5=proto == "5") as dev:
        goods = []
        for i, (model, kind, payload, _, _) in enumerate(bad):
            await dev.publish(model, payload, f"{kind}-{proto}")
            key = f"good-{i}-{proto}"
            goods.append(await dev.publish("sensor_mlp", json_payload(good, key), key))
        want = reference.infer("sensor_mlp", good)["probabilities"]
        for future in goods:
            reply = await asyncio.wait_for(future, 30)
            assert reply["status"] == 200
            np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5)
        for _ in range(500):
            if len(dev.replies) >= 2 * len(bad):
                break
            await asyncio.sleep(0.02)
    assert len(dev.replies) == 2 * len(bad)  # every request answered once, errors included
    errors = [reply for _, reply in dev.replies if reply["status"] != 200]
    assert sorted(r["status"] for r in errors) == sorted(b[3] for b in bad)
    for _, kind, _, status, words in bad:
        matching = [r for r in errors if r["status"] == status and words in r["error"]]
        assert matching, (kind, errors)
    if proto == "5":
        # With Correlation Data every error reply is matched to its request, even unparsable
        # ones; MQTT 3.1.1 devices can only match replies that carry the request's id.
        by_key = dict(dev.replies)
        for _, kind, _, status, _ in bad:
            assert by_key[f"{kind}-{proto}"]["status"] == status


async def test_mqtt311_request_without_id_gets_an_error_reply(
    gateway_mqtt: Gateway, broker: Broker, reference: Reference
) -> None:
    meta = reference.metadata("sensor_mlp")
    inputs = random_inputs(meta, rows=1, rng=np.random.default_rng(0))
    body = json.loads(json_payload(inputs, "x"))
    del body["id"]
    async with device(broker.port, "dev-noid", v5=False) as dev:
        await dev.client.publish("iotgw/infer/sensor_mlp/req/dev-noid", json.dumps(body), qos=1)
        for _ in range(300):
            if dev.replies:
                break
            await asyncio.sleep(0.02)
    assert len(dev.replies) == 1
    _, reply = dev.replies[0]
    assert reply["status"] == 400 and "'id'" in reply["error"]


async def test_a_redelivery_gets_the_same_reply_again(
    gateway_mqtt: Gateway, broker: Broker, reference: Reference
) -> None:
    """A device (or the broker) sending a request again after it was answered: the gateway
    does not compute it twice, and the repeat gets the first reply again rather than silence."""
    meta = reference.metadata("sensor_mlp")
    inputs = random_inputs(meta, rows=1, rng=np.random.default_rng(1))
    proto = gateway_mqtt.settings.mqtt.protocol
    rid = f"dup-{proto}"
    answered_before = _answered(gateway_mqtt)
    async with device(broker.port, f"dev-dup-{proto}", v5=True) as dev:
        first = await dev.request("sensor_mlp", json_payload(inputs, rid), rid)
        again = await dev.request("sensor_mlp", json_payload(inputs, rid), rid)
    assert first["status"] == again["status"] == 200
    assert first["outputs"] == again["outputs"]
    assert _answered(gateway_mqtt) == answered_before + 1  # computed once


def _answered(gw: Gateway) -> float:
    """Requests sensor_mlp answered over MQTT since the start (a counter: no window)."""
    return sum(
        value
        for name, labels, value in metric_samples(gw.metrics.render().decode())
        if name == "iotgw_requests_total"
        and labels.get("model") == "sensor_mlp"
        and labels.get("transport") == "mqtt"
        and labels.get("outcome") == "ok"
    )


async def test_a_reused_request_id_gets_a_409_reply(
    gateway_mqtt: Gateway, broker: Broker, reference: Reference
) -> None:
    meta = reference.metadata("sensor_mlp")
    rng = np.random.default_rng(4)
    proto = gateway_mqtt.settings.mqtt.protocol
    rid = f"reused-{proto}"
    async with device(broker.port, f"dev-reuse-{proto}", v5=proto == "5") as dev:
        first = await dev.request("sensor_mlp", json_payload(random_inputs(meta, 1, rng), rid), rid)
        other = json_payload(random_inputs(meta, 1, rng), rid)  # another request, same id
        reused = await dev.request("sensor_mlp", other, rid)
    assert first["status"] == 200
    assert reused["status"] == 409 and reused["reason"] == "duplicate_id", reused
    assert rid in reused["error"]


def _requests_counted(gw: Gateway) -> dict[tuple[str, str], float]:
    """iotgw_requests_total of sensor_mlp by (transport, outcome)."""
    counted: dict[tuple[str, str], float] = {}
    for name, labels, value in metric_samples(gw.metrics.render().decode()):
        if name == "iotgw_requests_total" and labels.get("model") == "sensor_mlp":
            key = (labels["transport"], labels["outcome"])
            counted[key] = counted.get(key, 0.0) + value
    return counted


async def test_requests_are_counted_by_transport_and_outcome(
    gateway_mqtt: Gateway, broker: Broker, reference: Reference
) -> None:
    inputs = random_inputs(reference.metadata("sensor_mlp"), 1, np.random.default_rng(5))
    wrong_shape = {"features": np.zeros((1, 5), dtype=np.float32)}
    proto = gateway_mqtt.settings.mqtt.protocol
    before = _requests_counted(gateway_mqtt)
    async with device(broker.port, f"dev-count-{proto}", v5=True) as dev:
        for i in range(3):
            reply = await dev.request("sensor_mlp", json_payload(inputs, f"n{i}"), f"n{i}")
            assert reply["status"] == 200
        bad = await dev.request("sensor_mlp", json_payload(wrong_shape, "bad"), "bad")
        assert bad["status"] == 400
    after = _requests_counted(gateway_mqtt)
    grown = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
    assert grown == {("mqtt", "ok"): 3, ("mqtt", "bad_request"): 1}


async def test_embedded_broker_round_trip(
    demo_repo: Path, tmp_path: Path, reference: Reference
) -> None:
    settings = mqtt_settings(demo_repo, tmp_path, embedded_port=0)
    async with Gateway(settings) as gw:
        await gw.wait_loaded()
        assert gw.broker is not None and gw.mqtt is not None
        await asyncio.wait_for(gw.mqtt.connected.wait(), 10)
        meta = reference.metadata("sensor_mlp")
        inputs = random_inputs(meta, rows=2, rng=np.random.default_rng(5))
        async with device(gw.broker.port, "dev-embedded", v5=False) as dev:
            reply = await dev.request("sensor_mlp", json_payload(inputs, "e1"), "e1")
            binary = await dev.request("sensor_mlp", framed_binary_request(inputs, id="e2"), "e2")
    want = reference.infer("sensor_mlp", inputs)["probabilities"]
    for r in (reply, binary):
        np.testing.assert_allclose(outputs_of(r)["probabilities"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("correlation", [b"k-1", b"", None])
async def test_reply_properties_match_paho_serialisation(
    binary: bool, correlation: bytes | None
) -> None:
    # Replies carry properties serialised once by the adapter; they must be byte for byte what
    # paho's Properties would send.
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from gateway.mqtt.wire import BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE, reply_properties

    want = Properties(PacketTypes.PUBLISH)
    want.ContentType = BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE
    want.UserProperty = [("status", "503")]
    if correlation is not None:
        want.CorrelationData = correlation
    assert reply_properties(binary, 503, correlation).pack() == want.pack()


async def test_request_publish_parser_agrees_with_paho() -> None:
    # The adapter decodes incoming MQTT 5 requests itself; field for field it must read what
    # paho's decoder reads, and hand anything it does not know back to paho (None).
    import struct

    from paho.mqtt import _packet
    from paho.mqtt.enums import MQTTProtocolVersion
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from gateway.mqtt.wire import parse_publish

    def publish(qos: int, props: Properties | None, topic: str = "iotgw/infer/m/req/d") -> bytes:
        t = topic.encode()
        mid = struct.pack("!H", 4242) if qos else b""
        packed = props.pack() if props is not None else b"\x00"
        return struct.pack("!H", len(t)) + t + mid + packed + b"OIPB\x01\x02payload"

    full = Properties(PacketTypes.PUBLISH)
    full.ResponseTopic = "replies/d"
    full.CorrelationData = b"\x00corr\xff"
    full.MessageExpiryInterval = 30
    full.ContentType = "application/json"
    full.PayloadFormatIndicator = 0
    full.UserProperty = [("a", "1"), ("b", "2")]
    minimal = Properties(PacketTypes.PUBLISH)
    minimal.CorrelationData = b"k"
    for qos in (0, 1):
        for props in (full, minimal, None):
            header = 0x30 | (qos << 1)
            data = publish(qos, props)
            want = _packet.decode_publish(header, bytearray(data), MQTTProtocolVersion.MQTTv5)
            got = parse_publish(header, data)
            assert got is not None
            assert got.topic == want.topic.decode() and got.payload == want.payload
            assert got.qos == want.qos and got.mid == want.mid
            for name in ("ResponseTopic", "CorrelationData", "MessageExpiryInterval"):
                assert getattr(got.properties, name, None) == getattr(want.properties, name, None)
            for name in ("ContentType", "PayloadFormatIndicator", "UserProperty"):
                assert getattr(got.properties, name, None) == getattr(want.properties, name, None)
    alias = Properties(PacketTypes.PUBLISH)
    alias.TopicAlias = 3
    assert parse_publish(0x32, publish(1, alias)) is None  # a property requests do not carry
    assert parse_publish(0x34, publish(2, minimal)) is None  # QoS 2
    assert parse_publish(0x32, publish(1, alias, topic="")) is None  # topic by alias only
