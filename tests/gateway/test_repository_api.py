"""The model repository extension on a live gateway: a model folder changed, reloaded and
extended with a new version while clients keep sending (no request fails), unload then infer
(a clear refusal), unknown models (404), the admin token, and the tuner and metrics afterwards."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from gateway.main import Gateway
from models.demo import config_toml
from models.repository import CONFIG_FILE, read_config
from tests.gateway.helpers import (
    base_url,
    json_request,
    make_repo,
    metric_samples,
    random_inputs,
    running_gateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

MODEL = "sensor_mlp"
CLIENTS = 4
ADMIN = "repo-admin-token"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest_asyncio.fixture(loop_scope="session", name="served")
async def served_fixture(demo_repo: Path, tmp_path: Path) -> AsyncIterator[tuple[Gateway, Path]]:
    repo = make_repo(tmp_path / "repo", demo_repo, {MODEL: None, "vision_cnn": None})
    async with running_gateway(repo, tmp_path / "cache", admin_token=ADMIN) as gw:
        yield gw, repo


class Load:
    """Clients that send inference requests in a loop until stopped; every status is kept."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.url, self.body = url, body
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._answered = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(self._client()) for _ in range(CLIENTS)]
        await self.wait_for(20)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def wait_for(self, count: int) -> None:
        """Until ``count`` more requests are answered: traffic runs across each step."""
        target = len(self.statuses) + count
        async with self._answered:
            await self._answered.wait_for(lambda: len(self.statuses) >= target)

    async def _client(self) -> None:
        async with aiohttp.ClientSession() as http:
            while not self._stop.is_set():
                async with http.post(self.url, json=self.body) as resp:
                    if resp.status != 200:
                        self.errors.append(await resp.text())
                async with self._answered:
                    self.statuses.append(resp.status)
                    self._answered.notify_all()


