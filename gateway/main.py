"""Wiring: settings -> executor, metrics, service, HTTP server, MQTT adapter and embedded broker,
each started through one ``AsyncExitStack`` so that whatever a failed start opened is closed
again, and stopped by draining before closing. Nothing else lives here."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.brokers.embedded import EmbeddedBroker, embedded_broker
from gateway.edge import Edge
from gateway.http.app import build_app
from gateway.http.security import http_runner, server_ssl_context
from gateway.ingest.hub import IngestHub
from gateway.ingest.supervisor import IngestSupervisor
from gateway.lifecycle import InFlight, Readiness, StartupError, models_check
from gateway.metrics import GatewayMetrics
from gateway.model_loading import resolve_model_repo
from gateway.mqtt.adapter import MqttAdapter
from gateway.mqtt.session import BrokerAddress
from gateway.ports import check_ports
from gateway.service import InferenceService
from gateway.settings.schema import GatewaySettings
from gateway.startup_log import announce_ready, endpoints, ready_line, serving, until_loaded
from gateway.tuning import TuningService
from models.repository import RepositoryError, scan_repository

if TYPE_CHECKING:
    from gateway.grpc.server import GrpcServer

log = logging.getLogger("gateway")

# After the drain, what aiohttp may still take to close idle keep-alive connections and
# finish writing the last responses.
_HTTP_CLOSE_S = 2.0
# How long the tuner's start waits for the MQTT subscription (``Gateway._load``).
_TUNER_AFTER_MQTT_S = 10.0


class Gateway:
    """The running gateway. ``async with Gateway(settings) as gw`` starts HTTP at once and loads
    the models in the background; ``gw.readiness`` (``/v2/health/ready``) says when every
    configured ingest takes requests. ``start`` raises ``StartupError`` after closing whatever
    it had opened; ``stop`` drains (``drain``), then closes everything in reverse order."""

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
        self.readiness = Readiness()
        self.broker: EmbeddedBroker | None = None
        self.mqtt: MqttAdapter | None = None
        self.broker_address: BrokerAddress | None = None  # the one MQTT serves on, if any
        self.http_port: int = settings.http.port
        self._http_in_flight = InFlight()
        self.grpc: GrpcServer | None = None
        self.hub: IngestHub | None = None
        self.ingest: IngestSupervisor | None = None
        self._reserved: socket.socket | None = None
        self._http_listening = False
        self._mqtt_task: asyncio.Task[None] | None = None
        self._loading: asyncio.Task[None] | None = None
        self._models_loaded = asyncio.Event()
        self._stack: contextlib.AsyncExitStack | None = None

    async def start(self, *, wait_ready: bool = False) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await self._start(stack)
            self._stack = stack.pop_all()  # started: the undo steps now wait for ``close``
        if wait_ready:
            await self.wait_loaded()

    def _close_executor(self) -> None:
        # A call the batch watchdog gave up on still holds its thread, and a Python thread
        # cannot be stopped: waiting for it would hang the shutdown for good.
        stuck = self.service.stuck_calls
        if stuck:
            log.warning("%d backend call(s) stuck past the watchdog are abandoned", stuck)
        self.executor.shutdown(wait=not stuck, cancel_futures=True)

    async def _start(self, stack: contextlib.AsyncExitStack) -> None:
        # Each step registers its undo right after it succeeds; they run in reverse order.
        stack.callback(self._close_executor)
        check_ports(self.settings)  # every busy port at once, before anything starts
        external = _external_broker(self.settings) if self.settings.mqtt.enabled else None
        loop = asyncio.get_running_loop()
        # Building the demo repository exports TF models (seconds): keep the loop free.
        repo = await loop.run_in_executor(self.executor, resolve_model_repo, self.settings)
        try:
            self.service.registry.add_versions(scan_repository(repo))
            self.service.registry.repository = repo  # reloads read the same folder
        except RepositoryError as exc:
            raise StartupError(f"{exc} (set --model-repo)") from exc
        stack.push_async_callback(self.service.registry.close)
        if self.settings.mqtt.enabled and external is None:
            await self._start_embedded_broker(stack)
        processes = self.settings.serving.ingest_processes
        if processes:
            self.hub = IngestHub(self.service, self.settings)
            await self.hub.start()
            stack.push_async_callback(self.hub.close)
        await self._start_http(stack)
        if self.settings.grpc.enabled:
            await self._start_grpc(stack)
        self.readiness.require(models_check(self.service.registry))
        self._loading = asyncio.create_task(self._load(), name="load-models")
        stack.push_async_callback(self._stop_loading)
        broker = self._broker_address(external) if self.settings.mqtt.enabled else None
        self.broker_address = broker[0] if broker is not None else None
        if processes:
            self._start_ingest(stack, broker)
        if broker is not None and not (processes and _shares(self.settings, broker[1])):
            self._start_mqtt(stack, *broker)

    async def _start_http(self, stack: contextlib.AsyncExitStack) -> None:
        http = self.settings.http
        app = build_app(
            self.service,
            http,
            self.executor,
            self.tuning,
            limits=self.settings.serving.decode_limits(),
            readiness=self.readiness,
        )
        app.middlewares.append(self._http_in_flight.middleware)
        runner = http_runner(
            app, http, access_log=None, handle_signals=False, shutdown_timeout=_HTTP_CLOSE_S
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        if self.hub is not None:
            # The ingest processes take the public port; this process only answers what they
            # pass on (metadata, admin, metrics), on loopback.
            self.http_port = self._reserve_port(stack)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.hub.setup["internal_url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self._http_listening = True
            scheme = "https" if http.tls_cert_file else "http"
            log.info("HTTP listening on %s://%s:%d", scheme, http.host, self.http_port)
            return
        try:
            await web.TCPSite(
                runner, http.host, http.port, ssl_context=server_ssl_context(http)
            ).start()
        except OSError as exc:
            raise StartupError(_bind_error(http.host, http.port, exc)) from exc
        addresses = runner.addresses  # the bound ones: port 0 picks a free port
        if addresses:
            self.http_port = int(addresses[0][1])
        self._http_listening = True
        self.readiness.require(lambda: None if self._http_listening else "http: not listening")
        scheme = "https" if http.tls_cert_file else "http"
        log.info("HTTP listening on %s://%s:%d", scheme, http.host, self.http_port)

    async def _start_grpc(self, stack: contextlib.AsyncExitStack) -> None:
        from gateway.grpc.server import GrpcServer  # grpcio only loads when gRPC is on

        edge = Edge(
            service=self.service,
            executor=self.executor,
            limits=self.settings.serving.decode_limits(),
            transport="grpc",
        )
        server = GrpcServer(
            settings=self.settings.grpc,
            http=self.settings.http,
            service=self.service,
            edge=edge,
            readiness=self.readiness,
            executor=self.executor,
        )
        await server.start()
        stack.push_async_callback(server.stop, _HTTP_CLOSE_S)
        self.grpc = server

    async def _start_embedded_broker(self, stack: contextlib.AsyncExitStack) -> None:
        broker = embedded_broker(self.settings.mqtt, self.settings.serving.cache_dir)
        await broker.start()
        stack.push_async_callback(broker.stop)
        self.broker = broker
        log.debug(
            "no --broker given: devices can publish to %s (embedded %s, MQTT %s)",
            broker.url,
            broker.name,
            broker.protocol,
        )

    def _broker_address(self, external: BrokerAddress | None) -> tuple[BrokerAddress, str]:
        if external is not None:
            return external, self.settings.mqtt.protocol
        assert self.broker is not None
        return BrokerAddress(self.broker.host, self.broker.port, False), self.broker.protocol

    def _reserve_port(self, stack: contextlib.AsyncExitStack) -> int:
        """Bind (without listening) the public port with SO_REUSEPORT: the port is taken, a busy
        one is reported here, port 0 is resolved once, and every ingest process binds the same."""
        http = self.settings.http
        family = socket.AF_INET6 if ":" in http.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        stack.callback(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((http.host, http.port))
        except OSError as exc:
            raise StartupError(_bind_error(http.host, http.port, exc)) from exc
        self._reserved = sock
        return int(sock.getsockname()[1])

    def _start_ingest(
        self, stack: contextlib.AsyncExitStack, broker: tuple[BrokerAddress, str] | None
    ) -> None:
        hub, processes = self.hub, self.settings.serving.ingest_processes
        assert hub is not None
        hub.setup.update(settings=self.settings, http_port=self.http_port, mqtt=None)
        mqtt_too = broker is not None and _shares(self.settings, broker[1])
        if broker is not None and mqtt_too:
            address, protocol = broker
            hub.setup["mqtt"] = {
                "host": address.host,
                "port": address.port,
                "tls": address.tls,
                "protocol": protocol,
            }
        supervisor = IngestSupervisor(
            processes,
            hub.path,
            log_level=self.settings.log_level,
            log_format=self.settings.log_format,
            event_loop=self.settings.serving.event_loop,
            json_codec=self.settings.serving.json_codec,
            on_restart=self.metrics.ingest_restarts.inc,
        )
        supervisor.start()
        self.ingest = supervisor
        stack.push_async_callback(supervisor.stop, 0.0)  # after a drain: nothing left to wait
        self.readiness.require(lambda: _ingest_waits(hub, processes, mqtt_too))
        log.info(
            "%d ingest processes take HTTP%s on port %d",
            processes,
            " and MQTT" if mqtt_too else "",
            self.http_port,
        )

    def _start_mqtt(
        self, stack: contextlib.AsyncExitStack, address: BrokerAddress, protocol: str
    ) -> None:
        mqtt = self.settings.mqtt
        edge = Edge(
            service=self.service,
            executor=self.executor,
            limits=self.settings.serving.decode_limits(),
            transport="mqtt",
        )
        adapter = MqttAdapter(
            service=self.service, settings=mqtt, address=address, protocol=protocol, edge=edge
        )
        self.mqtt = adapter
        self._mqtt_task = asyncio.create_task(self._run_mqtt(adapter), name="mqtt")
        stack.push_async_callback(self._stop_mqtt, mqtt.drain_timeout_s + 5)
        where = f"{address.host}:{address.port}"
        # ``connected`` is set once the request subscription is granted, cleared when the
        # connection is lost: requests published before then would find no subscriber.
        self.readiness.require(
            lambda: None if adapter.connected.is_set() else f"mqtt: not subscribed ({where})"
        )

    async def _load(self) -> None:
        await self.service.registry.load_all()
        self._models_loaded.set()
        if self.tuning is None:
            return
        if self.mqtt is not None:
            # The agents' first steps run in threads of the loop's default executor, where
            # aiomqtt connects too: started at once, 24 of them held the subscription back
            # 7 s on 2 cores. The broker first, for a bounded while (HTTP serves meanwhile).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.mqtt.connected.wait(), _TUNER_AFTER_MQTT_S)
        self.tuning.start()  # agents need loaded models: their knobs, limits and SLO

    async def _run_mqtt(self, adapter: MqttAdapter) -> None:
        # Subscribe only once the models are loaded: the broker may hold a backlog of requests
        # for this session, and every one taken before then would be refused as unavailable.
        if self._loading is not None:
            loaded = asyncio.ensure_future(self._models_loaded.wait())
            # ... or once loading ended without them (cancelled): nothing more to wait for.
            await asyncio.wait({loaded, self._loading}, return_when=asyncio.FIRST_COMPLETED)
            loaded.cancel()
        await adapter.run()

    async def wait_models(self) -> None:
        """Until the models are loaded (the tuner may still be starting)."""
        await self._models_loaded.wait()

    async def wait_loaded(self) -> None:
        if self._loading is not None:
            await asyncio.shield(self._loading)

    async def drain(self, grace_s: float) -> bool:
        """Readiness turns 503; MQTT stops taking requests and answers those it took; the
        HTTP requests in flight finish (the server still listens meanwhile, so a load balancer
        reads the 503). True when all of it ended within ``grace_s``."""
        self.readiness.shutting_down()
        if self.tuning is not None:
            await self.tuning.stop()  # no knob change may start while the gateway drains
        mqtt_done, http_done, ingest_done, grpc_done = await asyncio.gather(
            self._stop_mqtt(grace_s),
            self._http_in_flight.wait_idle(grace_s),
            self.ingest.stop(grace_s) if self.ingest is not None else _true(),
            self.grpc.drain(grace_s) if self.grpc is not None else _true(),
        )
        if not ingest_done:
            log.warning("ingest processes did not all finish their requests within %.0f s", grace_s)
        if not http_done:
            log.warning(
                "%d HTTP requests still running after the %.0f s grace period",
                self._http_in_flight.count,
                grace_s,
            )
        return mqtt_done and http_done and grpc_done

    async def _stop_mqtt(self, timeout_s: float) -> bool:
        task = self._mqtt_task
        if self.mqtt is None or task is None:
            return True
        # Drain first: requests already taken from the broker are answered and acknowledged.
        await self.mqtt.shutdown()
        done, _ = await asyncio.wait({task}, timeout=max(timeout_s, 0.0))
        if not done:
            log.warning(
                "MQTT adapter did not stop in time; unanswered requests will be "
                "redelivered by the broker"
            )
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return bool(done)

    async def _stop_loading(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loading
        if self.tuning is not None:
            await self.tuning.stop()  # no knob change may start while the models unload

    async def close(self) -> None:
        """Undo every start-up step, newest first (MQTT, loading, HTTP, broker, models,
        executor); no drain."""
        stack, self._stack = self._stack, None
        self._http_listening = False
        if stack is not None:
            await stack.aclose()

    async def stop(self) -> bool:
        """Drain within ``serving.shutdown_grace_s``, then close; True when the drain was clean."""
        clean = True
        if self._stack is not None:
            clean = await self.drain(self.settings.serving.shutdown_grace_s)
        await self.close()
        return clean

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


async def _true() -> bool:
    return True


def _shares(settings: GatewaySettings, protocol: str) -> bool:
    """Whether ingest processes can take MQTT: only as members of one shared subscription
    (MQTT 5), or every process would get every request."""
    return protocol == "5" and settings.mqtt.shared_subscription != "off"


def _ingest_waits(hub: IngestHub, processes: int, mqtt: bool) -> str | None:
    live = hub.live()
    waiting = [
        i
        for i in range(processes)
        if not live.get(i, {}).get("http") or (mqtt and not live.get(i, {}).get("mqtt"))
    ]
    if not waiting:
        return None
    return f"ingest: process(es) {', '.join(map(str, waiting))} not taking requests yet"


def _external_broker(settings: GatewaySettings) -> BrokerAddress | None:
    if settings.mqtt.broker is None:
        return None
    try:
        return BrokerAddress.parse(settings.mqtt.broker)
    except ValueError as exc:
        raise StartupError(f"{exc} (set --broker)") from None


def _bind_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"HTTP port {port} is in use (set --http-port)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"HTTP host {host} is not an address of this machine (set --host)"
    return f"cannot listen on HTTP {host}:{port}: {exc.strerror or exc} (set --host/--http-port)"


async def serve(settings: GatewaySettings) -> int:
    """Run until SIGINT or SIGTERM, then drain and stop. Returns the exit code: 0 after a clean
    drain, 1 when the start failed (one line on stderr) or the grace period ran out."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    gw = Gateway(settings)
    try:
        await gw.start()
    except Exception as exc:
        return _start_failed(exc, settings)
    try:
        if await until_loaded(gw.wait_models(), stop, gw.service.registry):
            grpc = gw.grpc.port if gw.grpc is not None else None
            where = endpoints(gw.settings, gw.http_port, gw.broker_address, grpc)
            announcing = asyncio.create_task(
                announce_ready(
                    gw.readiness, lambda: ready_line(where, serving(gw.service.registry))
                ),
                name="ready",
            )
            await stop.wait()
            announcing.cancel()
        grace = settings.serving.shutdown_grace_s
        log.info("shutting down: draining requests for up to %.0f s", grace)
        clean = await gw.drain(grace)
    finally:
        await gw.close()
    log.info("stopped%s", "" if clean else " (the grace period ran out)")
    code = 0 if clean else 1
    if gw.service.stuck_calls:
        # The interpreter joins every executor thread at exit, the stuck ones too, and would
        # never exit: everything is closed by now, so leave without that join.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _start_failed(exc: Exception, settings: GatewaySettings) -> int:
    debug = settings.log_level == "DEBUG"
    if debug:
        log.error("start failed", exc_info=exc)
    reason = str(exc) if isinstance(exc, StartupError) else f"{type(exc).__name__}: {exc}"
    print(f"iotgw serve: {reason}", file=sys.stderr)
    return 1
