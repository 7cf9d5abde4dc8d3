"""An ingest process: ``python -m gateway.ingest.worker --index K --socket PATH``, started by
the serving process (``supervisor``). It takes HTTP connections on the gateway's port (shared
through SO_REUSEPORT, so the kernel spreads connections over the processes) and, when the broker
has shared subscriptions, MQTT requests as one more member of the gateway's share group. It
decodes and encodes at the same edge as the serving process would; tensors go to the serving
process over the hub's socket; every other route is passed to the serving process as it came."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from gateway import event_loop
from gateway.codecs import json_codec
from gateway.edge import Edge
from gateway.http import security as http_security
from gateway.http.app import (
    CORE_KEY,
    EDGE_KEY,
    SETTINGS_KEY,
    add_inference_routes,
    error_middleware,
)
from gateway.http.refusal_pace import REFUSAL_PACE_KEY, refusal_pace
from gateway.ingest import proxy
from gateway.ingest.remote import RemoteService
from gateway.lifecycle import InFlight
from gateway.logs import configure_logging
from gateway.mqtt.adapter import MqttAdapter
from gateway.mqtt.session import BrokerAddress
from gateway.settings.schema import GatewaySettings

log = logging.getLogger("gateway.ingest")

_LIVE_EVERY_S = 0.5
_HTTP_CLOSE_S = 2.0


class IngestProcess:
    def __init__(self, remote: RemoteService, settings: GatewaySettings) -> None:
        self.remote = remote
        self.settings = settings
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="iotgw-ingest")
        self.in_flight = InFlight()
        self.mqtt: MqttAdapter | None = None
        self._mqtt_task: asyncio.Task[None] | None = None
        self._http_listening = False

    def edge(self, transport: str) -> Edge:
        return Edge(
            service=self.remote,
            executor=self.executor,
            limits=self.settings.serving.decode_limits(),
            transport=transport,
        )

    async def start_http(self, stack: contextlib.AsyncExitStack, port: int) -> None:
        http = self.settings.http
        app = web.Application(client_max_size=http.max_body_bytes, middlewares=[error_middleware])
        app[SETTINGS_KEY] = http
        app[EDGE_KEY] = self.edge("http")
        app[REFUSAL_PACE_KEY] = refusal_pace(http, self.remote.metrics)
        app[CORE_KEY] = self.remote
        app.middlewares.append(self.in_flight.middleware)
        http_security.install(app, http, self.remote.metrics)
        add_inference_routes(app.router)
        proxy.install(app, self.remote.setup["internal_url"])
        runner = http_security.http_runner(
            app, http, access_log=None, handle_signals=False, shutdown_timeout=_HTTP_CLOSE_S
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        ssl_context = http_security.server_ssl_context(http)
        await web.TCPSite(runner, http.host, port, ssl_context=ssl_context, reuse_port=True).start()
        self._http_listening = True

    def start_mqtt(self, mqtt: dict[str, Any]) -> None:
        base = self.settings.mqtt
        # A stable client id per slot: the broker keeps this member's session across restarts.
        client_id = f"{base.client_id[:56]}-i{self.remote.index}"
        adapter = MqttAdapter(
            service=self.remote,
            settings=base.model_copy(update={"client_id": client_id}),
            address=BrokerAddress(mqtt["host"], mqtt["port"], mqtt["tls"]),
            protocol=mqtt["protocol"],
            edge=self.edge("mqtt"),
        )
        self.mqtt = adapter
        self._mqtt_task = asyncio.create_task(adapter.run(), name="mqtt")

    def report_live(self) -> None:
        mqtt = None if self.mqtt is None else self.mqtt.connected.is_set()
        self.remote.report_live(http=self._http_listening, mqtt=mqtt)
        if self.mqtt is not None:
            self.remote.report_state(
                {
                    "mqtt_connected": float(bool(mqtt)),
                    "mqtt_in_flight": float(self.mqtt.in_flight),
                    "mqtt_backlog": float(self.mqtt.backlog),
                }
            )

    async def drain(self, grace_s: float) -> bool:
        """Stop taking MQTT requests and answer those taken; let HTTP requests finish."""
        mqtt_done = True
        if self.mqtt is not None and self._mqtt_task is not None:
            await self.mqtt.shutdown()
            done, _ = await asyncio.wait({self._mqtt_task}, timeout=grace_s)
            mqtt_done = bool(done)
            if not done:
                self._mqtt_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._mqtt_task
        http_done = await self.in_flight.wait_idle(grace_s)
        return mqtt_done and http_done


async def run(index: int, path: str) -> int:
    remote = RemoteService(index)
    await remote.connect(path)
    settings: GatewaySettings = remote.setup["settings"]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ingest = IngestProcess(remote, settings)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(remote.close)
        stack.callback(ingest.executor.shutdown, wait=False, cancel_futures=True)
        await ingest.start_http(stack, remote.setup["http_port"])
        if remote.setup.get("mqtt"):
            ingest.start_mqtt(remote.setup["mqtt"])
        log.debug("ingest %d: taking requests", index)
        while not stop.is_set() and not remote.closed.is_set():
            ingest.report_live()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _LIVE_EVERY_S)
        if remote.closed.is_set() and not stop.is_set():
            log.error("ingest %d: the serving process is gone; exiting", index)
            return 1
        clean = await ingest.drain(settings.serving.shutdown_grace_s)
    return 0 if clean else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.ingest.worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("text", "json"), default="text")
    parser.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto")
    parser.add_argument("--json-codec", choices=("orjson", "stdlib"), default="orjson")
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    json_codec.select(args.json_codec)
    try:
        return event_loop.run(run(args.index, args.socket), args.event_loop)
    except (ConnectionError, FileNotFoundError) as exc:
        print(f"iotgw ingest {args.index}: no serving process: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
