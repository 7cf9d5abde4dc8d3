"""Ingest processes (``--ingest-processes N``) on real processes: HTTP connections spread over
them on one port and MQTT requests over the shared subscription, answered exactly as the
in-process transports answer (same outputs, same refusals, counted in the serving process's
metrics); a killed ingest process is replaced; SIGTERM drains them and leaves none behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from tests.brokers import mosquitto
from tests.gateway.helpers import Reference, json_request, make_repo, metric_samples, random_inputs
from tests.gateway.mqtt_client import device, json_payload, outputs_of
from tests.gateway.serve_process import Serve, serve

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="function")]

MODEL = "sensor_mlp"


@pytest.fixture(scope="module")
def small_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("ingest") / "repo", demo_repo, {MODEL: None})


def ingest_children(parent: int) -> list[int]:
    """Pids of the ingest processes whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited while we looked
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"gateway.ingest.worker" in argv:
            found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


async def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        assert r.status == 200
        return metric_samples(await r.text())


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(
        v
        for n, lab, v in samples
        if n == name and all(lab.get(k) == want for k, want in labels.items())
    )


async def eventually(url: str, name: str, want: float, **labels: str) -> float:
    """The counter's value once it reached ``want`` (ingest processes report counts each
    second), or the last value seen after 20 s."""
    return await _polled(url, name, lambda value: value >= want, **labels)


async def settles(url: str, name: str, want: float, **labels: str) -> float:
    """The gauge's value once it equals ``want``, or the last value seen after 20 s."""
    return await _polled(url, name, lambda value: value == want, **labels)


async def _polled(url: str, name: str, done: Callable[[float], bool], **labels: str) -> float:
    deadline = time.monotonic() + 20
    while True:
        value = total(await scrape(url), name, **labels)
        if done(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


async def infer_on_new_connection(url: str, inputs: dict[str, np.ndarray]) -> dict[str, object]:
    # A fresh connection each time: the kernel picks the ingest process per connection.
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(f"{url}/v2/models/{MODEL}/infer", json=json_request(inputs)) as r,
    ):
        assert r.status == 200, await r.text()
        body: dict[str, object] = await r.json()
        return body


@pytest.fixture
def gateway_with_broker(small_repo: Path, tmp_path: Path) -> Iterator[Serve]:
    with (
        mosquitto(tmp_path) as broker,
        serve(small_repo, tmp_path, "--ingest-processes", "2", "--broker", broker.url) as gw,
    ):
        gw.wait_ready()
        yield gw


async def test_http_and_mqtt_are_served_by_the_ingest_processes(
    gateway_with_broker: Serve, demo_repo: Path
) -> None:
    gw = gateway_with_broker
    workers = ingest_children(gw.process.pid)
    assert len(workers) == 2
    ref = Reference(demo_repo)
    rng = np.random.default_rng(7)
    metadata = ref.metadata(MODEL)
    try:
        requests = [random_inputs(metadata, 1 + i % 3, rng) for i in range(60)]
        bodies = await asyncio.gather(*(infer_on_new_connection(gw.url, r) for r in requests))
        for inputs, body in zip(requests, bodies, strict=True):
            out = body["outputs"][0]  # type: ignore[index]
            got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
            np.testing.assert_allclose(got, ref.infer(MODEL, inputs)["probabilities"], atol=1e-6)

        # MQTT: the ingest processes are the members of the gateway's share group.
        mqtt_inputs = [random_inputs(metadata, 1, rng) for _ in range(40)]
        broker_port = _broker_port(gw)
        async with device(broker_port, "dev-ingest") as dev:
            futures = [
                await dev.publish(MODEL, json_payload(x, id=f"r{i}"), f"r{i}")
                for i, x in enumerate(mqtt_inputs)
            ]
            replies = await asyncio.wait_for(asyncio.gather(*futures), 60)
        for inputs, reply in zip(mqtt_inputs, replies, strict=True):
            assert reply["status"] == 200, reply
            np.testing.assert_allclose(
                outputs_of(reply)["probabilities"],
                ref.infer(MODEL, inputs)["probabilities"],
                atol=1e-6,
            )
    finally:
        ref.close()

    samples = await scrape(gw.url)
    # Counted once, in the serving process, under the transport they came by.
    assert total(samples, "iotgw_requests_total", transport="http", outcome="ok") == 60
    assert total(samples, "iotgw_requests_total", transport="mqtt", outcome="ok") == 40
    per_process = [total(samples, "iotgw_ingest_requests_total", process=str(i)) for i in (0, 1)]
    assert sum(per_process) == 100
    assert all(n > 0 for n in per_process), per_process  # both processes took connections
    # Each ingest process's MQTT session, as it reports it (every 0.5 s): connected, and once
    # the last acknowledgement's bookkeeping is reported, nothing in flight or waiting.
    for process in ("0", "1"):
        assert total(samples, "iotgw_ingest_mqtt", process=process, state="mqtt_connected") == 1
        for state in ("mqtt_in_flight", "mqtt_backlog"):
            labels = {"process": process, "state": state}
            assert await settles(gw.url, "iotgw_ingest_mqtt", 0, **labels) == 0, labels


