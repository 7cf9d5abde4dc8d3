"""The serving process's side of the ingest processes: a Unix socket in a private directory,
one connection per ingest process. Each request that arrives on it runs through the service
exactly as one from the in-process transports would (same queues, limits and metrics); its
reply or refusal goes back on the same connection. The hub also keeps every ingest process's
catalog current and adds the counters they report to the gateway's metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from typing import Any

from gateway.edge import as_gateway_error
from gateway.ingest import counts, frames
from gateway.service import InferenceService
from gateway.settings.schema import GatewaySettings
from gateway.types import InferenceRequest
from gateway.versions import Catalog

log = logging.getLogger("gateway.ingest")

# How often the catalog is compared with the service's models; a change reaches every ingest
# process within this time (until then they decide on the old one, and the service corrects).
_CATALOG_EVERY_S = 0.25


class _Link:
    """One ingest process's connection."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._out = frames.FrameWriter(writer)
        self.index: int | None = None
        self.pid: int | None = None
        self.live: dict[str, bool | None] = {}
        self.states: set[str] = set()  # the gauges it reported (``iotgw_ingest_mqtt``)
        self.tasks: set[asyncio.Task[None]] = set()
        self.count: Callable[[], None] = lambda: None  # counts its requests once it said hello

    def send(self, message: tuple[Any, ...]) -> None:
        self._out.send(message)


class IngestHub:
    """``start`` opens the socket; ``setup`` is what each ingest process receives on connect
    (the settings, and where to send what it does not serve itself)."""

    def __init__(self, service: InferenceService, settings: GatewaySettings) -> None:
        self._service = service
        self._settings = settings
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._catalog: Catalog | None = None
        self._watch: asyncio.Task[None] | None = None
        self._counters = counts.counters_by_name(service.metrics)
        self.setup: dict[str, Any] = {}

    @property
    def path(self) -> str:
        assert self._dir is not None, "start() first"
        return os.path.join(self._dir.name, "ingest.sock")

    async def start(self) -> None:
        # A directory only this user can enter: nobody else can reach the socket.
        self._dir = tempfile.TemporaryDirectory(prefix="iotgw-ingest-")
        os.chmod(self._dir.name, 0o700)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)
        self._watch = asyncio.create_task(self._watch_catalog(), name="ingest-catalog")

    def live(self) -> dict[int, dict[str, bool | None]]:
        """What each connected ingest process reported: {index: {"http": .., "mqtt": ..}}."""
        return {link.index: dict(link.live) for link in self._links if link.index is not None}

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            for task in link.tasks:
                task.cancel()
            link.writer.close()
        if self._server is not None:
            await self._server.wait_closed()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self._links.add(link)
        try:
            await self._converse(link, reader)
        except (frames.FrameError, ConnectionError) as exc:
            log.warning("ingest process %s: connection dropped: %s", link.index, exc)
        finally:
            self._links.discard(link)
            self._forget_state(link)
            for task in link.tasks:
                task.cancel()
            writer.close()

    async def _converse(self, link: _Link, reader: asyncio.StreamReader) -> None:
        link.send((frames.CATALOG, self._current_catalog(), self.setup))
        while (message := await frames.read(reader)) is not None:
            kind = message[0]
            if kind == frames.INFER:
                _, seq, request, transport = message
                link.count()
                task = asyncio.create_task(self._infer(link, seq, request, transport))
                link.tasks.add(task)
                task.add_done_callback(link.tasks.discard)
            elif kind == frames.COUNTS:
                self._add_counts(message[1])
            elif kind == frames.LIVE:
                link.live = dict(message[1])
            elif kind == frames.STATE:
                self._set_state(link, message[1])
            elif kind == frames.HELLO:
                link.index, link.pid = message[1], message[2]
                link.count = self._service.metrics.ingest_requests.labels(str(link.index)).inc
            else:
                raise frames.FrameError(f"unknown message kind {kind!r}")
            if link.writer.transport.get_write_buffer_size() > 1 << 20:
                await link.writer.drain()  # replies pile up: let the socket take them first

    async def _infer(
        self, link: _Link, seq: int, request: InferenceRequest, transport: str
    ) -> None:
        try:
            response = await self._service.infer(request, transport=transport)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # mapped as the in-process edge maps it; counted there
            err = as_gateway_error(exc, phase="infer", model=request.model)
            link.send((frames.ERROR, seq, type(err).__name__, err.message, err.retry_after))
            return
        link.send((frames.REPLY, seq, response))

    def _current_catalog(self) -> Catalog:
        self._catalog = self._service.registry.catalog()
        return self._catalog

    async def _watch_catalog(self) -> None:
        while True:
            await asyncio.sleep(_CATALOG_EVERY_S)
            before = self._catalog
            if self._current_catalog() != before:
                for link in list(self._links):
                    link.send((frames.CATALOG, self._catalog, self.setup))

    def _set_state(self, link: _Link, state: dict[str, float]) -> None:
        gauge = self._service.metrics.ingest_mqtt
        for name, value in state.items():
            gauge.labels(str(link.index), name).set(value)
            link.states.add(name)

    def _forget_state(self, link: _Link) -> None:
        """A process gone: its figures are no longer anyone's (its replacement reports anew)."""
        for name in link.states:
            with contextlib.suppress(KeyError):
                self._service.metrics.ingest_mqtt.remove(str(link.index), name)
        link.states.clear()

    def _add_counts(self, increments: counts.Counts) -> None:
        counts.add(self._counters, increments)
