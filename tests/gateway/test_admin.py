"""The admin (control) endpoints: knob validation errors and bearer-token protection."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from gateway.main import Gateway
from tests.gateway.helpers import base_url, infer_binary, make_repo, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="session")

TOKEN = "edge-admin-0123"
GOOD = {"Authorization": f"Bearer {TOKEN}"}
KNOBS = "/admin/models/sensor_mlp/versions/1/knobs"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def guarded(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    """A gateway whose admin endpoints need ``Authorization: Bearer <TOKEN>``."""
    tmp = tmp_path_factory.mktemp("admin")
    repo = make_repo(tmp / "repo", demo_repo, {"sensor_mlp": None})
    async with running_gateway(repo, tmp / "cache", admin_token=TOKEN) as gw:
        yield gw


async def _knobs(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + KNOBS, headers=GOOD) as r:
        assert r.status == 200
        return (await r.json())["knobs"]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"bogus": 3}, ["unknown knob", "bogus", "max_batch_size"]),
        ({"max_batch_size": 8, "batch_size": 8}, ["unknown knob", "batch_size"]),
        ({"max_batch_size": 0}, ["max_batch_size", "[1, 128]", "0"]),
        ({"max_batch_size": 129}, ["max_batch_size", "[1, 128]", "129"]),
        ({"max_batch_size": 4.5}, ["max_batch_size", "integer"]),
        ({"max_batch_size": "8"}, ["max_batch_size", "integer"]),
        ({"concurrency": True}, ["concurrency", "integer"]),
        ({"concurrency": 17}, ["concurrency", "[1, 16]"]),
        ({"intra_op_threads": 0}, ["intra_op_threads"]),
        ({"inter_op_threads": -1}, ["inter_op_threads"]),
        ({"intra_op_threads": 100_000}, ["intra_op_threads"]),
        ({"batch_timeout_ms": -0.5}, ["batch_timeout_ms", "[0, 1000]"]),
        ({"batch_timeout_ms": 1000.5}, ["batch_timeout_ms", "[0, 1000]"]),
        ({"batch_timeout_ms": "fast"}, ["batch_timeout_ms", "number"]),
        ([1, 2], ["object"]),
    ],
)
async def test_bad_knob_change_is_a_400_and_changes_nothing(
    http: aiohttp.ClientSession, guarded: Gateway, changes: Any, words: list[str]
) -> None:
    url = base_url(guarded)
    before = await _knobs(http, url)
    async with http.put(url + KNOBS, json=changes, headers=GOOD) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    for word in words:
        assert word in error, error
    assert await _knobs(http, url) == before


async def test_malformed_knob_body_is_a_400(http: aiohttp.ClientSession, guarded: Gateway) -> None:
    async with http.put(base_url(guarded) + KNOBS, data=b"{max_batch_size: 4", headers=GOOD) as r:
        assert r.status == 400
        assert "malformed JSON" in (await r.json())["error"]


async def test_knobs_of_an_unknown_model_are_a_404(
    http: aiohttp.ClientSession, guarded: Gateway
) -> None:
    url = base_url(guarded)
    async with http.put(url + "/admin/models/nope/knobs", json={}, headers=GOOD) as r:
        assert r.status == 404
        assert "nope" in (await r.json())["error"]
    async with http.get(url + "/admin/models/sensor_mlp/versions/2/knobs", headers=GOOD) as r:
        assert r.status == 404


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/admin/models"),
        ("GET", KNOBS),
        ("PUT", KNOBS),
        ("POST", "/admin/models/sensor_mlp/knobs"),
        ("GET", "/admin/models/sensor_mlp/stats"),
    ],
)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"bearer  {TOKEN}"},
    ],
    ids=["none", "wrong", "longer", "no-scheme", "basic", "malformed"],
)
async def test_admin_without_the_right_bearer_token_is_a_401(
    http: aiohttp.ClientSession,
    guarded: Gateway,
    method: str,
    path: str,
    headers: dict[str, str],
) -> None:
    url = base_url(guarded)
    before = await _knobs(http, url)
    async with http.request(method, url + path, json={"max_batch_size": 2}, headers=headers) as r:
        assert r.status == 401
        assert "Bearer" in (await r.json())["error"]
    assert await _knobs(http, url) == before


async def test_admin_with_the_right_token_works(
    http: aiohttp.ClientSession, guarded: Gateway
) -> None:
    url = base_url(guarded)
    async with http.get(url + "/admin/models", headers=GOOD) as r:
        assert r.status == 200
        (entry,) = await r.json()
    assert entry["name"] == "sensor_mlp"
    assert entry["state"] == "READY"
    before = entry["knobs"]

    change = {"max_batch_size": 4, "batch_timeout_ms": 3.0}
    async with http.put(url + KNOBS, json=change, headers=GOOD) as r:
        assert r.status == 200
        body = await r.json()
    assert body == {"model": "sensor_mlp", "version": "1", "knobs": {**before, **change}}
    assert await _knobs(http, url) == {**before, **change}

    # Put it back for the other tests of this module.
    async with http.put(url + KNOBS, json=before, headers=GOOD) as r:
        assert r.status == 200


async def _stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    # The widest window: nothing this module sent can have left it.
    async with http.get(url + "/admin/models/sensor_mlp/stats?window_s=3600", headers=GOOD) as r:
        assert r.status == 200
        stats: dict[str, Any] = await r.json()
    return stats


async def test_stats_count_the_requests_served(
    http: aiohttp.ClientSession, guarded: Gateway
) -> None:
    url = base_url(guarded)
    before = await _stats(http, url)
    sent, rows = 3, 2
    for seed in range(sent):
        x = np.random.default_rng(seed).standard_normal((rows, 32)).astype(np.float32)
        status, _, _ = await infer_binary(http, url, "sensor_mlp", {"features": x})
        assert status == 200
    after = await _stats(http, url)
    assert after["completed"] == before["completed"] + sent
    assert after["arrived"] == before["arrived"] + sent
    assert after["arrived_rows"] == before["arrived_rows"] + sent * rows
    assert after["rejected"] == before["rejected"] and after["queue_depth"] == 0
    assert 0 < after["p50_ms"] <= after["p95_ms"] <= after["p99_ms"]
    assert after["rate_per_s"] == after["completed"] / 3600


async def test_inference_needs_no_admin_token(
    http: aiohttp.ClientSession, guarded: Gateway
) -> None:
    x = np.zeros((1, 32), dtype=np.float32)
    status, outputs, _ = await infer_binary(http, base_url(guarded), "sensor_mlp", {"features": x})
    assert status == 200, outputs
    async with http.get(base_url(guarded) + "/metrics") as r:
        assert r.status == 200


async def test_stats_window_is_validated(http: aiohttp.ClientSession, guarded: Gateway) -> None:
    url = base_url(guarded)
    for window in ("abc", "0", "-5", "4000"):
        async with http.get(
            f"{url}/admin/models/sensor_mlp/stats?window_s={window}", headers=GOOD
        ) as r:
            assert r.status == 400
            assert "window_s" in (await r.json())["error"]


async def test_admin_is_open_without_a_configured_token(
    http: aiohttp.ClientSession, url: str
) -> None:
    async with http.get(f"{url}/admin/models") as r:
        assert r.status == 200
        models = await r.json()
    assert {m["name"] for m in models} >= {"sensor_mlp", "vision_cnn_tf"}
