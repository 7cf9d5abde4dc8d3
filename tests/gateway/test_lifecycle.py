"""The gateway's life seen from outside, on real processes: readiness that waits for the MQTT
subscription, a drain on SIGTERM that answers every request in flight, and a failed start that
leaves nothing running."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from gateway.brokers.mosquitto import broker_dir
from tests.brokers import free_port, mosquitto
from tests.gateway.helpers import json_request, make_repo
from tests.gateway.mqtt_client import device, json_payload, outputs_of
from tests.gateway.serve_process import mosquitto_children, port_free, serve, serve_command

pytestmark = pytest.mark.slow

# Reconnect attempts close together, so that the gateway finds the broker soon after it starts.
FAST_RECONNECT = {"IOTGW_MQTT__RECONNECT_MIN_S": "0.05", "IOTGW_MQTT__RECONNECT_MAX_S": "0.2"}


@pytest.fixture(scope="module")
def small_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ONNX model: quick to load in every gateway process these tests start."""
    return make_repo(tmp_path_factory.mktemp("repo"), demo_repo, {"sensor_mlp": None})


def waiting_for(body: dict[str, Any]) -> list[str]:
    return list(body.get("waiting_for", []))


async def test_ready_only_once_subscribed(small_repo: Path, tmp_path: Path) -> None:
    broker_port = free_port()  # nothing listens there yet
    with serve(
        small_repo, tmp_path, "--broker", f"mqtt://127.0.0.1:{broker_port}", env=FAST_RECONNECT
    ) as gw:
        body = gw.wait_readiness(
            lambda status, body: status == 503 and "models: loading" not in waiting_for(body),
            "503 with the models loaded",
        )
        assert body["ready"] is False
        assert [w.split(" ")[:3] for w in waiting_for(body)] == [["mqtt:", "not", "subscribed"]]
        inputs = await _mlp_inputs(gw.url)
        with mosquitto(tmp_path, port=broker_port) as broker:
            gw.wait_ready()
            async with device(broker.port, "dev-ready", v5=True) as dev:
                # Published the moment readiness says 200: the subscription must already exist.
                reply = await dev.request("sensor_mlp", json_payload(inputs, "r1"), "r1")
            assert reply["status"] == 200 and "probabilities" in outputs_of(reply)
        # The broker is gone: not ready again until the gateway is subscribed anew.
        body = gw.wait_readiness(lambda status, _: status == 503, "503 without the broker")
        assert any(w.startswith("mqtt: not subscribed") for w in waiting_for(body))
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0


async def test_sigterm_drains_http_requests_in_flight(demo_repo: Path, tmp_path: Path) -> None:
    # Batches wait 3 s to fill: the requests are still in flight when SIGTERM arrives.
    repo = make_repo(
        tmp_path / "repo",
        demo_repo,
        {"sensor_mlp": {"batching": {"max_batch_size": 64, "batch_timeout_ms": 3000.0}}},
    )
    count = 6
    with serve(repo, tmp_path, "--no-mqtt", "--log-level", "INFO") as gw:
        gw.wait_ready()
        meta_inputs = await _mlp_inputs(gw.url)
        body = json_request(meta_inputs, timeout_us=60_000_000)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            requests = [
                asyncio.create_task(_post(http, f"{gw.url}/v2/models/sensor_mlp/infer", body))
                for _ in range(count)
            ]
            await _wait_queued(http, gw.url, count)
            gw.process.send_signal(signal.SIGTERM)
            during = await _readiness_once_signalled(http, gw.url)
            statuses = await asyncio.gather(*requests)
        assert "gateway: shutting down" in during["waiting_for"]
        assert statuses == [200] * count
        assert gw.wait_exit() == 0


async def _mlp_inputs(url: str) -> dict[str, np.ndarray]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{url}/v2/models/sensor_mlp") as r,
    ):
        meta = await r.json()
    spec = meta["inputs"][0]
    shape = [1, *spec["shape"][1:]]
    return {spec["name"]: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> int:
    async with http.post(url, json=body) as r:
        await r.read()
        return r.status


async def _readiness_once_signalled(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """The first readiness body that is not 200 (the signal reaches the loop asynchronously)."""
    for _ in range(3000):
        async with http.get(f"{url}/v2/health/ready") as r:
            if r.status != 200:
                assert r.status == 503
                body: dict[str, Any] = await r.json()
                return body
        await asyncio.sleep(0.01)
    raise AssertionError("readiness stayed 200 after SIGTERM")


async def _wait_queued(http: aiohttp.ClientSession, url: str, count: int) -> None:
    """Until the model has taken ``count`` requests (its stats say so)."""
    for _ in range(3000):
        async with http.get(f"{url}/admin/models/sensor_mlp/stats?window_s=600") as r:
            stats = await r.json()
        if stats["arrived"] >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the requests never arrived: {stats}")


def test_failed_start_closes_what_it_opened(small_repo: Path, tmp_path: Path) -> None:
    broker_port = free_port()
    # An address of no interface here: HTTP fails only when it binds, after the broker started.
    args = ("--mqtt-port", str(broker_port), "--host", "192.0.2.1")
    done = subprocess.run(
        serve_command(small_repo, tmp_path, free_port(), *args),
        capture_output=True,
        timeout=120,
        env={**os.environ, "IOTGW_HTTP__ADMIN_TOKEN": "lifecycle-admin-0123"},
    )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 1
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        "iotgw serve: HTTP host 192.0.2.1 is not an address of this machine (set --host)"
    )
    assert "embedded MQTT broker (mosquitto" in stderr  # it had started before HTTP failed
    assert mosquitto_children(broker_dir(tmp_path, broker_port) / "mosquitto.conf") == []
    assert port_free(broker_port)


def test_every_busy_port_is_told_at_once_before_anything_starts(
    small_repo: Path, tmp_path: Path
) -> None:
    with socket.socket() as http, socket.socket() as grpc, socket.socket() as mqtt:
        for taken in (http, grpc, mqtt):
            taken.bind(("127.0.0.1", 0))
            taken.listen()
        http_port, grpc_port = http.getsockname()[1], grpc.getsockname()[1]
        broker_port = mqtt.getsockname()[1]
        args = ("--mqtt-port", str(broker_port), "--grpc-port", str(grpc_port))
        done = subprocess.run(
            serve_command(small_repo, tmp_path, http_port, *args),
            capture_output=True,
            timeout=120,
        )
        stderr = done.stderr.decode(errors="replace")
        assert done.returncode == 1
        assert stderr.strip().splitlines()[-1] == (
            f"iotgw serve: HTTP port {http_port}, gRPC port {grpc_port} and embedded MQTT broker "
            f"port {broker_port} are in use (set --http-port, --grpc-port and --mqtt-port; "
            "--broker for an external broker instead of the embedded one)"
        )
        mqtt.close()  # one left busy: named alone, as before
        grpc.close()
        done = subprocess.run(
            serve_command(small_repo, tmp_path, http_port, *args),
            capture_output=True,
            timeout=120,
        )
        stderr = done.stderr.decode(errors="replace")
    assert stderr.strip().splitlines()[-1] == (
        f"iotgw serve: HTTP port {http_port} is in use (set --http-port)"
    )
    assert "embedded MQTT broker" not in stderr  # nothing started, nothing written
    assert not (tmp_path / "mosquitto").exists()
