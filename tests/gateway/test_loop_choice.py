"""The event loop ``iotgw serve`` runs on (``serving.event_loop``): uvloop where installed, the
standard loop on request; on uvloop the gateway serves HTTP and MQTT through a real Mosquitto
(its managed child), answers what the runtime computes, and stops cleanly with its child."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from gateway import event_loop
from gateway.brokers.mosquitto import broker_dir
from tests.brokers import free_port
from tests.gateway.helpers import GENEROUS_TIMEOUT_US, Reference, json_request, make_repo
from tests.gateway.mqtt_client import device, framed_binary_request, json_payload, outputs_of
from tests.gateway.serve_process import mosquitto_children, port_free, serve

MODEL = "sensor_mlp"


def test_auto_takes_uvloop_and_asyncio_is_the_standard_loop() -> None:
    import uvloop

    assert event_loop.loop_factory("asyncio") == ("asyncio", None)
    name, factory = event_loop.loop_factory("auto")
    assert name == f"uvloop {uvloop.__version__}" and factory is uvloop.new_event_loop

    async def loop_type() -> type:
        return type(asyncio.get_running_loop())

    assert event_loop.run(loop_type(), "uvloop") is uvloop.Loop
    assert event_loop.run(loop_type(), "asyncio") is type(asyncio.new_event_loop())


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # the interpreter's own import blocker
    assert event_loop.loop_factory("auto") == ("asyncio", None)
    with pytest.raises(event_loop.EventLoopUnavailable, match="not installed"):
        event_loop.loop_factory("uvloop")


def test_serve_refuses_uvloop_where_it_is_not_installed(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "tests.without_packages", "uvloop", "--"]
    serve_args = ["serve", "--model-repo", str(tmp_path), "--event-loop", "uvloop", "--no-mqtt"]
    done = subprocess.run(argv + serve_args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "uvloop is not installed" in done.stderr


@pytest.fixture(name="small_repo", scope="module")
def _small_repo(demo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("repo"), demo_repo, {MODEL: None})


@pytest.mark.slow
async def test_gateway_on_uvloop_serves_http_and_mqtt_and_stops_cleanly(
    small_repo: Path, tmp_path: Path
) -> None:
    rng = np.random.default_rng(5)
    inputs = {"features": rng.standard_normal((2, 32)).astype(np.float32)}
    reference = Reference(small_repo)
    want = reference.infer(MODEL, inputs)["probabilities"]
    reference.close()
    port = free_port()
    config = broker_dir(tmp_path, port) / "mosquitto.conf"
    args = ("--mqtt-port", str(port), "--event-loop", "uvloop", "--log-level", "DEBUG")
    with serve(small_repo, tmp_path, *args) as gw:
        gw.wait_ready()
        assert "event loop: uvloop" in gw.text()
        assert len(mosquitto_children(config)) == 1
        async with aiohttp.ClientSession() as http:
            url = f"{gw.url}/v2/models/{MODEL}/infer"
            async with http.post(url, json=json_request(inputs)) as resp:
                assert resp.status == 200
                (out,) = json.loads(await resp.read())["outputs"]
            async with http.post(url, data=b'{"inputs": [NaN]}') as resp:
                assert resp.status == 400 and "error" in await resp.json()
        got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for v5 in (True, False):
            async with device(port, f"dev-{v5}", v5=v5) as dev:
                by_json = await dev.request(MODEL, json_payload(inputs, "j"), "j")
                binary = framed_binary_request(inputs, id="b")
                by_binary = await dev.request(MODEL, binary, "b")
            for reply in (by_json, by_binary):
                assert reply["status"] == 200, reply
                np.testing.assert_allclose(
                    outputs_of(reply)["probabilities"], want, rtol=1e-5, atol=1e-6
                )
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0
    assert mosquitto_children(config) == []
    assert port_free(port)


@pytest.mark.slow
async def test_gateway_on_the_standard_loop_and_json_answers_the_same(
    small_repo: Path, tmp_path: Path
) -> None:
    """The configuration the benchmark measures as "before" still serves."""
    inputs = {"features": np.random.default_rng(6).standard_normal((1, 32)).astype(np.float32)}
    body = json.dumps({**json_request(inputs), "parameters": {"timeout": GENEROUS_TIMEOUT_US}})
    args = (
        "--no-mqtt",
        "--event-loop",
        "asyncio",
        "--json-codec",
        "stdlib",
        "--log-level",
        "DEBUG",
    )
    with serve(small_repo, tmp_path, *args) as gw:
        gw.wait_ready()
        assert "event loop: asyncio" in gw.text()
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{gw.url}/v2/models/{MODEL}/infer", data=body) as resp,
        ):
            assert resp.status == 200
            (out,) = (await resp.json())["outputs"]
        assert out["shape"][0] == 1 and len(out["data"]) == np.prod(out["shape"])
        gw.process.send_signal(signal.SIGTERM)
        assert gw.wait_exit() == 0
