"""Poison payloads on both transports: each gets a specific error reply, no request is left
unanswered or unacknowledged, and every other device keeps being served afterwards."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

import gateway.edge
from gateway.main import Gateway
from tests.brokers import Broker
from tests.gateway.helpers import (
    GENEROUS_TIMEOUT_US,
    Reference,
    base_url,
    make_repo,
    metric_samples,
    random_inputs,
)
from tests.gateway.mqtt_client import device, json_payload, mqtt_gateway, outputs_of

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "sensor_mlp"
NESTED_12K = b"[" * 12_000


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    broker: Broker, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    repo = make_repo(tmp_path_factory.mktemp("repo"), demo_repo, {MODEL: None})
    cache = tmp_path_factory.mktemp("cache")
    async with mqtt_gateway(repo, cache, broker=broker.url, client_id="gw-poison") as gateway:
        yield gateway


def _good_body(reference: Reference, rid: str, rows: int = 1) -> dict[str, Any]:
    inputs = random_inputs(reference.metadata(MODEL), rows=rows, rng=np.random.default_rng(5))
    body = json.loads(json_payload(inputs, rid))
    body["parameters"] = {"timeout": GENEROUS_TIMEOUT_US}
    return body


def _with_input(reference: Reference, **changes: Any) -> bytes:
    body = _good_body(reference, "poison")
    body["inputs"][0].update(changes)
    return json.dumps(body).encode()


def _frame(header: bytes, declared: int, tail: bytes = b"") -> bytes:
    return b"OIPB" + struct.pack("<I", declared) + header + tail


# name -> (payload builder, expected status, words in the error)
POISON: dict[str, tuple[Callable[[Reference], bytes], int, str]] = {
    "nested-arrays-12k": (lambda r: NESTED_12K, 400, "nested too deeply"),
    "nested-objects": (lambda r: b'{"a":' * 5000 + b"1" + b"}" * 5000, 400, "nested too deeply"),
    "deep-data": (
        lambda r: _with_input(r, data=json.loads("[" * 50 + "1.0" + "]" * 50)),
        400,
        "levels deep",
    ),
    "nested-parameter": (
        lambda r: json.dumps({**_good_body(r, "p"), "parameters": {"x": [[[1]]]}}).encode(),
        400,
        "parameter 'x'",
    ),
    "too-many-dims": (lambda r: _with_input(r, shape=[1] * 20), 400, "dimensions exceed"),
    "too-many-elements": (
        lambda r: _with_input(r, shape=[1 << 20, 1 << 20], data=[0.0]),
        400,
        "elements",
    ),
    "too-many-inputs": (
        lambda r: json.dumps(
            {
                "id": "many",
                "inputs": [
                    {"name": f"x{i}", "datatype": "FP32", "shape": [1], "data": [0.0]}
                    for i in range(100)
                ],
            }
        ).encode(),
        400,
        "input tensors exceed",
    ),
    "empty": (lambda r: b"", 400, "empty"),
    "not-utf8": (lambda r: b"\xff\xfe{\x00", 400, "malformed JSON"),
    "not-an-object": (lambda r: b"[1, 2, 3]", 400, "JSON object"),
    "frame-header-longer-than-body": (
        lambda r: _frame(b'{"inputs": []}', 0xFFFFFFFF),
        400,
        "header length",
    ),
    "frame-short-prefix": (lambda r: b"OIPB\x01", 400, "prefix"),
}


async def _wait_idle(gw: Gateway) -> None:
    assert gw.mqtt is not None
    if not await gw.mqtt.wait_idle(30):
        raise AssertionError(f"{gw.mqtt.in_flight} MQTT requests still in flight")


async def test_a_flood_of_nested_payloads_is_answered_and_mqtt_keeps_serving(
    gw: Gateway, broker: Broker, reference: Reference
) -> None:
    """More poison messages than Receive Maximum (64): before the edge, 64 of them wedged every
    in-flight slot for good and no device was answered again."""
    async with device(broker.port, "dev2") as bad, device(broker.port, "dev-good") as good:
        poisoned = [await bad.publish(MODEL, NESTED_12K, f"nested-{i}") for i in range(100)]
        replies = [await asyncio.wait_for(f, 30) for f in poisoned]
        body = json.dumps(_good_body(reference, "g")).encode()
        goods = [await good.publish(MODEL, body, f"good-{i}") for i in range(5)]
        answered = [await asyncio.wait_for(f, 30) for f in goods]
    assert all(r["status"] == 400 and r["reason"] == "bad_request" for r in replies), replies[:3]
    assert all("nested too deeply" in r["error"] for r in replies)
    assert [r["status"] for r in answered] == [200] * 5
    await _wait_idle(gw)


@pytest.mark.parametrize("case", sorted(POISON))
async def test_poison_gets_a_specific_error_on_both_transports(
    gw: Gateway, broker: Broker, reference: Reference, case: str
) -> None:
    build, status, words = POISON[case]
    payload = build(reference)
    good = json.dumps(_good_body(reference, "after")).encode()
    url = f"{base_url(gw)}/v2/models/{MODEL}/infer"
    async with aiohttp.ClientSession() as http:
        headers = {}
        if payload.startswith(b"OIPB") and len(payload) >= 8:
            # Over HTTP the same lie travels in the header-length header.
            (declared,) = struct.unpack_from("<I", payload, 4)
            headers["Inference-Header-Content-Length"] = str(declared)
            payload_http = payload[8:]
        else:
            payload_http = payload
        async with http.post(url, data=payload_http, headers=headers) as r:
            http_status, http_reply = r.status, await r.json()
        async with http.post(url, data=good) as r:
            assert r.status == 200
    if case != "frame-short-prefix":  # an 8-byte frame prefix exists on MQTT only
        assert http_status == status, http_reply
        assert words in http_reply["error"], http_reply
    async with device(broker.port, f"dev-{case}") as dev:
        reply = await dev.request(MODEL, payload, f"poison-{case}")
        after = await dev.request(MODEL, good, f"good-{case}")
    assert reply["status"] == status and words in reply["error"], reply
    assert after["status"] == 200
    await _wait_idle(gw)


async def test_unknown_model_is_refused_before_its_body_is_read(
    gw: Gateway, broker: Broker
) -> None:
    """A poison body for a model that does not exist gets 404, not the body's 400."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base_url(gw)}/v2/models/nope/infer", data=NESTED_12K) as r:
            assert r.status == 404
            assert "nope" in (await r.json())["error"]
        async with http.post(f"{base_url(gw)}/v1/models/nope:predict", data=NESTED_12K) as r:
            assert r.status == 404
    async with device(broker.port, "dev-unknown") as dev:
        reply = await dev.request("nope", NESTED_12K, "unknown")
    assert reply["status"] == 404 and reply["reason"] == "not_found"


