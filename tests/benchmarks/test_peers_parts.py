"""The parts of ``iotgw bench peers``: the cached environment (built offline from its
wheelhouse, reused as it is, and a clear refusal when nothing is cached and no registry can be
reached), the load generator's JSON requests against a real aiohttp server, the windows and the
summary. No timing is asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from benchmarks.loadgen import LoadJob, run_load
from benchmarks.peers.mlserver_env import (
    MLServerEnv,
    MLServerUnavailable,
    ensure_env,
    mlserver_env,
)
from benchmarks.peers.plan import FULL, GATEWAY, GATEWAY_BINARY, MLSERVER, windows
from benchmarks.peers.report import model_summary
from gateway.codecs.oip import HEADER_LENGTH


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip with no index, no configuration file and no extra wheel folder: nothing but what
    the test hands it."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def _write_wheel(folder: Path) -> None:
    """A one-module pure-Python wheel, ``peersprobe`` 1.0 (``VALUE = 42``)."""
    files = {
        "peersprobe.py": b"VALUE = 42\n",
        "peersprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: peersprobe\n"
        b"Version: 1.0\n",
        "peersprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("peersprobe-1.0.dist-info/RECORD,,")
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "peersprobe-1.0-py3-none-any.whl", "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr("peersprobe-1.0.dist-info/RECORD", "\n".join(record) + "\n")


def test_environment_built_offline_from_the_wheelhouse_then_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch)
    env = MLServerEnv(tmp_path / "env", ("peersprobe==1.0",))
    _write_wheel(env.wheels)
    (env.wheels / "iotgw-peers.json").write_text('{"requirements": ["peersprobe==1.0"]}')
    said: list[str] = []
    assert ensure_env(env, said.append) == env
    assert said == [f"building MLServer's environment {env.venv} (offline, from {env.wheels})"]
    probe = [str(env.python), "-c", "import peersprobe; print(peersprobe.VALUE)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "42\n"

    said.clear()
    assert ensure_env(env, said.append) == env  # complete: used as it is, pip not run
    assert said == []

    (env.venv / "iotgw-peers.json").unlink()  # as a build interrupted before its end leaves it
    ensure_env(env, said.append)
    assert said == [f"building MLServer's environment {env.venv} (offline, from {env.wheels})"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "42\n"


def test_nothing_cached_and_no_registry_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch)
    env = mlserver_env(tmp_path)
    with pytest.raises(MLServerUnavailable) as caught:
        ensure_env(env, lambda _: None)
    message = str(caught.value)
    assert "mlserver==1.7.1" in message and str(env.root) in message
    assert "onnxruntime==" in message
    assert not env.wheels.exists() and not env.venv.exists()


async def _json_echo(request: web.Request) -> web.Response:
    """Answers a JSON request with JSON whose length changes from reply to reply, as floats
    printed as text do; anything else is refused."""
    if request.content_type != "application/json" or HEADER_LENGTH in request.headers:
        return web.json_response({"error": "not a JSON request"}, status=400)
    doc = await request.json()
    served = request.app[SERVED]
    served.append(len(served))
    return web.json_response({"outputs": doc["inputs"], "pad": "x" * (len(served) % 7)})


SERVED = web.AppKey("served", list[int])


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
async def test_load_generator_sends_plain_json(client: str) -> None:
    app = web.Application()
    app[SERVED] = []
    app.router.add_post("/v2/models/m/versions/1/infer", _json_echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        body = b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1.5,2.5]}]}'
        job = LoadJob(
            url=f"http://127.0.0.1:{port}/v2/models/m/versions/1/infer",
            body=body,
            header_length=0,
            rows_per_request=1,
            concurrency=3,
            duration_s=60.0,
            max_requests=40,
            warmup_s=0.0,
            timeout_s=30.0,
            client=client,
        )
        result = await run_load(job)
    finally:
        await runner.cleanup()
    assert (result["answered"], result["lost"], result["errors"]) == (40, 0, {})


def test_windows_follow_the_wait_for_a_reply() -> None:
    assert windows(FULL, None) == (FULL.warmup_s, FULL.run_s)
    assert windows(FULL, 0.001) == (FULL.warmup_s, FULL.run_s)  # at least the plan's
    assert windows(FULL, 1.0) == (0.0, 4.0)  # 4 replies per client; a warm-up would wait
    assert windows(FULL, 60.0) == (0.0, FULL.max_run_s)  # within its bounds


def _point(rows: int, concurrency: int, ratios: dict[str, float]) -> dict[str, Any]:
    def rep(x: float) -> dict[str, Any]:
        return {"median": x, "min": x, "max": x, "runs": 1, "values": [x]}

    arm = {"rows_per_s": rep(100.0), "p50_ms": rep(5.0), "p99_ms": rep(9.0), "lost": 0}
    return {
        "model": "vision_cnn",
        "rows_per_request": rows,
        "concurrency": concurrency,
        "arms": {MLSERVER: arm, GATEWAY: arm, GATEWAY_BINARY: arm},
        "vs_mlserver": {
            name: {k: rep(v * scale) for k, v in ratios.items()}
            for name, scale in ((GATEWAY, 1.0), (GATEWAY_BINARY, 2.0))
        },
    }


def test_summary_takes_each_ratio_at_its_point_and_holds_it_to_its_target() -> None:
    ratios = {"throughput_ratio": 1.6, "p50_ratio": 0.9, "p99_ratio": 1.1}
    points = [
        _point(1, 1, {**ratios, "p50_ratio": 0.7}),
        _point(1, 32, ratios),
        _point(8, 32, {**ratios, "throughput_ratio": 3.0}),
    ]
    s = model_summary(points, "vision_cnn")
    assert s["vs_mlserver_throughput_ratio_c32"] == 1.6
    assert s["vs_mlserver_p99_ratio_c32"] == 1.1
    assert s["vs_mlserver_p50_ratio_c1"] == 0.7
    assert s["meets_targets"] == {
        "vs_mlserver_throughput_ratio_c32": True,
        "vs_mlserver_p99_ratio_c32": False,
        "vs_mlserver_p50_ratio_c1": True,
    }
    assert s["binary_vs_mlserver_throughput_ratio_c32"] == 3.2
    assert s["vs_mlserver_throughput_ratio_c32_rows8"] == 3.0
    assert s["vs_mlserver_p50_ratio_c1_rows8"] is None  # not measured
