"""A reply's own way out counts against its request's deadline. The MQTT adapter measures how
long its replies take from publish to the broker's PUBACK (a high percentile of the recent ones),
and a request must be answerable that much before its deadline: otherwise its reply would reach
the device late, however fast its batch ran. Live gateway, real Mosquitto.

The batch pace and the reply leg are set by hand after the real ones were measured, so what is
refused follows from the rule, not from how fast this machine is."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from gateway.main import Gateway
from tests.brokers import Broker
from tests.gateway.helpers import Reference, make_repo, random_inputs
from tests.gateway.mqtt_client import device, json_payload, mqtt_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "sensor_mlp"
PACE_S = 3.0  # the batch pace set by hand: a request needs 3 s of its budget
TIMEOUT_US = 5_000_000  # each request's budget: 5 s, enough for the pace alone


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(
    broker: Broker, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    tmp = tmp_path_factory.mktemp("reply-leg")
    repo = make_repo(tmp / "repo", demo_repo, {MODEL: None})
    async with mqtt_gateway(repo, tmp, broker=broker.url, client_id="gw-reply-leg") as gateway:
        yield gateway


def _payload(inputs: dict[str, np.ndarray], key: str) -> bytes:
    body = json.loads(json_payload(inputs, key))
    body["parameters"] = {"timeout": TIMEOUT_US}
    return json.dumps(body).encode()


async def test_a_reply_s_way_out_counts_against_the_deadline(
    gw: Gateway, broker: Broker, reference: Reference
) -> None:
    assert gw.mqtt is not None
    inputs = random_inputs(reference.metadata(MODEL), 1, np.random.default_rng(3))
    async with device(broker.port, "dev-leg") as dev:
        for i in range(3):  # answered: their replies' PUBACKs are measured
            assert (await dev.request(MODEL, _payload(inputs, f"warm-{i}"), f"warm-{i}"))[
                "status"
            ] == 200
        assert await gw.mqtt.wait_idle(30)
        assert gw.mqtt.reply_leg.high > 0.0

        batcher = gw.service.registry.host(MODEL)._batcher
        leg = gw.mqtt.reply_leg

        def recent(pace_s: float, leg_s: float, legs: int) -> None:
            """The batch pace and the replies' way out, as if just measured."""
            for _ in range(3):
                batcher.service_time.observe(1, pace_s)
            for _ in range(legs):
                leg.observe(leg_s)

        recent(PACE_S, 0.001, 3)  # the pace alone fits the budget (3 s of 5 s) ...
        fits = await dev.request(MODEL, _payload(inputs, "fits"), "fits")
        assert fits["status"] == 200, fits
        # ... but not once the replies' way out takes 2.5 s: refused before it runs, on the
        # device's reply topic, with the reason.
        recent(PACE_S, 2.5, 64)
        late = await dev.request(MODEL, _payload(inputs, "late"), "late")
        assert late["status"] == 503, late
        assert late["reason"] == "deadline", late
    assert await gw.mqtt.wait_idle(30), gw.mqtt.in_flight
