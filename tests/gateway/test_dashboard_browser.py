"""The dashboard page in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium) against a real gateway on 127.0.0.1 with an admin token, a real Mosquitto,
gRPC and the online tuner: the page asks for the token, lists the served models, its numbers
move under load, busy models come first with a totals row, idle ones fold, the error replies
head the page, the trend is drawn from the gateway's history at once, the gRPC block says where
it listens and counts gRPC requests, and a screenshot is left as an artifact. The browser is
required, not optional: the test command installs it, and without it this test fails saying
so."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio

from gateway.main import Gateway
from gateway.settings.schema import GatewaySettings
from tests.brokers import mosquitto
from tests.gateway.helpers import (
    GENEROUS_TIMEOUT_US,
    base_url,
    infer_binary,
    make_repo,
    random_inputs,
)

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]

TOKEN = "browser-admin-0123"
MODELS = ("sensor_mlp", "vision_cnn")
T = TypeVar("T")
DASH = "\N{EN DASH}"  # the page's "no value"


def _browser_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail(
            "the dashboard test needs Debian's chromium and chromium-driver (found browser: "
            f"{browser}, driver: {driver}); scripts/test.sh installs them, or run "
            "`apt-get install chromium chromium-driver`",
            pytrace=False,
        )
    return browser, driver


@contextlib.contextmanager
def _chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",  # the tests may run as root, where Chromium's sandbox refuses to start
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1500,1300",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager would otherwise try to download one.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


async def _wait(driver: Any, condition: Callable[[Any], T], what: str, timeout_s: float = 60) -> T:
    """Selenium's explicit wait, in a thread: the gateway serving the page shares this loop."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def wait() -> T:
        # The page re-renders its rows on every poll: an element read while it is replaced is
        # stale, which only means "look again".
        return WebDriverWait(
            driver,
            timeout_s,
            poll_frequency=0.2,
            ignored_exceptions=(StaleElementReferenceException,),
        ).until(condition)

    try:
        return await asyncio.to_thread(wait)
    except TimeoutException:
        pytest.fail(f"the page did not show {what} within {timeout_s:g} s", pytrace=False)


def _cell(driver: Any, model: str, field: str) -> str:
    return _text(driver, f'tr[data-model="{model}"] [data-field="{field}"]')


