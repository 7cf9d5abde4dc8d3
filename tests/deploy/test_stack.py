"""deploy/compose.yaml's stack run for real, without a container engine (tests/deploy/stack.py
says how): Mosquitto with the shipped configuration, ACL and a password file made at run time,
the two gateway replicas on one shared subscription with their own accounts and client ids,
and a real Prometheus (Debian's, from the package the test command takes it out of) with the
shipped scrape configuration. Devices publish requests and get every reply; Prometheus scrapes
both replicas with the metrics token, counts every request once and splits them over the two;
every query of the Grafana dashboard evaluates against it. Grafana itself is not run."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from tests.deploy.conftest import load_one
from tests.deploy.stack import (
    COMPOSE,
    DOCKERFILE,
    IMAGE_COMMANDS,
    IOTGW_IMAGE_ENV,
    Stack,
    prometheus_api,
    running_stack,
)
from tests.deploy.test_grafana import DASHBOARD
from tests.gateway.helpers import Reference, make_repo, random_inputs
from tests.gateway.mqtt_client import device, json_payload, outputs_of

MODEL = "sensor_mlp"
# Devices are broker accounts whose user name is their device id (deploy/mosquitto/acl).
DEVICES = {f"sensor-{i:04d}": f"device-secret-{i}" for i in range(4)}
PER_DEVICE = 10
SENT = len(DEVICES) * PER_DEVICE
# Prometheus scrapes every 5 s (deploy/prometheus/prometheus.yml): a few scrapes' worth.
SCRAPES_S = 60.0
T = TypeVar("T")


def eventually(what: str, probe: Callable[[], T | None], timeout_s: float = SCRAPES_S) -> T:
    """``probe``'s first truthy value, asked until ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def test_the_images_run_what_the_stack_runs_for_them() -> None:
    """The stack's stand-ins follow ./Dockerfile and name every image of the compose file."""
    dockerfile = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["iotgw", "serve"]' in dockerfile
    for key, value in IOTGW_IMAGE_ENV.items():
        assert re.search(rf"\b{key}={re.escape(value)}\s", dockerfile), key
    images = {s["image"] for s in load_one(COMPOSE)["services"].values()}
    assert {i for i in images if not i.startswith("grafana/")} == set(IMAGE_COMMANDS)


async def _publish(
    stack: Stack, inputs: dict[str, np.ndarray], want: np.ndarray, round: str
) -> None:
    """Every device's requests at once; every reply is the model's answer."""
    broker = stack.services["mosquitto"]

    async def one(device_id: str, password: str) -> list[dict[str, Any]]:
        async with device(broker.port, device_id, password=password) as dev:
            keys = [f"{round}-{device_id}-{j}" for j in range(PER_DEVICE)]
            futures = [await dev.publish(MODEL, json_payload(inputs, k), k) for k in keys]
            return list(await asyncio.wait_for(asyncio.gather(*futures), 60))

    per_device = await asyncio.gather(*(one(d, p) for d, p in DEVICES.items()))
    replies = [reply for replies in per_device for reply in replies]
    assert len(replies) == SENT
    for reply in replies:
        assert reply["status"] == 200, reply
        np.testing.assert_allclose(outputs_of(reply)["probabilities"], want, rtol=1e-5)


def _served_by_instance(stack: Stack) -> dict[str, float]:
    query = 'sum by (instance) (iotgw_requests_total{transport="mqtt"})'
    result = prometheus_api(stack, "query", query=query)["result"]
    return {r["metric"]["instance"]: float(r["value"][1]) for r in result}


def _counted(stack: Stack, total: int) -> dict[str, float]:
    """Requests served per gateway as Prometheus scraped them, once they add up to ``total``."""

    def all_counted() -> dict[str, float]:
        served = _served_by_instance(stack)
        return served if sum(served.values()) == total else {}

    return eventually(f"{total} requests counted", all_counted)


def dashboard_queries() -> dict[str, list[str]]:
    """Each panel's queries by title, with the dashboard's variables at their current values
    (a query variable on "All" takes its allValue), as Grafana sends them."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = {}
    for variable in dashboard["templating"]["list"]:
        current = variable["current"]["value"]
        values[variable["name"]] = variable["allValue"] if current == "$__all" else current
    names = "|".join(sorted(map(re.escape, values), key=len, reverse=True))
    pattern = re.compile(rf"\$\{{({names})\}}|\$({names})\b")

    def substitute(expr: str) -> str:
        return pattern.sub(lambda m: values[m.group(1) or m.group(2)], expr)

    return {
        p["title"]: [substitute(t["expr"]) for t in p["targets"]]
        for p in dashboard["panels"]
        if p["type"] != "row"
    }


# The transports this test sends requests over: a panel of another transport's requests (the
# gRPC row) has nothing to show here.
DRIVEN_TRANSPORTS = frozenset({"mqtt"})
_TRANSPORT = re.compile(r'transport="([a-z]+)"')


def _rate_queries(panels: dict[str, list[str]]) -> list[str]:
    """The queries of the panels that show request rates and their latency quantiles, over
    every transport or one this test drives."""
    metrics = ("iotgw_requests_total", "iotgw_request_latency_seconds_bucket")
    return [
        e
        for exprs in panels.values()
        for e in exprs
        if "rate(" in e
        and e.count(metrics[0]) + e.count(metrics[1])
        and set(_TRANSPORT.findall(e)) <= DRIVEN_TRANSPORTS
    ]


def _check_dashboard(stack: Stack, gateways: set[str]) -> None:
    """Every query evaluates; the instance variable lists both replicas; the request-rate and
    request-latency panels show positive numbers."""
    variable = prometheus_api(stack, "label/instance/values", **{"match[]": "iotgw_model_ready"})
    assert set(variable) == gateways
    panels = dashboard_queries()
    for expr in (e for exprs in panels.values() for e in exprs):
        prometheus_api(stack, "query", query=expr)  # fails on an error answer
    rate_queries = _rate_queries(panels)
    assert len(rate_queries) >= 4  # requests/s, and latency p50, p95, p99

    def positive(expr: str) -> list[float]:
        values = [
            float(r["value"][1]) for r in prometheus_api(stack, "query", query=expr)["result"]
        ]
        return values if values and all(v > 0 for v in values) else []

    for expr in rate_queries:
        eventually(f"{expr} > 0", lambda: positive(expr))  # noqa: B023


@pytest.mark.slow
def test_compose_stack_serves_devices_and_prometheus_sees_both_replicas(
    demo_repo: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {MODEL: None})
    reference = Reference(repo)
    inputs = random_inputs(reference.metadata(MODEL), rows=1, rng=np.random.default_rng(17))
    want = reference.infer(MODEL, inputs)["probabilities"]
    reference.close()
    with running_stack(tmp_path / "stack", repo, DEVICES) as stack:
        gateways = {f"127.0.0.1:{g.port}" for g in stack.gateways()}
        asyncio.run(_publish(stack, inputs, want, "first"))

        def targets_up() -> set[str]:
            active = prometheus_api(stack, "targets")["activeTargets"]
            healthy = {t["labels"]["instance"] for t in active if t["health"] == "up"}
            return healthy if len(active) == len(healthy) == 2 else set()

        assert eventually("both targets up", targets_up) == gateways
        _counted(stack, SENT)
        # Once the request counters have a first sample, a second round gives them a rate.
        asyncio.run(_publish(stack, inputs, want, "second"))
        served = _counted(stack, 2 * SENT)
        assert set(served) == gateways
        assert min(served.values()) > 0, f"one replica served nothing: {served}"
        _check_dashboard(stack, gateways)
