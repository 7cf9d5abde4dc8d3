"""A repository with broken model versions: each is listed as UNAVAILABLE with its reason, is
answered with 503, and never stops the healthy models from serving."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from gateway.main import Gateway
from tests.gateway.helpers import (
    Reference,
    base_url,
    infer_binary,
    json_request,
    make_repo,
    running_gateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

FEATURES = np.full((1, 32), 0.25, dtype=np.float32)

# name/version -> words its UNAVAILABLE reason must contain
BROKEN = {
    ("broken_toml", "1"): ["config.toml", "not valid TOML"],
    ("no_config", "1"): ["config.toml", "missing"],
    ("sensor_mlp", "2"): ["config.toml", "invalid", "runtime"],
    ("missing_file", "1"): ["model file", "missing"],
    ("corrupt_onnx", "1"): ["corrupt_onnx", "model.onnx"],
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mixed(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    tmp = tmp_path_factory.mktemp("broken")
    repo = make_repo(tmp / "repo", demo_repo, {"sensor_mlp": None, "sensor_fusion_tf": None})
    good_config = (demo_repo / "sensor_mlp" / "1" / "config.toml").read_text()

    def version_dir(name: str, version: int = 1) -> Path:
        path = repo / name / str(version)
        path.mkdir(parents=True)
        return path

    (version_dir("broken_toml") / "config.toml").write_text("runtime = onnxruntime\n[[[")
    version_dir("no_config")
    v2 = version_dir("sensor_mlp", 2)
    shutil.copy(demo_repo / "sensor_mlp" / "1" / "model.onnx", v2 / "model.onnx")
    (v2 / "config.toml").write_text(good_config.replace('"onnxruntime"', '"pytorch"'))
    (version_dir("missing_file") / "config.toml").write_text(good_config)
    corrupt = version_dir("corrupt_onnx")
    (corrupt / "config.toml").write_text(good_config)
    (corrupt / "model.onnx").write_bytes(b"this is not an ONNX protobuf" * 10)

    async with running_gateway(repo, tmp / "cache") as gw:
        yield gw


async def _json(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as r:
        return r.status, await r.json()


async def test_index_lists_broken_versions_with_their_reason(
    http: aiohttp.ClientSession, mixed: Gateway
) -> None:
    status, index = await _json(http, "POST", f"{base_url(mixed)}/v2/repository/index")
    assert status == 200
    by_key = {(e["name"], e["version"]): e for e in index}
    assert set(by_key) == {("sensor_mlp", "1"), ("sensor_fusion_tf", "1"), *BROKEN}
    assert by_key[("sensor_mlp", "1")] == {"name": "sensor_mlp", "version": "1", "state": "READY"}
    assert by_key[("sensor_fusion_tf", "1")]["state"] == "READY"
    for key, words in BROKEN.items():
        entry = by_key[key]
        assert entry["state"] == "UNAVAILABLE"
        for word in words:
            assert word in entry["reason"], entry

    status, ready_only = await _json(
        http, "POST", f"{base_url(mixed)}/v2/repository/index", json={"ready": True}
    )
    assert status == 200
    assert {(e["name"], e["version"]) for e in ready_only} == {
        ("sensor_mlp", "1"),
        ("sensor_fusion_tf", "1"),
    }


async def test_the_healthy_models_serve(
    http: aiohttp.ClientSession, mixed: Gateway, reference: Reference
) -> None:
    url = base_url(mixed)
    # Not ready as a whole: each broken version is required (the default) and is named.
    async with http.get(f"{url}/v2/health/ready") as r:
        assert r.status == 503
        waiting = (await r.json())["waiting_for"]
    assert sorted(w.split(":")[0] for w in waiting) == sorted(
        f"model {name} version {version}" for name, version in BROKEN
    )
    # The default version of sensor_mlp is the highest that is ready: 1.
    status, outputs, _ = await infer_binary(http, url, "sensor_mlp", {"features": FEATURES})
    assert status == 200, outputs
    assert isinstance(outputs, dict)
    np.testing.assert_array_equal(
        outputs["probabilities"],
        reference.infer("sensor_mlp", {"features": FEATURES})["probabilities"],
    )
    x = {"accel": np.ones((2, 3), np.float32), "temperature": np.ones((2, 1), np.float32)}
    status, outputs, _ = await infer_binary(http, url, "sensor_fusion_tf", x)
    assert status == 200, outputs
    assert isinstance(outputs, dict)
    np.testing.assert_array_equal(
        outputs["probabilities"], reference.infer("sensor_fusion_tf", x)["probabilities"]
    )


@pytest.mark.parametrize(("name", "version"), list(BROKEN))
async def test_a_broken_version_answers_503_with_its_reason(
    http: aiohttp.ClientSession, mixed: Gateway, name: str, version: str
) -> None:
    url = base_url(mixed)
    paths = [f"/v2/models/{name}/versions/{version}"]
    if name != "sensor_mlp":  # sensor_mlp's default version is the healthy 1
        paths.append(f"/v2/models/{name}")
    body = json_request({"features": FEATURES})
    for path in paths:
        status, reply = await _json(http, "POST", f"{url}{path}/infer", json=body)
        assert status == 503, reply
        assert name in reply["error"]
        assert BROKEN[(name, version)][-1] in reply["error"], reply
        for suffix in ("", "/ready"):
            status, reply = await _json(http, "GET", f"{url}{path}{suffix}")
            assert status == 503, (path, suffix, reply)
            assert "error" in reply or reply.get("ready") is False
    tf_path = f"/v1/models/{name}/versions/{version}"
    status, reply = await _json(
        http, "POST", f"{url}{tf_path}:predict", json={"instances": FEATURES.tolist()}
    )
    assert status == 503
    assert name in reply["error"]


async def test_tf_serving_status_shows_the_broken_version(
    http: aiohttp.ClientSession, mixed: Gateway
) -> None:
    status, body = await _json(http, "GET", f"{base_url(mixed)}/v1/models/sensor_mlp")
    assert status == 200
    states = {s["version"]: s for s in body["model_version_status"]}
    assert states["1"]["state"] == "AVAILABLE"
    assert states["2"]["state"] == "END"
    assert states["2"]["status"]["error_code"] == "UNAVAILABLE"
    assert "runtime" in states["2"]["status"]["error_message"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/models/broken_toml",
        "/v1/models/broken_toml/versions/1",
        "/v1/models/corrupt_onnx",
        "/v1/models/sensor_mlp/versions/2",
    ],
)
async def test_tf_serving_status_of_a_broken_model_says_why(
    http: aiohttp.ClientSession, mixed: Gateway, path: str
) -> None:
    """A status endpoint reports the state of what exists, broken or not (TF Serving answers
    ``END`` with the error), and keeps errors for what does not exist."""
    status, body = await _json(http, "GET", f"{base_url(mixed)}{path}")
    assert status == 200, body
    (entry,) = body["model_version_status"]
    name = path.split("/")[3]
    version = path.split("/")[5] if "/versions/" in path else "1"
    assert entry["version"] == version
    assert entry["state"] == "END"
    assert entry["status"]["error_code"] == "UNAVAILABLE"
    for word in BROKEN[(name, version)]:
        assert word in entry["status"]["error_message"]
    status, body = await _json(http, "GET", f"{base_url(mixed)}/v1/models/broken_toml/versions/3")
    assert status == 404
