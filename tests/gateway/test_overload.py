"""Overload and deadlines: what cannot be served in time is refused at once with 503 and a reason
(never buffered without bound), a full queue says when to retry, and every request that is
accepted is answered correctly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from gateway.main import Gateway
from tests.gateway.helpers import (
    Reference,
    base_url,
    binary_request,
    decode_response,
    infer_binary,
    json_request,
    make_repo,
    metric_samples,
    random_inputs,
    running_gateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _post_binary(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    inputs: dict[str, np.ndarray],
    timeout_us: int,
) -> tuple[int, Any, Mapping[str, str]]:
    body, headers = binary_request(inputs, timeout_us=timeout_us)
    async with http.post(f"{url}/v2/models/{model}/infer", data=body, headers=headers) as r:
        raw = await r.read()
        if r.status == 200:
            return r.status, decode_response(raw, r.headers), r.headers
        return r.status, json.loads(raw), r.headers


async def test_impossible_deadline_is_refused_with_503(
    http: aiohttp.ClientSession, url: str, gateway: Gateway, reference: Reference
) -> None:
    rng = np.random.default_rng(3)
    image16 = random_inputs(reference.metadata("vision_cnn"), 16, rng)
    # First make the service time known: one 16-row batch.
    status, outputs, _ = await infer_binary(http, url, "vision_cnn", image16)
    assert status == 200, outputs

    # 1 µs: over before the request reaches the queue.
    status, reply, headers = await _post_binary(http, url, "vision_cnn", image16, timeout_us=1)
    assert status == 503
    assert "deadline" in reply["error"]
    assert "vision_cnn" in reply["error"]
    assert "Retry-After" not in headers  # retrying the same deadline would not help

    # A deadline shorter than the measured compute time of the batch: refused on admission,
    # with the estimate in the message. (The estimate is the gateway's own measurement, read
    # here so that the test holds on a machine of any speed.)
    per_batch_s = gateway.service.registry.host("vision_cnn")._batcher.service_time.predict(16)
    assert per_batch_s is not None
    short_us = max(1, int(per_batch_s * 1e6 / 4))
    status, reply, _ = await _post_binary(http, url, "vision_cnn", image16, timeout_us=short_us)
    assert status == 503
    assert "deadline cannot be met" in reply["error"]
    assert "estimated" in reply["error"]

    # The gateway keeps serving a request with a reachable deadline, correctly.
    status, outputs, _ = await infer_binary(http, url, "vision_cnn", image16)
    assert status == 200, outputs
    assert isinstance(outputs, dict)
    np.testing.assert_array_equal(
        outputs["probabilities"], reference.infer("vision_cnn", image16)["probabilities"]
    )

    metrics = await (await http.get(f"{url}/metrics")).text()
    assert any(
        name == "iotgw_rejections_total"
        and labels == {"model": "vision_cnn", "version": "1", "reason": "deadline"}
        and value >= 2
        for name, labels, value in metric_samples(metrics)
    )


@pytest.mark.slow
async def test_full_queue_is_refused_with_retry_after_and_nothing_is_lost(
    http: aiohttp.ClientSession, demo_repo: Path, tmp_path: Path, reference: Reference
) -> None:
    # One runtime instance, one row per batch and room for two waiting requests: a flood of
    # concurrent requests must overflow the queue.
    repo = make_repo(
        tmp_path / "repo",
        demo_repo,
        {
            "vision_cnn": {
                "slo_ms": 60_000.0,
                "batching": {"max_queue_size": 2, "concurrency": 1, "max_batch_size": 1},
            }
        },
    )
    rng = np.random.default_rng(5)
    metadata = reference.metadata("vision_cnn")
    images = [random_inputs(metadata, 1, rng) for _ in range(48)]
    wants = [reference.infer("vision_cnn", x)["probabilities"] for x in images]

    async with running_gateway(repo, tmp_path / "cache") as gw:
        url = base_url(gw)
        results = await asyncio.gather(
            *(_post_binary(http, url, "vision_cnn", x, timeout_us=60_000_000) for x in images)
        )
        statuses = [status for status, _, _ in results]
        assert len(results) == len(images)  # every request got an answer
        assert set(statuses) <= {200, 503}, statuses
        refused = [i for i, s in enumerate(statuses) if s == 503]
        served = [i for i, s in enumerate(statuses) if s == 200]
        assert refused, "a queue of 2 took 48 concurrent requests without refusing any"
        assert served
        for i in refused:
            _, reply, headers = results[i]
            assert "queue is full" in reply["error"]
            assert "vision_cnn" in reply["error"]
            assert int(headers["Retry-After"]) >= 1
        for i in served:
            np.testing.assert_array_equal(results[i][1]["probabilities"], wants[i])

        # Refusals are counted as such, and the queue drained.
        samples = metric_samples(await (await http.get(f"{url}/metrics")).text())
        counted = {
            (labels.get("outcome"), labels.get("reason")): value
            for name, labels, value in samples
            if labels.get("model") == "vision_cnn"
            and name in ("iotgw_requests_total", "iotgw_rejections_total")
        }
        assert counted[(None, "queue_full")] == len(refused)
        assert counted[("queue_full", None)] == len(refused)
        assert counted[("ok", None)] == len(served)
        assert gw.service.registry.host("vision_cnn").queue_depth == 0

        # After the flood a request is served again.
        status, outputs, _ = await _post_binary(
            http, url, "vision_cnn", images[0], timeout_us=60_000_000
        )
        assert status == 200
        np.testing.assert_array_equal(outputs["probabilities"], wants[0])


async def test_a_request_admission_would_refuse_is_refused_before_its_body_is_decoded(
    http: aiohttp.ClientSession, demo_repo: Path, tmp_path: Path, reference: Reference
) -> None:
    """A closed loop of clients beyond its deadlines sends each refused request again at once;
    over HTTP, a request with the model's SLO as its budget that admission would refuse even
    at one row is refused before its body is decoded. What shows it: a body that could not be
    decoded gets the overload's 503, not a 400, while the pace stays beyond the SLO; a body
    that names a budget of its own is decoded and judged at that budget."""
    repo = make_repo(
        tmp_path / "repo",
        demo_repo,
        {"sensor_mlp": {"slo_ms": 200.0, "batching": {"concurrency": 1, "max_batch_size": 4}}},
    )
    metadata = reference.metadata("sensor_mlp")
    row = random_inputs(metadata, 1, np.random.default_rng(11))
    async with running_gateway(repo, tmp_path / "cache") as gw:
        url = base_url(gw)
        infer_url, tfs_url = f"{url}/v2/models/sensor_mlp/infer", f"{url}/v1/models/sensor_mlp"
        host = gw.service.registry.host("sensor_mlp")
        for _ in range(3):  # every recent batch took 10 s: no request makes a 200 ms SLO
            host._batcher.service_time.observe(1, 10.0)

        async def post(url: str, body: bytes) -> tuple[int, dict[str, Any]]:
            async with http.post(url, data=body) as r:
                return r.status, json.loads(await r.read())

        garbage = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, ' + b"]" * 3
        status, reply = await post(infer_url, garbage)
        assert status == 503 and "deadline cannot be met" in reply["error"], reply
        status, reply = await post(f"{tfs_url}:predict", b"[[[")
        assert status == 503 and "deadline cannot be met" in reply["error"], reply
        # One that may name a budget is decoded first: this one's fault is then its own.
        status, reply = await post(infer_url, garbage + b' "timeout"')
        assert status == 400, reply
        # And one that names 60 s is admitted at them, and served correctly.
        body = json.dumps(json_request(row, timeout_us=60_000_000)).encode()
        status, reply = await post(infer_url, body)
        assert status == 200, reply
        got = np.asarray(reply["outputs"][0]["data"], dtype=np.float32)
        want = reference.infer("sensor_mlp", row)[reply["outputs"][0]["name"]]
        np.testing.assert_allclose(got, want.ravel(), rtol=1e-6)

        # Counted as any refusal: by reason, by outcome, and in the stats the agent reads.
        samples = metric_samples(await (await http.get(f"{url}/metrics")).text())
        counted = {
            (name, labels.get("outcome"), labels.get("reason")): value
            for name, labels, value in samples
            if labels.get("model") == "sensor_mlp"
        }
        assert counted[("iotgw_rejections_total", None, "deadline")] == 2
        assert counted[("iotgw_requests_total", "deadline", None)] == 2
        assert host.stats().rejected == 2


def _paced(metrics: str) -> float:
    return sum(
        value
        for name, labels, value in metric_samples(metrics)
        if name == "iotgw_refusals_paced_total" and labels == {"transport": "http"}
    )


async def test_a_connection_refused_again_at_once_gets_its_refusal_paced(
    http: aiohttp.ClientSession, url: str, gateway: Gateway, reference: Reference
) -> None:
    """A client that ignores Retry-After and sends again at once on the same connection is
    refused again only after ``http.refusal_pace_s``: its first refusal goes at once, its
    second is held (the metric counts it), and another connection's first is not; a request
    that can be served on the paced connection still is."""
    rng = np.random.default_rng(11)
    image16 = random_inputs(reference.metadata("vision_cnn"), 16, rng)
    status, _, _ = await infer_binary(http, url, "vision_cnn", image16)  # the pace known
    assert status == 200
    per_batch_s = gateway.service.registry.host("vision_cnn")._batcher.service_time.predict(16)
    assert per_batch_s is not None
    short_us = max(1, int(per_batch_s * 1e6 / 4))  # refused on admission, with a retry hint

    async def paced() -> float:
        return _paced(await (await http.get(f"{url}/metrics")).text())

    one = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))  # one connection
    other = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
    async with one, other:
        before = await paced()
        status, reply, headers = await _post_binary(one, url, "vision_cnn", image16, short_us)
        assert status == 503 and "Retry-After" in headers, reply
        assert await paced() == before  # the first refusal on the connection: at once
        status, reply, headers = await _post_binary(one, url, "vision_cnn", image16, short_us)
        assert status == 503 and "Retry-After" in headers, reply
        assert await paced() == before + 1  # again at once: held
        status, reply, _ = await _post_binary(other, url, "vision_cnn", image16, short_us)
        assert status == 503, reply
        assert await paced() == before + 1  # another connection's first: at once
        status, outputs, _ = await _post_binary(one, url, "vision_cnn", image16, 60_000_000)
        assert status == 200, outputs
        np.testing.assert_array_equal(
            outputs["probabilities"], reference.infer("vision_cnn", image16)["probabilities"]
        )
