"""The tuner follows the repository API on a live gateway: a model unloaded stops being tuned
(its agent ends and its cores leave the joint budget), one loaded again is tuned again, and a
new version with the same limits keeps its agent (and what it learned) under the new version's
label. Requests keep being answered throughout."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import aiohttp

from tests.rrl.live import BODY, gateway

MODEL = "sensor_mlp"


async def _post(http: aiohttp.ClientSession, url: str) -> int:
    async with http.post(url, json=BODY if url.endswith("/infer") else None) as resp:
        await resp.read()
        return resp.status


async def test_models_loaded_and_unloaded_through_the_api_are_tuned_and_let_go(
    mlp_repo: Path, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(mlp_repo, repo)
    async with gateway(repo, tmp_path, models=None) as gw:
        tuning = gw.tuning
        assert tuning is not None and tuning._budget is not None
        first = tuning.agents[MODEL]
        url = f"http://127.0.0.1:{gw.http_port}"
        async with aiohttp.ClientSession() as http:
            assert await _post(http, f"{url}/v2/models/{MODEL}/infer") == 200

            # A new version with the same limits: the same agent tunes on, under version 2.
            shutil.copytree(repo / MODEL / "1", repo / MODEL / "2", symlinks=True)
            assert await _post(http, f"{url}/v2/repository/models/{MODEL}/load") == 200
            assert tuning.agents[MODEL] is first
            assert tuning._versions[MODEL] == "2"
            assert await _post(http, f"{url}/v2/models/{MODEL}/infer") == 200

            # Unloaded: no agent, no claim on the cores, 404 on its tuner page.
            await asyncio.wait_for(first.started.wait(), 60)
            assert MODEL in tuning._budget.as_dict()["claims"]  # type: ignore[operator]
            assert await _post(http, f"{url}/v2/repository/models/{MODEL}/unload") == 200
            assert MODEL not in tuning.agents
            assert MODEL not in tuning._budget.as_dict()["claims"]  # type: ignore[operator]
            async with http.get(f"{url}/admin/tuner/{MODEL}") as resp:
                assert resp.status == 404

            # Loaded again: a new agent, running, and the model serves.
            assert await _post(http, f"{url}/v2/repository/models/{MODEL}/load") == 200
            again = tuning.agents[MODEL]
            assert again is not first and not tuning._tasks[MODEL].done()
            async with http.get(f"{url}/admin/tuner/{MODEL}") as resp:
                assert resp.status == 200
            assert await _post(http, f"{url}/v2/models/{MODEL}/infer") == 200
