"""A broker that sends more than Receive Maximum (MQTT 3.1.1 has no such limit; amqtt, the
fallback embedded broker, speaks only 3.1.1) meets a bounded backlog: what fits waits for an
in-flight slot, the rest is answered at once with 503 and a retry hint, never dropped."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.brokers import mosquitto
from tests.gateway.helpers import Reference, make_repo, random_inputs
from tests.gateway.mqtt_client import flood

MODEL = "sensor_mlp"
REQUESTS = 20  # Mosquitto's default in-flight window for a 3.1.1 client


@pytest.mark.slow
@pytest.mark.parametrize("broker_kind", ["mosquitto-3.1.1", "embedded-amqtt"])
async def test_overflow_beyond_the_backlog_gets_503_replies_and_nothing_is_lost(
    demo_repo: Path, tmp_path: Path, reference: Reference, broker_kind: str
) -> None:
    # Requests wait up to 400 ms for a batch to fill, so the in-flight slots stay taken.
    repo = make_repo(
        tmp_path / "repo",
        demo_repo,
        {MODEL: {"batching": {"batch_timeout_ms": 400.0, "max_batch_size": 64}}},
    )
    bounds = {"client_id": "gw-backlog", "receive_maximum": 2, "max_backlog": 2}
    with contextlib.ExitStack() as stack:
        if broker_kind == "embedded-amqtt":  # the gateway starts it, in process, on a free port
            mqtt: dict[str, object] = {"embedded_broker": "amqtt", "embedded_port": 0, **bounds}
        else:
            broker = stack.enter_context(mosquitto(tmp_path))
            mqtt = {"broker": broker.url, "protocol": "3.1.1", **bounds}
        settings = GatewaySettings.load(
            http={"port": 0, "host": "127.0.0.1"},
            serving={"model_repo": repo, "cache_dir": tmp_path / "cache"},
            mqtt=mqtt,
        )
        async with Gateway(settings) as gw:
            await gw.wait_loaded()
            assert gw.mqtt is not None
            await asyncio.wait_for(gw.mqtt.connected.wait(), 10)
            port = gw.broker.port if gw.broker is not None else broker.port
            replies = await _flood(port, reference)
            assert await gw.mqtt.wait_idle(30), gw.mqtt.in_flight  # no slot leaked
    statuses = Counter(r["status"] for r in replies)
    assert sum(statuses.values()) == REQUESTS  # every request answered
    assert statuses[200] >= 2
    refused = [r for r in replies if r["status"] == 503]
    assert refused, statuses
    assert all(r["reason"] == "queue_full" and r["retry_after_s"] > 0 for r in refused)


async def _flood(port: int, reference: Reference) -> list[dict[str, Any]]:
    inputs = random_inputs(reference.metadata(MODEL), rows=1, rng=np.random.default_rng(2))
    return await flood(port, MODEL, inputs, requests=REQUESTS, device_id="dev-flood")
