"""Prometheus metrics: requests by model and outcome, the latency and batch histograms, queue
depth, rejections and the knobs in force."""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest

from gateway.main import Gateway
from tests.gateway.helpers import (
    binary_request,
    infer_binary,
    json_request,
    metric_samples,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

MODEL = {"model": "sensor_fusion_tf", "version": "1"}


async def _scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, frozenset], float]:
    async with http.get(f"{url}/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    return {
        (name, frozenset(labels.items())): value for name, labels, value in metric_samples(text)
    }


def _value(samples: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def test_metrics_count_requests_batches_rejections_and_knobs(
    http: aiohttp.ClientSession, url: str, gateway: Gateway
) -> None:
    before = await _scrape(http, url)
    rng = np.random.default_rng(1)
    ok_rows = [1, 3, 2]
    for rows in ok_rows:
        x = {
            "accel": rng.standard_normal((rows, 3)).astype(np.float32),
            "temperature": rng.standard_normal((rows, 1)).astype(np.float32),
        }
        status, outputs, _ = await infer_binary(http, url, "sensor_fusion_tf", x)
        assert status == 200, outputs
    # One request the model refuses (shape) and one that cannot meet its deadline.
    bad = json_request(
        {"accel": np.zeros((1, 4), np.float32), "temperature": np.zeros((1, 1), np.float32)}
    )
    async with http.post(f"{url}/v2/models/sensor_fusion_tf/infer", json=bad) as r:
        assert r.status == 400
    late, headers = binary_request(
        {"accel": np.zeros((1, 3), np.float32), "temperature": np.zeros((1, 1), np.float32)},
        timeout_us=1,
    )
    async with http.post(
        f"{url}/v2/models/sensor_fusion_tf/infer", data=late, headers=headers
    ) as r:
        assert r.status == 503
    after = await _scrape(http, url)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    # Requests by model and outcome.
    req = "iotgw_requests_total"
    assert delta(req, **MODEL, transport="http", outcome="ok") == len(ok_rows)
    assert delta(req, **MODEL, transport="http", outcome="bad_request") == 1
    assert delta(req, **MODEL, transport="http", outcome="deadline") == 1
    # Histograms: every request that reached the model has a latency; every served one a queue
    # time; each batch (requests came one at a time) a compute time and its rows.
    assert delta("iotgw_request_latency_seconds_count", **MODEL, transport="http") == 5
    assert delta("iotgw_request_latency_seconds_bucket", **MODEL, transport="http", le="+Inf") == 5
    assert delta("iotgw_request_latency_seconds_sum", **MODEL, transport="http") > 0
    assert delta("iotgw_queue_seconds_count", **MODEL) == len(ok_rows)
    assert delta("iotgw_queue_seconds_bucket", **MODEL, le="+Inf") == len(ok_rows)
    assert delta("iotgw_compute_seconds_count", **MODEL) == len(ok_rows)
    assert delta("iotgw_compute_seconds_sum", **MODEL) > 0
    assert delta("iotgw_batch_rows_count", **MODEL) == len(ok_rows)
    assert delta("iotgw_batch_rows_sum", **MODEL) == sum(ok_rows)
    assert delta("iotgw_batch_rows_bucket", **MODEL, le="2.0") == 2  # the 1- and 2-row batches
    # Rejections by reason, and the queue depth (nothing waits now).
    assert delta("iotgw_rejections_total", **MODEL, reason="deadline") == 1
    assert ("iotgw_queue_depth", frozenset(MODEL.items())) in after
    assert _value(after, "iotgw_queue_depth", **MODEL) == 0
    assert _value(after, "iotgw_model_ready", **MODEL) == 1

    # The knobs in force, for every model: the same values the admin endpoint reports.
    for served in gateway.service.registry.statuses():
        knobs = gateway.service.knobs(served.name, served.version).as_dict()
        labels = {"model": served.name, "version": str(served.version)}
        published = {knob: _value(after, "iotgw_knob", **labels, knob=knob) for knob in knobs}
        assert published == pytest.approx(knobs)


async def test_unknown_models_do_not_create_series(http: aiohttp.ClientSession, url: str) -> None:
    """A client probing random model names must not grow the metrics without bound."""
    for i in range(3):
        status, _, _ = await infer_binary(
            http, url, f"probe_{i}", {"x": np.zeros((1, 1), np.float32)}
        )
        assert status == 404
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    assert "probe_" not in text