def _broker_port(gw: Serve) -> int:
    marker = "--broker"
    argv = gw.process.args
    assert isinstance(argv, list)
    url = str(argv[argv.index(marker) + 1])
    return int(url.rsplit(":", 1)[1])


async def test_refusals_and_other_routes_match_the_single_process_gateway(
    gateway_with_broker: Serve,
) -> None:
    gw = gateway_with_broker
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gw.url}/v2/models/nope/infer", data=b"{}") as r:
            assert r.status == 404
            assert (await r.json()) == {"error": f"unknown model 'nope'; served: {MODEL}"}
        async with s.post(f"{gw.url}/v2/models/{MODEL}/infer", data=b"[[[") as r:
            assert r.status == 400
            assert "malformed" in (await r.json())["error"]
        body = json_request({"features": np.zeros((1, 5), np.float32)})
        async with s.post(f"{gw.url}/v2/models/{MODEL}/infer", json=body) as r:
            assert r.status == 400  # shape checked by the serving process, refusal passed back
            assert "features" in (await r.json())["error"]
        # Everything else is the serving process's answer, passed on.
        async with s.get(f"{gw.url}/v2/models/{MODEL}") as r:
            assert r.status == 200
            assert (await r.json())["name"] == MODEL
        async with s.get(f"{gw.url}/v2/health/ready") as r:
            assert r.status == 200
        async with s.get(f"{gw.url}/v2/nothing-here") as r:
            assert r.status == 404
    # Refusals are counted where they were made and reported to the serving process.
    assert await eventually(gw.url, "iotgw_error_replies_total", 1, reason="not_found") == 1
    assert await eventually(gw.url, "iotgw_error_replies_total", 2, reason="bad_request") == 2


async def test_sigterm_drains_and_leaves_no_ingest_process(
    gateway_with_broker: Serve, demo_repo: Path
) -> None:
    gw = gateway_with_broker
    workers = ingest_children(gw.process.pid)
    rng = np.random.default_rng(3)
    ref = Reference(demo_repo)
    try:
        inputs = [random_inputs(ref.metadata(MODEL), 2, rng) for _ in range(30)]
    finally:
        ref.close()
    sending = [asyncio.ensure_future(infer_on_new_connection(gw.url, x)) for x in inputs]
    await asyncio.sleep(0.05)  # some are in flight when the signal arrives
    gw.process.send_signal(signal.SIGTERM)
    results = await asyncio.gather(*sending, return_exceptions=True)
    assert await asyncio.to_thread(gw.wait_exit) == 0, gw.text()
    # Requests either completed or were never accepted: none was cut off with an error reply.
    assert not [r for r in results if isinstance(r, AssertionError)], results
    assert not [pid for pid in workers if alive(pid)]


async def test_a_killed_ingest_process_is_replaced(small_repo: Path, tmp_path: Path) -> None:
    with serve(small_repo, tmp_path, "--ingest-processes", "2", "--no-mqtt") as gw:
        gw.wait_ready()
        first = ingest_children(gw.process.pid)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:
            now = ingest_children(gw.process.pid)
            if len(now) == 2 and first[0] not in now:
                break
            assert time.monotonic() < deadline, f"not replaced: {now}\n{gw.text()}"
            await asyncio.sleep(0.1)
        gw.wait_ready()
        zeros = {"features": np.zeros((1, 32), np.float32)}
        await asyncio.gather(*(infer_on_new_connection(gw.url, zeros) for _ in range(20)))
        samples = await scrape(gw.url)
        assert total(samples, "iotgw_ingest_restarts_total") == 1
        assert total(samples, "iotgw_requests_total", outcome="ok") == 20
        gw.process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(gw.wait_exit) == 0
