"""What the transports need from the serving side: refuse unknown models early (and, over HTTP,
requests admission would refuse anyway), describe a model's inputs, run an inference, count.
``InferenceService`` is it in one process; an ingest process talks to the serving process
through ``gateway.ingest.remote.RemoteService``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.metrics import GatewayMetrics
from gateway.types import InferenceRequest, InferenceResponse
from models.runtime import ModelMetadata


class ServingCore(Protocol):
    @property
    def metrics(self) -> GatewayMetrics: ...

    def check_model(self, model: str, version: int | str | None = None) -> None: ...

    def metadata(self, model: str, version: int | str | None = None) -> ModelMetadata: ...

    def refuse_early(
        self,
        model: str,
        version: int | str | None,
        *,
        transport: str,
        unless: Callable[[], bool],
    ) -> None:
        """Refuse, before its body is decoded, a request whose budget is the model's SLO, if
        admission would refuse even one row of it now and ``unless()`` is false (asked only
        then); return when it would be admitted."""

    async def infer(self, request: InferenceRequest, *, transport: str) -> InferenceResponse: ...