def _text(driver: Any, selector: str) -> str:
    """The text of the first element matching ``selector`` ("" when none), read again when the
    page's next render replaced the element between finding and reading it."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(50):
        try:
            found = driver.find_elements(By.CSS_SELECTOR, selector)
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector} kept being replaced while read")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


@contextlib.asynccontextmanager
async def _gateway(demo_repo: Path, tmp_path: Path) -> AsyncIterator[Gateway]:
    repo = make_repo(tmp_path / "repo", demo_repo, {name: None for name in MODELS})
    with mosquitto(tmp_path) as broker:
        settings = GatewaySettings.load(
            http={"port": 0, "host": "127.0.0.1", "admin_token": TOKEN},
            serving={"model_repo": repo, "cache_dir": tmp_path / "cache"},
            mqtt={"broker": broker.url, "client_id": "dashboard-browser"},
            # Decisions after a few requests, so the tuner's table fills within the test.
            tuner={"enabled": True, "models": ["sensor_mlp"], "min_requests": 5},
        )
        async with Gateway(settings) as gw:
            await gw.wait_loaded()
            yield gw


async def _load(gw: Gateway, stop: asyncio.Event, sent: list[int]) -> None:
    """Requests to sensor_mlp from 4 clients until ``stop`` (bounded by 20 000 in all)."""
    url = base_url(gw)
    inputs = random_inputs(gw.service.metadata("sensor_mlp"), 1, np.random.default_rng(0))
    async with aiohttp.ClientSession() as http:

        async def client() -> None:
            while not stop.is_set() and sent[0] < 20_000:
                status, _, _ = await infer_binary(http, url, "sensor_mlp", inputs)
                assert status == 200
                sent[0] += 1

        await asyncio.gather(*(client() for _ in range(4)))


async def _grpc_block(driver: Any, gw: Gateway) -> None:
    """Beside the MQTT block: where gRPC listens, a dash for its requests until it has some,
    then their count."""
    assert gw.grpc is not None
    target = f"127.0.0.1:{gw.grpc.port}"
    assert _text(driver, '#grpc [data-field="grpc-state"]') == "listening"
    assert _text(driver, '#grpc [data-field="grpc-address"]') == f"{target} (plaintext)"
    requests = '#grpc [data-field="grpc-requests"]'
    assert _text(driver, requests) == DASH  # only HTTP so far
    x = np.random.default_rng(3).standard_normal((1, 32)).astype(np.float32)
    async with triton_aio.InferenceServerClient(target) as client:
        for _ in range(2):
            tensor = triton_aio.InferInput("features", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            await client.infer("sensor_mlp", [tensor], timeout=GENEROUS_TIMEOUT_US)
    await _wait(driver, lambda d: _text(d, requests) == "2 (2 ok)", "two gRPC requests counted")


async def test_dashboard_in_a_real_browser(demo_repo: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    async with _gateway(demo_repo, tmp_path) as gw:
        with _chromium() as driver:
            await asyncio.to_thread(driver.get, base_url(gw) + "/dashboard")
            # The data needs the admin token: the page asks for it once.
            await _wait(
                driver, lambda d: d.find_element(By.ID, "token").is_displayed(), "the token prompt"
            )
            token_input = driver.find_element(By.ID, "token")
            await asyncio.to_thread(token_input.send_keys, TOKEN)
            await asyncio.to_thread(driver.find_element(By.CSS_SELECTOR, "#login button").click)
            # No traffic yet: both models are idle, folded behind one row.
            toggle = '[data-field="idle-toggle"]'
            await _wait(
                driver, lambda d: _text(d, toggle) == "2 idle models (show)", "the idle fold"
            )
            await asyncio.to_thread(driver.find_element(By.CSS_SELECTOR, toggle).click)
            await _wait(
                driver,
                lambda d: all(_cell(d, m, "state") == "READY" for m in MODELS),
                f"the models {MODELS} as READY",
            )
            assert _number(_cell(driver, "sensor_mlp", "rate")) == 0.0
            assert _cell(driver, "vision_cnn", "p95") == DASH  # no latency without requests
            # One refused request: the error replies are the page's first section.
            async with aiohttp.ClientSession() as http:
                bad = f"{base_url(gw)}/v2/models/sensor_mlp/infer"
                async with http.post(bad, data=b'{"inputs": "abc"}') as resp:
                    assert resp.status == 400
            await _wait(
                driver,
                lambda d: _text(d, '#errors [data-error="http/bad_request"] td.num') == "1",
                "the refused request among the error replies",
            )
            sections = driver.find_elements(By.CSS_SELECTOR, "main > section h2")
            assert sections[0].text.startswith("Error replies")

            stop, sent = asyncio.Event(), [0]
            load = asyncio.create_task(_load(gw, stop, sent))
            try:
                await _wait(
                    driver,
                    lambda d: (
                        _number(_cell(d, "sensor_mlp", "rate")) > 0
                        and _number(_cell(d, "sensor_mlp", "p95")) > 0
                    ),
                    "a non-zero request rate and p95 for sensor_mlp",
                )
                # The busy model heads the table, the idle one stays below the fold row.
                await _wait(
                    driver,
                    lambda d: (
                        _text(d, "#busy-models tr:first-child td") == "sensor_mlp"
                        and _text(d, toggle) == "1 idle model (hide)"
                        and _number(_text(d, '#totals [data-field="rate"]')) > 0
                    ),
                    "sensor_mlp first, vision_cnn folded as idle, a total rate",
                )
                await _wait(
                    driver,
                    lambda d: any(
                        c.text not in ("", DASH)  # the page's "no value"
                        for c in d.find_elements(
                            By.CSS_SELECTOR,
                            '[data-tuned-model="sensor_mlp"] [data-field="measured"]',
                        )
                    ),
                    "a tuner decision with its measured objective",
                )
            finally:
                stop.set()
                await load
            # Reloaded, the page draws the last minute at once, from the gateway's history.
            await asyncio.to_thread(driver.refresh)
            trend = 'tr[data-model="sensor_mlp"] [data-field="trend"] polyline'
            points = await _wait(
                driver,
                lambda d: d.find_element(By.CSS_SELECTOR, trend).get_attribute("points"),
                "the trend after a reload",
            )
            heights = [float(p.split(",")[1]) for p in points.split()]
            assert len(heights) == 60 and min(heights) < 23  # not a flat, empty line
            mqtt_state = _text(driver, '#mqtt [data-field="mqtt-state"]')
            assert mqtt_state == "connected"
            await _grpc_block(driver, gw)
            assert sent[0] > 0
            shot = tmp_path / "dashboard.png"
            assert await asyncio.to_thread(driver.save_screenshot, str(shot))
            print(f"dashboard screenshot: {shot}")
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    # The 401 that made the page ask for the token is the one error the console may show.
    assert all("dashboard.json" in e["message"] and "401" in e["message"] for e in errors), errors
