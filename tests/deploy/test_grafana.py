"""The Grafana dashboard queries only metrics a live gateway exposes (a renamed metric fails
here), and the probes the Kubernetes manifests declare are answered by a live gateway."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.conftest import DEPLOY
from tests.deploy.test_kubernetes import K8S, render
from tests.gateway.helpers import base_url, make_repo, running_gateway

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "iotgw.json"
# A metric name in PromQL: iotgw_ then name characters, not followed by more of them.
_METRIC = re.compile(r"\biotgw_[a-zA-Z0-9_:]+")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def exposed_names(exposition: str) -> set[str]:
    """Every sample name /metrics has or will have: each family's type says which (a labelled
    family without children yet has no samples but is declared)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(s.name for s in family.samples)
        suffixes = _SUFFIXES.get(family.type, ("",))
        names.update(family.name + suffix for suffix in suffixes)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels, "the dashboard has no panels"
    return [t["expr"] for p in panels for t in p["targets"]]


def test_every_panel_has_a_query_and_a_unique_id() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert all(p["targets"] and all(t["expr"] for t in p["targets"]) for p in panels)


@pytest.mark.asyncio
async def test_dashboard_metrics_and_probes_exist_on_a_live_gateway(
    demo_repo: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    (sts,) = [d for d in render(K8S / "base") if d["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    probes = [container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    async with (
        running_gateway(repo, tmp_path / "cache") as gw,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(base_url(gw) + "/metrics") as r:
            assert r.status == 200
            exposition = await r.text()
        for probe in probes:
            if "grpc" in probe:  # as the kubelet asks: Check, no TLS, no token
                assert gw.grpc is not None
                async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc.port}") as channel:
                    health: Any = health_pb2_grpc.HealthStub(channel)  # the stubs type no calls
                    ask = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
                    reply = await health.Check(ask, timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, probe
                continue
            async with http.get(base_url(gw) + probe["httpGet"]["path"]) as r:
                assert r.status == 200, probe
    exposed = exposed_names(exposition)
    queried = {
        name
        for expr in dashboard_queries(json.loads(DASHBOARD.read_text()))
        for name in _METRIC.findall(expr)
    }
    wanted = {
        "iotgw_requests_total",
        "iotgw_request_latency_seconds_bucket",
        "iotgw_queue_depth",
        "iotgw_batch_rows_sum",
        "iotgw_knob",
        "iotgw_error_replies_total",
        "iotgw_tuner_decisions_total",
        "iotgw_mqtt_connected",
        "iotgw_mqtt_reconnects_total",
        "iotgw_mqtt_in_flight",
        "iotgw_mqtt_backlog",
        "iotgw_mqtt_duplicates_total",
        "iotgw_mqtt_read_pauses_total",
        "iotgw_ingest_mqtt",
    }
    assert wanted <= queried, f"the dashboard does not show {sorted(wanted - queried)}"
    assert queried <= exposed, f"queried but not exposed: {sorted(queried - exposed)}"


def test_exposed_names_follow_the_family_type() -> None:
    text = (
        "# HELP a_total x\n# TYPE a_total counter\n"
        "# HELP b x\n# TYPE b histogram\n"
        "# HELP c x\n# TYPE c gauge\nc 1\n"
    )
    assert exposed_names(text) == {"a_total", "b_bucket", "b_sum", "b_count", "c"}