async def test_tfserving_nested_body_is_a_bad_request(gw: Gateway) -> None:
    url = f"{base_url(gw)}/v1/models/{MODEL}:predict"
    deep = b'{"instances": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    rows = json.dumps({"instances": [json.loads("[" * 30 + "1" + "]" * 30)]}).encode()
    async with aiohttp.ClientSession() as http:
        for body, words in ((deep, "nested too deeply"), (rows, "levels deep")):
            async with http.post(url, data=body) as r:
                assert r.status == 400
                assert words in (await r.json())["error"]


async def test_every_refusal_is_counted_by_transport_and_reason(
    gw: Gateway, broker: Broker
) -> None:
    def count(transport: str, reason: str) -> float:
        return sum(
            v
            for name, labels, v in metric_samples(gw.metrics.render().decode())
            if name == "iotgw_error_replies_total"
            and labels == {"transport": transport, "reason": reason}
        )

    before = {t: count(t, "bad_request") for t in ("http", "mqtt")}
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.post(f"{base_url(gw)}/v2/models/{MODEL}/infer", data=b"{") as r:
                assert r.status == 400
    async with device(broker.port, "dev-count") as dev:
        for i in range(2):
            assert (await dev.request(MODEL, b"{", f"c-{i}"))["status"] == 400
    assert count("http", "bad_request") - before["http"] == 3
    assert count("mqtt", "bad_request") - before["mqtt"] == 2


