"""The one line that says the gateway is ready (gateway/startup_log.py): written when
``/v2/health/ready`` turns 200, naming where devices publish and read replies; a warning
instead while it cannot be ready, at once when waiting cannot end by itself (an empty
repository, a required model that failed), after the patience otherwise (a broker that does
not answer), and the ready line after all once the broker is up, counting the models serving
then. Real gateways in-process, a real Mosquitto; the patience is passed in."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from gateway.startup_log import announce_ready, endpoints, ready_line, serving
from tests.brokers import free_port, mosquitto
from tests.gateway.helpers import make_repo

on_session_loop = pytest.mark.asyncio(loop_scope="session")


def _settings(repo: Path, cache: Path, *, broker: str | None) -> GatewaySettings:
    mqtt = {"broker": broker, "reconnect_min_s": 0.05, "reconnect_max_s": 0.2}
    return GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": cache},
        mqtt=mqtt if broker is not None else {"enabled": False},
    )


def _line(gw: Gateway) -> Callable[[], str]:
    where = endpoints(gw.settings, gw.http_port, gw.broker_address)
    return lambda: ready_line(where, serving(gw.service.registry))


def _messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gateway" and r.levelno == level]


@on_session_loop
async def test_ready_waits_for_the_broker_and_says_where_devices_publish(
    demo_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    port = free_port()  # nothing listens there yet
    async with Gateway(
        _settings(repo, tmp_path / "cache", broker=f"mqtt://127.0.0.1:{port}")
    ) as gw:
        await gw.wait_loaded()
        announcing = asyncio.create_task(announce_ready(gw.readiness, _line(gw), patience_s=0.3))
        await asyncio.sleep(1.0)
        assert not announcing.done()  # models loaded and HTTP listening are not ready
        [warning] = _messages(caplog, logging.WARNING)
        assert f"mqtt: not subscribed (127.0.0.1:{port})" in warning and "--broker" in warning
        assert not any(m.startswith("ready:") for m in _messages(caplog, logging.INFO))
        (tmp_path / "broker").mkdir()
        with mosquitto(tmp_path / "broker", port=port):
            await asyncio.wait_for(announcing, 30)
            assert gw.readiness.ready  # the line came when readiness did, not before
        [ready] = [m for m in _messages(caplog, logging.INFO) if m.startswith("ready:")]
    assert ready.startswith(
        f"ready: http://127.0.0.1:{gw.http_port}/v2 and mqtt://127.0.0.1:{port}"
    )
    assert "devices publish to iotgw/infer/<model>/req/<device_id>" in ready
    assert "read replies on iotgw/infer/<model>/res/<device_id>" in ready
    assert "iotgw/infer/+/res/<device_id>/#" in ready


@on_session_loop
async def test_an_empty_repository_is_told_at_once_and_never_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    (tmp_path / "empty").mkdir()
    async with Gateway(_settings(tmp_path / "empty", tmp_path / "cache", broker=None)) as gw:
        await gw.wait_loaded()
        announcing = asyncio.create_task(announce_ready(gw.readiness, _line(gw), patience_s=60))
        await asyncio.sleep(0.3)  # far below the patience: the warning does not wait for it
        announcing.cancel()
    [warning] = _messages(caplog, logging.WARNING)
    assert "models: the repository is empty" in warning
    assert "POST /v2/repository/models/<model>/load" in warning  # what loads a model put there
    assert not any(m.startswith("ready:") for m in _messages(caplog, logging.INFO))


@on_session_loop
async def test_a_model_loaded_into_an_empty_repository_makes_it_ready_and_is_counted(
    demo_repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    (tmp_path / "repo").mkdir()
    async with Gateway(_settings(tmp_path / "repo", tmp_path / "cache", broker=None)) as gw:
        await gw.wait_loaded()
        announcing = asyncio.create_task(announce_ready(gw.readiness, _line(gw), patience_s=60))
        make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
        url = f"http://127.0.0.1:{gw.http_port}/v2/repository/models/sensor_mlp/load"
        async with aiohttp.ClientSession() as http, http.post(url) as reply:
            assert reply.status == 200
        await asyncio.wait_for(announcing, 30)
    [ready] = [m for m in _messages(caplog, logging.INFO) if m.startswith("ready:")]
    assert "serves 1 model version (MQTT off)" in ready  # the models serving when it came


def test_the_ready_line_without_mqtt_says_so() -> None:
    from gateway.startup_log import Endpoints

    line = ready_line(Endpoints("http://127.0.0.1:8080/v2"), 1)
    assert line == "ready: http://127.0.0.1:8080/v2 serves 1 model version (MQTT off)"
