"""A flood beyond the MQTT in-flight bound and the backlog: the oldest waiting requests are the
ones refused (503 queue_full, with a retry hint), the newest are served first, and refusals
hold no serving slot while their replies await the broker's acknowledgement. Under sustained
overload a first-in-first-out backlog would serve only requests that had already waited out
their deadlines in it, and refusals holding slots would leave none for serving.

Mosquitto sends a 3.1.1 client its whole window (20) at once, while the gateway's two serving
slots are held by a batch that waits (up to 400 ms) to fill: which requests are refused follows
from the rule alone."""

from __future__ import annotations

import asyncio
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
SLOTS, BACKLOG = 2, 2


@pytest.mark.slow
async def test_the_oldest_waiting_are_refused_and_the_newest_served(
    demo_repo: Path, tmp_path: Path, reference: Reference
) -> None:
    repo = make_repo(
        tmp_path / "repo",
        demo_repo,
        {MODEL: {"batching": {"batch_timeout_ms": 400.0, "max_batch_size": 64}}},
    )
    with mosquitto(tmp_path) as broker:
        settings = GatewaySettings.load(
            http={"port": 0, "host": "127.0.0.1"},
            serving={"model_repo": repo, "cache_dir": tmp_path / "cache"},
            mqtt={
                "broker": broker.url,
                "protocol": "3.1.1",
                "client_id": "gw-overflow",
                "receive_maximum": SLOTS,
                "max_backlog": BACKLOG,
            },
        )
        async with Gateway(settings) as gw:
            await gw.wait_loaded()
            assert gw.mqtt is not None
            await asyncio.wait_for(gw.mqtt.connected.wait(), 10)
            replies = await _flood(broker.port, reference)
            assert await gw.mqtt.wait_idle(30), gw.mqtt.in_flight  # no slot leaked
    by_id = {r["id"]: r for r in replies}
    assert len(by_id) == REQUESTS  # every request answered, once
    served = sorted(int(i.split("-")[1]) for i, r in by_id.items() if r["status"] == 200)
    # The first two took the slots; of the rest, the last two were waiting when they freed.
    assert served == [0, 1, REQUESTS - 2, REQUESTS - 1]
    refused = [r for r in by_id.values() if r["status"] != 200]
    assert all(r["status"] == 503 and r["reason"] == "queue_full" for r in refused)
    assert all(r["retry_after_s"] > 0 for r in refused)


async def _flood(port: int, reference: Reference) -> list[dict[str, Any]]:
    inputs = random_inputs(reference.metadata(MODEL), rows=1, rng=np.random.default_rng(2))
    return await flood(port, MODEL, inputs, requests=REQUESTS, device_id="dev-overflow")
