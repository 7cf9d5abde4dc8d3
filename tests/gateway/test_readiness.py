"""Readiness that means ready: ``/v2/health/ready`` waits for every model version marked
required (the default) and names each one missing; a version marked ``required = false`` may fail
without holding the gateway back; per-model readiness is as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.lifecycle import Readiness
from models.repository import CONFIG_FILE, read_config
from tests.gateway.helpers import base_url, make_repo, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _repo_with_broken_cnn(dest: Path, demo_repo: Path, **cnn: Any) -> Path:
    """sensor_mlp as in the demo, and vision_cnn (``cnn``: config overrides) with a model file
    that ONNX Runtime cannot parse."""
    repo = make_repo(dest, demo_repo, {"sensor_mlp": None, "vision_cnn": cnn or None})
    version_dir = repo / "vision_cnn" / "1"
    model_file = version_dir / read_config(version_dir / CONFIG_FILE).path
    model_file.unlink()  # a link into the demo repository: replaced, not written through
    model_file.write_bytes(b"not an onnx model")
    return repo


async def _get(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status, await resp.json()


async def test_a_required_model_that_failed_keeps_the_gateway_unready(
    demo_repo: Path, tmp_path: Path
) -> None:
    repo = _repo_with_broken_cnn(tmp_path / "repo", demo_repo)
    async with running_gateway(repo, tmp_path / "cache") as gw:
        url = base_url(gw)
        status, body = await _get(f"{url}/v2/health/ready")
        assert status == 503 and body["ready"] is False
        [line] = body["waiting_for"]
        assert line.startswith("model vision_cnn version 1: unavailable: ")
        assert "INVALID_PROTOBUF" in line or "Protobuf" in line
        # Per-model readiness is unchanged: the good model is ready, the broken one is not.
        assert (await _get(f"{url}/v2/models/sensor_mlp/ready"))[0] == 200
        assert (await _get(f"{url}/v2/models/vision_cnn/ready"))[0] == 503


async def test_a_model_not_required_does_not_hold_readiness_back(
    demo_repo: Path, tmp_path: Path
) -> None:
    repo = _repo_with_broken_cnn(tmp_path / "repo", demo_repo, required=False)
    async with running_gateway(repo, tmp_path / "cache") as gw:
        url = base_url(gw)
        assert await _get(f"{url}/v2/health/ready") == (200, {"ready": True})
        assert (await _get(f"{url}/v2/models/vision_cnn/ready"))[0] == 503


async def test_unloading_a_model_does_not_hold_readiness_back(
    demo_repo: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None, "vision_cnn": None})
    async with running_gateway(repo, tmp_path / "cache") as gw:
        url = base_url(gw)
        unload = f"{url}/v2/repository/models/vision_cnn/unload"
        async with aiohttp.ClientSession() as http, http.post(unload) as resp:
            assert resp.status == 200
        assert await _get(f"{url}/v2/health/ready") == (200, {"ready": True})


async def test_the_first_ready_answer_runs_the_ready_callbacks_once_whoever_asks() -> None:
    """The ready line is logged by the first answer with nothing waiting, a health probe's
    included: a client that read 200 finds the line in the log already."""
    waiting = ["models: loading"]
    readiness = Readiness()
    readiness.require(lambda: list(waiting))
    called: list[str] = []
    readiness.when_ready(lambda: called.append("ready line"))
    assert not readiness.ready and called == []
    waiting.clear()
    assert readiness.ready  # a probe: the callback runs before it is answered
    assert called == ["ready line"]
    assert readiness.waiting_for() == [] and called == ["ready line"]  # once
    late = Readiness()
    late.require(lambda: None)
    late.shutting_down()
    late.when_ready(lambda: called.append("never"))
    assert not late.ready and called == ["ready line"]
