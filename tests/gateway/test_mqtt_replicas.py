"""Gateways as separate processes on a real Mosquitto: two replicas splitting one shared
subscription, and a gateway restarted while devices keep publishing at QoS 1."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.brokers import mosquitto
from tests.gateway.helpers import Reference, make_repo, random_inputs
from tests.gateway.mqtt_client import Device, device, json_payload, outputs_of
from tests.gateway.processes import gateway_process, mqtt_requests_served, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="function")]

DEVICES = 20
MODEL = "sensor_mlp"


@pytest.fixture
def mlp_repo(demo_repo: Path, tmp_path: Path) -> Path:
    """The one ONNX model these gateways serve: each process starts in a fraction of the time
    the whole demo repository (TensorFlow included) takes."""
    return make_repo(tmp_path / "repo", demo_repo, {MODEL: None})


async def _marker(dev: Device, inputs: dict[str, np.ndarray], key: str) -> None:
    """A request published after everything else, answered: a duplicate reply to anything
    taken before it would have been published by then (the gateway answers in order of
    arrival, and the broker keeps the order of one publisher's messages)."""
    reply = await dev.request(MODEL, json_payload(inputs, key), key)
    assert reply["status"] == 200


async def _send_all(
    dev: Device, model: str, payloads: list[tuple[str, bytes]], window: int
) -> list[asyncio.Future[object]]:
    """Publish with at most ``window`` requests of this device unanswered at once."""
    futures: list[asyncio.Future[object]] = []
    for key, payload in payloads:
        pending = [f for f in futures if not f.done()]
        if len(pending) >= window:
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        futures.append(await dev.publish(model, payload, key))
    return futures


async def test_two_replicas_share_the_load_and_answer_every_request_once(
    mlp_repo: Path, tmp_path: Path, reference: Reference
) -> None:
    per_device = 100
    meta = reference.metadata(MODEL)
    inputs = random_inputs(meta, rows=1, rng=np.random.default_rng(11))
    want = reference.infer(MODEL, inputs)["probabilities"]
    with (
        mosquitto(tmp_path) as broker,
        gateway_process(mlp_repo, tmp_path, broker=broker.url, client_id="gw-a") as gw_a,
        gateway_process(mlp_repo, tmp_path, broker=broker.url, client_id="gw-b") as gw_b,
    ):

        async def run_device(i: int) -> Device:
            async with device(broker.port, f"rep-{i}", v5=True) as dev:
                payloads = [
                    (f"{i}-{j}", json_payload(inputs, f"{i}-{j}")) for j in range(per_device)
                ]
                futures = await _send_all(dev, MODEL, payloads, window=8)
                await asyncio.wait_for(asyncio.gather(*futures), 120)
                await _marker(dev, inputs, f"{i}-marker")
                return dev

        devices = await asyncio.gather(*(run_device(i) for i in range(DEVICES)))
        served = [mqtt_requests_served(gw.metrics()) for gw in (gw_a, gw_b)]

    keys = Counter(k for dev in devices for k, _ in dev.replies if not str(k).endswith("-marker"))
    assert len(keys) == DEVICES * per_device  # every request answered...
    assert set(keys.values()) == {1}  # ...exactly once
    for dev in devices:
        for _, reply in dev.replies:
            assert reply["status"] == 200
            np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5)
    assert sum(served) == DEVICES * (per_device + 1)  # markers included: none computed twice
    assert min(served) > 0, f"one replica served nothing: {served}"


@pytest.mark.parametrize(
    ("stop_signal", "exit_status"),
    [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 0)],
    ids=["kill", "term"],
)
async def test_restarted_gateway_answers_every_request_published_meanwhile(
    mlp_repo: Path, tmp_path: Path, reference: Reference, stop_signal: int, exit_status: int
) -> None:
    total, rate = 300, 100.0  # requests, per second: the gateway is down for part of it
    meta = reference.metadata(MODEL)
    inputs = random_inputs(meta, rows=1, rng=np.random.default_rng(12))
    want = reference.infer(MODEL, inputs)["probabilities"]
    with mosquitto(tmp_path) as broker:
        gw = start_gateway(mlp_repo, tmp_path, broker=broker.url, client_id="gw-restart")
        try:
            async with device(broker.port, "restart-dev", v5=True) as dev:
                futures = []
                stopped: asyncio.Task[int] | None = None
                for j in range(total):
                    key = f"r-{j}"
                    futures.append(await dev.publish(MODEL, json_payload(inputs, key), key))
                    if j == total // 3:  # down while the rest is published
                        stopped = asyncio.create_task(asyncio.to_thread(gw.stop, stop_signal))
                    await asyncio.sleep(1 / rate)
                assert stopped is not None
                # A graceful stop exits 0 (a drain that hangs fails here, it is not killed).
                assert await stopped == exit_status, gw.log.read_text()
                down_while = sum(1 for f in futures if not f.done())
                gw = start_gateway(mlp_repo, tmp_path, broker=broker.url, client_id="gw-restart")
                await asyncio.wait_for(asyncio.gather(*futures), 120)
                await _marker(dev, inputs, "marker")
        finally:
            gw.stop(signal.SIGKILL)
    keys = Counter(k for k, _ in dev.replies if k != "marker")
    assert down_while > 0  # requests really waited for the restart
    assert set(keys) == {f"r-{j}" for j in range(total)}  # none lost
    if stop_signal == signal.SIGTERM:
        # A graceful stop answers what it took before leaving: nothing is answered twice.
        assert set(keys.values()) == {1}
    for _, reply in dev.replies:
        assert reply["status"] == 200
        np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5)