async def _post(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.post(url, **kw) as resp:
        return resp.status, await resp.json()


def _rewrite_config(version_dir: Path, **changes: Any) -> None:
    config = read_config(version_dir / CONFIG_FILE)
    doc = config.model_dump()
    doc["batching"] = {**doc["batching"], **changes}
    (version_dir / CONFIG_FILE).write_text(
        config_toml(type(config).model_validate(doc)), encoding="utf-8"
    )


async def test_reload_and_new_version_under_load(served: tuple[Gateway, Path]) -> None:
    gw, repo = served
    url = base_url(gw)
    inputs = random_inputs(gw.service.metadata(MODEL), 1, np.random.default_rng(0))
    load_url = f"{url}/v2/repository/models/{MODEL}/load"
    before = gw.service.registry.host(MODEL)
    async with aiohttp.ClientSession() as http:
        async with Load(f"{url}/v2/models/{MODEL}/infer", json_request(inputs)) as traffic:
            # Unchanged folder: nothing is rebuilt.
            status, body = await _post(http, load_url, headers=AUTH)
            assert status == 200 and body["versions"] == [{"version": "1", "state": "READY"}]
            assert gw.service.registry.host(MODEL) is before
            # A changed config: version 1 is rebuilt and swapped in while clients send.
            _rewrite_config(repo / MODEL / "1", max_queue_size=512)
            status, body = await _post(http, load_url, headers=AUTH)
            assert status == 200, body
            rebuilt = gw.service.registry.host(MODEL)
            assert rebuilt is not before and rebuilt.config.batching.max_queue_size == 512
            await traffic.wait_for(20)
            # A new version folder: version 2 is added and becomes the default.
            shutil.copytree(repo / MODEL / "1", repo / MODEL / "2", symlinks=True)
            status, body = await _post(http, load_url, headers=AUTH)
            assert status == 200, body
            assert [v["version"] for v in body["versions"]] == ["1", "2"]
            assert gw.service.registry.host(MODEL).version == 2
            await traffic.wait_for(20)
            # Version 1 removed from the folder: retired, its requests answered first.
            shutil.rmtree(repo / MODEL / "1")
            status, body = await _post(http, load_url, headers=AUTH)
            assert status == 200 and [v["version"] for v in body["versions"]] == ["2"]
            await traffic.wait_for(20)
        assert traffic.errors == [] and set(traffic.statuses) == {200}
        # Metrics: the rebuilt version's ready gauge was not zeroed by the host it replaced.
        async with http.get(f"{url}/metrics") as resp:
            samples = metric_samples(await resp.text())
        ready = {
            s[1]["version"]: s[2]
            for s in samples
            if s[0] == "iotgw_model_ready" and s[1].get("model") == MODEL
        }
        assert ready == {"1": 0.0, "2": 1.0}
        # The tuner still answers for the model and its agent still runs.
        if gw.tuning is not None and MODEL in gw.tuning.agents:
            async with http.get(f"{url}/admin/tuner/{MODEL}", headers=AUTH) as resp:
                assert resp.status == 200
            assert all(not t.done() for t in gw.tuning._tasks.values())


async def test_reload_keeps_knobs_set_at_run_time(served: tuple[Gateway, Path]) -> None:
    gw, repo = served
    url = base_url(gw)
    async with aiohttp.ClientSession() as http:
        async with http.put(
            f"{url}/admin/models/{MODEL}/knobs", json={"max_batch_size": 4}, headers=AUTH
        ) as resp:
            assert resp.status == 200
        _rewrite_config(repo / MODEL / "1", max_queue_size=256)
        status, body = await _post(http, f"{url}/v2/repository/models/{MODEL}/load", headers=AUTH)
        assert status == 200, body
    assert gw.service.registry.host(MODEL).knobs.max_batch_size == 4


async def test_unload_then_infer_then_load_again(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    url = base_url(gw)
    inputs = random_inputs(gw.service.metadata(MODEL), 1, np.random.default_rng(1))
    infer_url = f"{url}/v2/models/{MODEL}/infer"
    async with aiohttp.ClientSession() as http:
        tuned = gw.tuning is not None and MODEL in gw.tuning.agents
        status, body = await _post(http, f"{url}/v2/repository/models/{MODEL}/unload", headers=AUTH)
        assert status == 200
        assert body["versions"] == [{"version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        if tuned:  # its agent stopped with it (and its cores left the budget)
            assert await _tuner_status(http, url) == 404
        status, body = await _post(http, infer_url, json=json_request(inputs))
        assert status == 503
        assert (
            "unloaded" in body["error"] and f"/v2/repository/models/{MODEL}/load" in body["error"]
        )
        # The other model serves on; the index lists the unloaded one with its reason.
        status, index = await _post(http, f"{url}/v2/repository/index")
        assert {
            "name": MODEL,
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        } in index
        # Unloading twice is no error; loading brings it back.
        status, _ = await _post(http, f"{url}/v2/repository/models/{MODEL}/unload", headers=AUTH)
        assert status == 200
        status, _ = await _post(http, f"{url}/v2/repository/models/{MODEL}/load", headers=AUTH)
        assert status == 200
        status, body = await _post(http, infer_url, json=json_request(inputs))
        assert status == 200, body
        if tuned:  # loaded again through the API: tuned again
            assert await _tuner_status(http, url) == 200
            assert gw.tuning is not None and not gw.tuning._tasks[MODEL].done()


async def _tuner_status(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(f"{url}/admin/tuner/{MODEL}", headers=AUTH) as resp:
        return resp.status


async def test_unknown_model_and_admin_token(served: tuple[Gateway, Path]) -> None:
    gw, _ = served
    url = base_url(gw)
    async with aiohttp.ClientSession() as http:
        for action in ("load", "unload"):
            status, body = await _post(
                http, f"{url}/v2/repository/models/no_such_model/{action}", headers=AUTH
            )
            assert status == 404 and "no_such_model" in body["error"]
            status, _ = await _post(http, f"{url}/v2/repository/models/{MODEL}/{action}")
            assert status == 401
        status, body = await _post(
            http, f"{url}/v2/repository/models/{MODEL}/load", headers=AUTH, data=b"[1]"
        )
        assert status == 400 and "JSON object" in body["error"]


async def test_broken_new_build_leaves_the_old_version_serving(
    served: tuple[Gateway, Path],
) -> None:
    gw, repo = served
    url = base_url(gw)
    before = gw.service.registry.host(MODEL)
    model_file = repo / MODEL / "1" / before.config.path
    target = model_file.resolve()
    model_file.unlink()
    model_file.write_bytes(b"not an onnx model")
    try:
        async with aiohttp.ClientSession() as http:
            status, body = await _post(
                http, f"{url}/v2/repository/models/{MODEL}/load", headers=AUTH
            )
            assert status == 400
            assert "version 1" in body["error"]
            assert "serving version(s) 1" in body["error"]
            async with http.get(f"{url}/metrics") as resp:
                samples = metric_samples(await resp.text())
        assert gw.service.registry.host(MODEL) is before and before.ready
        assert ("iotgw_model_ready", {"model": MODEL, "version": "1"}, 1.0) in samples
    finally:
        model_file.unlink()
        model_file.symlink_to(target)
