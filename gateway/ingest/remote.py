"""The ingest process's stand-in for the service: refuses unknown models from the catalog the
serving process keeps current, and sends every inference over the hub's socket. Only counters
are kept here; they travel to the serving process (``counts``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Callable
from typing import Any

from gateway import errors
from gateway.errors import GatewayError, InternalError, ModelUnavailable
from gateway.ingest import counts, frames
from gateway.metrics import GatewayMetrics
from gateway.types import InferenceRequest, InferenceResponse
from gateway.versions import Catalog
from models.runtime import ModelMetadata

log = logging.getLogger("gateway.ingest")

_COUNTS_EVERY_S = 1.0


class ServingGone(ModelUnavailable):
    """The serving process closed the connection (it stops or died): nothing can be answered."""


class RemoteService:
    """``ServingCore`` over the hub's socket. ``connect`` waits for the first catalog (and the
    setup the serving process sends with it); ``closed`` is set when the connection ends."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.metrics = GatewayMetrics()
        self.catalog = Catalog()
        self.setup: dict[str, Any] = {}
        self.closed = asyncio.Event()
        self._seq = itertools.count()
        self._pending: dict[int, asyncio.Future[InferenceResponse]] = {}
        self._writer: frames.FrameWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sent: counts.Counts = {}

    async def connect(self, path: str) -> None:
        reader, writer = await asyncio.open_unix_connection(path)
        self._writer = frames.FrameWriter(writer)
        self._send((frames.HELLO, self.index, os.getpid()))
        first = await frames.read(reader)
        if first is None or first[0] != frames.CATALOG:
            raise frames.FrameError("the serving process did not send its catalog")
        self._take_catalog(first)
        self._tasks = [
            asyncio.create_task(self._read(reader), name="ingest-read"),
            asyncio.create_task(self._report_counts(), name="ingest-counts"),
        ]

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def check_model(self, model: str, version: int | str | None = None) -> None:
        self.catalog.check_model(model, version)

    def metadata(self, model: str, version: int | str | None = None) -> ModelMetadata:
        return self.catalog.metadata(model, version)

    def refuse_early(
        self,
        model: str,
        version: int | str | None,
        *,
        transport: str,
        unless: Callable[[], bool],
    ) -> None:
        """Nothing: admission's queue and pace live in the serving process, which refuses (or
        admits) the request once it is sent over."""

    async def infer(self, request: InferenceRequest, *, transport: str) -> InferenceResponse:
        if self.closed.is_set():
            raise ServingGone("the gateway is restarting its serving process; retry", retry_after=1)
        seq = next(self._seq)
        future: asyncio.Future[InferenceResponse] = asyncio.get_running_loop().create_future()
        self._pending[seq] = future
        try:
            self._send((frames.INFER, seq, request, transport))
            return await future
        finally:
            self._pending.pop(seq, None)  # also when the client went away: the reply is dropped

    def report_live(self, **parts: bool | None) -> None:
        self._send((frames.LIVE, parts))

    def report_state(self, state: dict[str, float]) -> None:
        """This process's own gauges (its MQTT session's), for the serving process's /metrics."""
        self._send((frames.STATE, state))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._flush_counts()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.writer.wait_closed()
        self._fail_pending()

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._writer is not None:
            self._writer.send(message)

    def _take_catalog(self, message: tuple[Any, ...]) -> None:
        self.catalog, self.setup = message[1], message[2]

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while (message := await frames.read(reader)) is not None:
                kind = message[0]
                if kind == frames.REPLY:
                    self._resolve(message[1], result=message[2])
                elif kind == frames.ERROR:
                    _, seq, name, text, retry_after = message
                    self._resolve(seq, error=_rebuild(name, text, retry_after))
                elif kind == frames.CATALOG:
                    self._take_catalog(message)
        except (frames.FrameError, ConnectionError) as exc:
            log.warning("ingest %d: connection to the serving process lost: %s", self.index, exc)
        finally:
            self._fail_pending()
            self.closed.set()

    def _resolve(
        self, seq: int, *, result: InferenceResponse | None = None, error: Exception | None = None
    ) -> None:
        future = self._pending.get(seq)
        if future is None or future.done():
            return  # its client went away meanwhile
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def _fail_pending(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ServingGone("the serving process stopped", retry_after=1))
        self._pending.clear()

    async def _report_counts(self) -> None:
        while True:
            await asyncio.sleep(_COUNTS_EVERY_S)
            self._flush_counts()

    def _flush_counts(self) -> None:
        now = counts.totals(self.metrics)
        grown = counts.increments(now, self._sent)
        if grown:
            self._send((frames.COUNTS, grown))
        self._sent = now


def _rebuild(name: str, message: str, retry_after: float | None) -> GatewayError:
    """The serving process's refusal as the same error class (one of ``gateway.errors``)."""
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, GatewayError)):
        cls = InternalError
    return cls(message, retry_after=retry_after)