async def test_a_bug_in_the_service_becomes_a_500_reply_and_frees_its_slot(
    gw: Gateway, broker: Broker, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: the service raises a non-gateway exception (a bug) once per call."""

    async def broken(*args: object, **kwargs: object) -> object:
        raise KeyError("a bug")

    body = json.dumps(_good_body(reference, "bug")).encode()
    monkeypatch.setattr(gw.service, "infer", broken)
    url = f"{base_url(gw)}/v2/models/{MODEL}/infer"
    async with aiohttp.ClientSession() as http, http.post(url, data=body) as r:
        assert r.status == 500
        assert "internal error" in (await r.json())["error"]
    async with device(broker.port, "dev-bug") as dev:
        reply = await dev.request(MODEL, body, "bug")
        assert reply["status"] == 500 and reply["reason"] == "internal"
        monkeypatch.undo()
        assert (await dev.request(MODEL, body, "after-bug"))["status"] == 200
    await _wait_idle(gw)


async def test_large_payloads_are_decoded_off_the_event_loop(
    gw: Gateway, broker: Broker, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    original = gateway.edge.oip.decode_request

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(gateway.edge.oip, "decode_request", spy)
    small = _good_body(reference, "small")
    large = _good_body(reference, "large", rows=128)
    large["id"] = "x" * 300_000  # over the 256 KiB offload threshold, still a valid request
    async with aiohttp.ClientSession() as http:
        for body in (small, large):
            url = f"{base_url(gw)}/v2/models/{MODEL}/infer"
            async with http.post(url, data=json.dumps(body).encode()) as r:
                assert r.status == 200
    async with device(broker.port, "dev-large") as dev:
        for key, body in (("s", small), ("l", large)):
            reply = await dev.request(MODEL, json.dumps(body).encode(), key)
            assert reply["status"] == 200
            assert outputs_of(reply)["probabilities"].shape[0] == body["inputs"][0]["shape"][0]
    loop_thread = threading.current_thread().name
    assert threads[0] == loop_thread and threads[2] == loop_thread  # small: inline
    assert threads[1] != loop_thread and threads[3] != loop_thread  # large: on the executor


async def _publish_with_response_topic(
    port: int, device_id: str, response_topic: str, payload: bytes
) -> dict[str, Any]:
    """Publish one request naming ``response_topic``; the reply expected on the device's own
    default reply topic (where refusals go)."""
    import aiomqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from tests.gateway.mqtt_client import decode_reply

    async with aiomqtt.Client(
        "127.0.0.1", port, identifier=device_id, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        await client.subscribe(f"iotgw/infer/{MODEL}/res/{device_id}", qos=1)
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = response_topic
        props.CorrelationData = b"deep"
        await client.publish(
            f"iotgw/infer/{MODEL}/req/{device_id}", payload, qos=1, properties=props
        )
        async with asyncio.timeout(60):
            async for message in client.messages:
                assert isinstance(message.payload, bytes)
                return decode_reply(message.payload)
    raise AssertionError("no reply")


async def test_a_response_topic_deeper_than_brokers_take_is_refused(
    gw: Gateway, broker: Broker, reference: Reference
) -> None:
    """Mosquitto drops a client that publishes to more than 200 levels: the gateway refuses such
    a Response Topic itself (403 on the device's own topic) instead of publishing there."""
    deep = f"iotgw/infer/{MODEL}/res/dev-deep/" + "x/" * 250 + "end"
    body = json.dumps(_good_body(reference, "deep")).encode()
    reply = await _publish_with_response_topic(broker.port, "dev-deep", deep, body)
    assert reply["status"] == 403 and reply["reason"] == "forbidden_response_topic", reply
    assert "levels" in reply["error"]
    async with device(broker.port, "dev-after-deep") as dev:
        assert (await dev.request(MODEL, body, "after-deep"))["status"] == 200
    await _wait_idle(gw)


async def test_a_reply_the_broker_keeps_refusing_ends_as_an_error_not_a_loop(
    gw: Gateway, broker: Broker, reference: Reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth, with the topic check switched off (fault injection): a reply whose
    publish makes the broker drop the gateway would come back after every reconnect. After a
    few lost replies the request is answered with a 502 on the device's own reply topic."""
    import gateway.mqtt.trust

    monkeypatch.setattr(gateway.mqtt.trust, "MAX_REPLY_TOPIC_LEVELS", 100_000)
    deep = f"iotgw/infer/{MODEL}/res/dev-loop/" + "x/" * 250 + "end"
    body = json.dumps(_good_body(reference, "loop")).encode()
    reply = await _publish_with_response_topic(broker.port, "dev-loop", deep, body)
    assert reply["status"] == 502 and reply["reason"] == "undeliverable", reply
    assert gw.mqtt is not None
    await asyncio.wait_for(gw.mqtt.connected.wait(), 30)
    async with device(broker.port, "dev-after-loop") as dev:
        assert (await dev.request(MODEL, body, "after-loop"))["status"] == 200
    await _wait_idle(gw)
