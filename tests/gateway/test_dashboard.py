"""The live dashboard: its JSON document (what the page polls) follows the load, the page and its
assets come from the package, the admin token guards the data, the MQTT state it shows
(connected, in flight, reconnects, duplicates) is the adapter's, and the gRPC block says where
gRPC listens and counts what real gRPC clients sent. The page itself is driven in a real
headless Chromium in ``test_dashboard_browser.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import pytest_asyncio
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.brokers import free_port, mosquitto
from tests.gateway.helpers import (
    GENEROUS_TIMEOUT_US,
    base_url,
    infer_binary,
    make_repo,
    random_inputs,
    running_gateway,
)
from tests.gateway.mqtt_client import device, json_payload

pytestmark = pytest.mark.asyncio(loop_scope="session")

DATA = "/admin/dashboard.json"
TOKEN = "dash-admin-0123"


async def _document(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    async with http.get(url + DATA, headers=headers) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Cache-Control"] == "no-store"
        return dict(await r.json())


def _model(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (entry,) = [m for m in doc["models"] if m["name"] == name]
    return entry


async def _until(check: Callable[[], Awaitable[bool]], what: str, deadline_s: float = 30) -> None:
    """Poll ``check`` (a document read) until it holds; fail with ``what`` after the deadline."""
    end = time.monotonic() + deadline_s
    while not await check():
        if time.monotonic() > end:
            pytest.fail(f"within {deadline_s:g} s: {what}")
        await asyncio.sleep(0.1)


async def test_document_lists_models_and_follows_the_load(
    demo_repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # A gateway of its own: the shared one's window holds other tests' requests.
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None, "sensor_fusion": None})
    async with running_gateway(repo, tmp_path / "cache") as gateway:
        await _follows_the_load(gateway, base_url(gateway), http)


async def _follows_the_load(gateway: Gateway, url: str, http: aiohttp.ClientSession) -> None:
    before = await _document(http, url)
    statuses = gateway.service.registry.statuses()
    # All idle: by name.
    assert [(m["name"], m["version"]) for m in before["models"]] == sorted(
        (s.name, str(s.version)) for s in statuses
    )
    assert before["totals"]["completed"] == 0 and before["totals"]["busy"] == 0
    mlp = _model(before, "sensor_mlp")
    assert mlp["state"] == "READY"
    assert mlp["knobs"] == gateway.service.knobs("sensor_mlp").as_dict()
    assert before["gateway"]["ready"] is True and before["gateway"]["waiting_for"] == []
    assert before["mqtt"] is None  # this gateway runs no MQTT adapter
    assert before["tuner"] == {"enabled": False, "models": {}}

    rng = np.random.default_rng(0)
    inputs = random_inputs(gateway.service.metadata("sensor_mlp"), 2, rng)
    results = await asyncio.gather(
        *(infer_binary(http, url, "sensor_mlp", inputs) for _ in range(24))
    )
    assert [status for status, _, _ in results] == [200] * 24

    doc = await _document(http, url)
    # The busy model comes first, though "sensor_fusion" sorts before it by name.
    assert [m["name"] for m in doc["models"]][:1] == ["sensor_mlp"]
    after = _model(doc, "sensor_mlp")
    totals = doc["totals"]
    assert (totals["models"], totals["serving"], totals["busy"]) == (len(statuses), 2, 1)
    assert totals["completed"] == after["stats"]["completed"] >= 24
    assert totals["rate_per_s"] == pytest.approx(after["stats"]["rate_per_s"])
    # The trend from the gateway's own history: the last minute's answers, second by second.
    assert len(after["history_per_s"]) == 60
    assert sum(after["history_per_s"]) == 24
    stats = after["stats"]
    assert stats["completed"] >= 24 and stats["rate_per_s"] > 0
    assert 0 < stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"]
    assert stats["rows_per_request"] == pytest.approx(2.0)
    batches = after["batches"]
    assert batches["count"] > mlp["batches"]["count"]
    assert batches["rows"] - mlp["batches"]["rows"] == 48
    assert batches["buckets"][-1] == [None, batches["count"]]  # +Inf holds every batch


async def test_grpc_block_shows_where_it_listens_and_what_it_served(
    demo_repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # A gateway of its own: the counts are since its start.
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    async with running_gateway(repo, tmp_path / "cache") as gw:
        assert gw.grpc is not None
        url, target = base_url(gw), f"127.0.0.1:{gw.grpc.port}"
        idle = (await _document(http, url))["grpc"]
        assert idle == {
            "address": target,
            "tls": False,
            "listening": True,
            "in_flight": 0,
            "streams": 0,
            "requests": 0,
            "ok": 0,
            "rejections": {},
        }
        x = np.random.default_rng(2).standard_normal((1, 32)).astype(np.float32)
        async with triton_aio.InferenceServerClient(target) as client:
            for _ in range(3):
                await client.infer("sensor_mlp", _grpc_inputs(x), timeout=GENEROUS_TIMEOUT_US)
            with pytest.raises(InferenceServerException, match="shape"):
                await client.infer(
                    "sensor_mlp", _grpc_inputs(x[:, :31]), timeout=GENEROUS_TIMEOUT_US
                )
        served = (await _document(http, url))["grpc"]
        # The refused request reached the service (a wrong shape), so it is a request too.
        assert (served["requests"], served["ok"], served["in_flight"]) == (4, 3, 0)
        assert served["rejections"] == {"bad_request": 1}
        assert (await _document(http, url))["error_replies"]["grpc"] == {"bad_request": 1}
        await _stream_counted(http, url, target, x)


def _grpc_inputs(x: np.ndarray) -> list[triton_aio.InferInput]:
    tensor = triton_aio.InferInput("features", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return [tensor]


async def _stream_counted(
    http: aiohttp.ClientSession, url: str, target: str, x: np.ndarray
) -> None:
    """An open ModelStreamInfer stream is shown while it stays open between its requests."""
    request = service_pb2.ModelInferRequest(model_name="sensor_mlp", id="s1")
    request.inputs.add(name="features", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    request.parameters["timeout"].int64_param = GENEROUS_TIMEOUT_US
    async with grpc.aio.insecure_channel(target) as channel:
        open_stream: Any = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        call = open_stream()
        await call.write(request)
        reply = await call.read()
        assert reply.error_message == "" and reply.infer_response.id == "s1"
        shown = (await _document(http, url))["grpc"]
        assert (shown["streams"], shown["in_flight"], shown["ok"]) == (1, 0, 4)
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF

    async def closed() -> bool:
        return bool((await _document(http, url))["grpc"]["streams"] == 0)

    await _until(closed, "the stream shown closed once its client ended it")


async def test_no_grpc_block_with_grpc_off(
    demo_repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": tmp_path / "cache"},
        mqtt={"enabled": False},
        grpc={"enabled": False},
    )
    async with Gateway(settings) as gw:
        await gw.wait_loaded()
        assert gw.grpc is None
        assert (await _document(http, base_url(gw)))["grpc"] is None


async def test_page_and_assets_come_from_the_package(url: str, http: aiohttp.ClientSession) -> None:
    static = resources.files("gateway") / "static"
    async with http.get(url + "/dashboard") as r:
        assert r.status == 200 and r.content_type == "text/html"
        page = await r.read()
    assert page == (static / "dashboard.html").read_bytes()
    assert b'src="dashboard/dashboard.js"' in page
    assert b'="http' not in page and b'="//' not in page  # nothing from elsewhere: works offline
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        async with http.get(f"{url}/dashboard/{name}") as r:
            assert r.status == 200 and r.content_type == kind
            assert await r.read() == (static / name).read_bytes()
    async with http.get(url + "/dashboard/secrets.txt") as r:
        assert r.status == 404
    async with http.get(url + "/dashboard/", allow_redirects=False) as r:
        assert r.status == 302 and r.headers["Location"] == "../dashboard"
    async with http.get(url + DATA + "?window_s=0") as r:
        assert r.status == 400 and "window_s" in (await r.json())["error"]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def guarded(
    demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    tmp = tmp_path_factory.mktemp("dashboard-guarded")
    repo = make_repo(tmp / "repo", demo_repo, {"sensor_mlp": None})
    async with running_gateway(repo, tmp / "cache", admin_token=TOKEN) as gw:
        yield gw


async def test_admin_token_guards_the_data_not_the_page(
    guarded: Gateway, http: aiohttp.ClientSession
) -> None:
    url = base_url(guarded)
    async with http.get(url + "/dashboard") as r:
        assert r.status == 200  # the page holds no data; it asks for the token
    async with http.get(url + DATA) as r:
        assert r.status == 401 and "Bearer" in r.headers["WWW-Authenticate"]
    async with http.get(url + DATA, headers={"Authorization": "Bearer wrong"}) as r:
        assert r.status == 401
    doc = await _document(http, url, {"Authorization": f"Bearer {TOKEN}"})
    assert [m["name"] for m in doc["models"]] == ["sensor_mlp"]


@pytest.mark.slow
async def test_mqtt_state_connected_reconnects_and_duplicates(
    demo_repo: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    port = free_port()
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": tmp_path / "cache"},
        mqtt={"broker": f"mqtt://127.0.0.1:{port}", "client_id": "dash-gw", "reconnect_max_s": 0.5},
    )
    gw = Gateway(settings)
    try:
        with mosquitto(_folder(tmp_path / "first"), port=port):
            await gw.start(wait_ready=True)
            url = base_url(gw)
            await _until(lambda: _mqtt_is(http, url, connected=True), "MQTT shown connected")
            mqtt = (await _document(http, url))["mqtt"]
            assert mqtt["brokers"] == [{"broker": f"127.0.0.1:{port}", "connected": True}]
            assert (mqtt["in_flight"], mqtt["backlog"], mqtt["reconnects"]) == (0, 0, 0)
            await _duplicate_counted(gw, http, url, port)
        # The broker went away: shown at once; it comes back on the same port, and so does the
        # gateway, counting the reconnection attempts it made meanwhile.
        await _until(lambda: _mqtt_is(http, url, connected=False), "MQTT shown disconnected")
        with mosquitto(_folder(tmp_path / "second"), port=port):
            await _until(lambda: _mqtt_is(http, url, connected=True), "MQTT shown reconnected")
            assert (await _document(http, url))["mqtt"]["reconnects"] >= 1
    finally:
        await gw.stop()


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


async def _mqtt_is(http: aiohttp.ClientSession, url: str, *, connected: bool) -> bool:
    mqtt = (await _document(http, url))["mqtt"]
    return bool(mqtt is not None and mqtt["connected"] is connected)


async def _duplicate_counted(gw: Gateway, http: aiohttp.ClientSession, url: str, port: int) -> None:
    inputs = random_inputs(gw.service.metadata("sensor_mlp"), 1, np.random.default_rng(1))
    async with device(port, "dash-dev") as dev:
        assert "outputs" in await dev.request("sensor_mlp", json_payload(inputs, "a"), "a")
        # The same request again (same Correlation Data): a redelivery, counted, and answered
        # with the first reply again (not computed twice).
        assert "outputs" in await dev.request("sensor_mlp", json_payload(inputs, "a"), "a")

        async def one_duplicate() -> bool:
            return bool((await _document(http, url))["mqtt"]["duplicates"] == 1)

        await _until(one_duplicate, "the repeated request counted as a duplicate")
        assert len(dev.replies) == 2
