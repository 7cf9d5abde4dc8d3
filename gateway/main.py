"""Wiring: settings -> executor, metrics, service, HTTP server. Nothing else lives here."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from aiohttp import web

from gateway.broker import EmbeddedBroker
from gateway.http import build_app
from gateway.metrics import GatewayMetrics
from gateway.mqtt import BrokerAddress, MqttAdapter
from gateway.service import InferenceService
from gateway.settings import GatewaySettings
from gateway.tuning import TuningService
from models.repository import scan_repository

log = logging.getLogger("gateway")


def resolve_model_repo(settings: GatewaySettings) -> Path:
    if settings.serving.model_repo is not None:
        return settings.serving.model_repo
    from models.demo import ensure_demo_repository

    root = ensure_demo_repository(settings.serving.cache_dir / "demo-repo-v1")
    log.info("no --model-repo given: serving the bundled demo repository at %s", root)
    return root


class Gateway:
    """The running gateway. ``async with Gateway(settings) as gw`` starts HTTP at once and loads
    the models in the background (``/v2/health/ready`` says when they serve)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.executor = ThreadPoolExecutor(
            max_workers=settings.serving.executor_threads, thread_name_prefix="iotgw-exec"
        )
        self.metrics = GatewayMetrics()
        self.service = InferenceService(
            executor=self.executor,
            metrics=self.metrics,
            serving=settings.serving,
        )
        self.tuning: TuningService | None = (
            TuningService(self.service, settings.tuner, self.metrics)
            if settings.tuner.enabled
            else None
        )
        self._runner: web.AppRunner | None = None
        self.broker: EmbeddedBroker | None = None
        self.mqtt: MqttAdapter | None = None
        self._mqtt_task: asyncio.Task[None] | None = None
        self._loading: asyncio.Task[None] | None = None
        self.http_port: int = settings.http.port

    async def start(self, *, wait_ready: bool = False) -> None:
        loop = asyncio.get_running_loop()
        # Building the demo repository exports TF models (seconds): keep the loop free.
        repo = await loop.run_in_executor(self.executor, resolve_model_repo, self.settings)
        self.service.add_versions(scan_repository(repo))
        app = build_app(self.service, self.settings.http, self.executor, self.tuning)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.http.host, self.settings.http.port)
        await site.start()
        addresses = self._runner.addresses  # the bound ones: port 0 picks a free port
        if addresses:
            self.http_port = int(addresses[0][1])
        log.info("HTTP listening on http://%s:%d", self.settings.http.host, self.http_port)
        self._loading = asyncio.create_task(self._load(), name="load-models")
        if self.settings.mqtt.enabled:
            await self._start_mqtt()
        if wait_ready:
            await self._loading

    async def _load(self) -> None:
        await self.service.load_all()
        if self.tuning is not None:
            self.tuning.start()  # agents need loaded models: their knobs, limits and SLO

    async def _start_mqtt(self) -> None:
        mqtt = self.settings.mqtt
        if mqtt.broker is None:
            self.broker = EmbeddedBroker(port=mqtt.embedded_port)
            await self.broker.start()
            address, protocol = BrokerAddress("127.0.0.1", self.broker.port, False), "3.1.1"
            log.info(
                "no --broker given: devices can publish to %s (embedded, MQTT 3.1.1)",
                self.broker.url,
            )
        else:
            address, protocol = BrokerAddress.parse(mqtt.broker), mqtt.protocol
        self.mqtt = MqttAdapter(
            service=self.service, settings=mqtt, address=address, protocol=protocol
        )
        self._mqtt_task = asyncio.create_task(self._run_mqtt(self.mqtt), name="mqtt")

    async def _run_mqtt(self, adapter: MqttAdapter) -> None:
        # Subscribe only once the models are loaded: the broker may hold a backlog of requests
        # for this session, and every one taken before then would be refused as unavailable.
        if self._loading is not None:
            await asyncio.shield(self._loading)
        await adapter.run()

    async def wait_loaded(self) -> None:
        if self._loading is not None:
            await self._loading

    async def stop(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loading
        if self.tuning is not None:
            await self.tuning.stop()  # no knob change may start while the models unload
        if self.mqtt is not None and self._mqtt_task is not None:
            # Drain first: requests already taken from the broker are answered and acknowledged.
            await self.mqtt.shutdown()
            try:
                await asyncio.wait_for(self._mqtt_task, self.settings.mqtt.drain_timeout_s + 5)
            except TimeoutError:
                log.warning(
                    "MQTT adapter did not stop in time; unanswered requests will be "
                    "redelivered by the broker"
                )
        if self.broker is not None:
            await self.broker.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.service.close()
        self.executor.shutdown(wait=True, cancel_futures=True)

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


async def serve(settings: GatewaySettings) -> None:
    """Run until SIGINT or SIGTERM, then drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Gateway(settings) as gw:
        await gw.wait_loaded()
        # Everything allocated so far (TF, sessions, modules) lives as long as the process:
        # moved out of the collector's reach, a full collection no longer walks it (~0.25 s
        # with TF loaded, a pause every device would feel).
        gc.collect()
        gc.freeze()
        for s in gw.service.statuses():
            log.info(
                "  %s v%d: %s%s", s.name, s.version, s.state, f" ({s.reason})" if s.reason else ""
            )
        log.info("ready: http://%s:%d/v2", settings.http.host, gw.http_port)
        await stop.wait()
        log.info("shutting down")
