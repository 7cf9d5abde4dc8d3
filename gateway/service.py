"""The transport-free inference service: a request's model looked up (``ModelRegistry``),
checked (``gateway.validation``), charged to the byte budget and handed to its batcher; and the
tuner's control of a served version's knobs.

The HTTP, gRPC and MQTT adapters call ``infer`` (with ``check_model`` and ``metadata``, the rest
of ``gateway.core.ServingCore``); the tuner calls the control methods (``knobs``, ``set_knobs``,
``stats``); what is served, and its loading and unloading, is ``registry``'s. Nothing here knows
about a wire format.

Process-wide bounds live here: the bytes of request tensors queued or running
(``serving.max_queued_bytes``) and the executor threads stuck runtime calls may hold (half of
``serving.executor_threads``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor

import numpy as np

from gateway.batching.watchdog import StuckCalls, WatchdogLimits
from gateway.errors import (
    GatewayError,
    MemoryBudgetExceeded,
    ModelUnavailable,
    PayloadTooLarge,
)
from gateway.metrics import GatewayMetrics
from gateway.model_host import ModelHost
from gateway.model_registry import ModelRegistry, RuntimeLoader
from gateway.settings.schema import ServingSettings
from gateway.types import InferenceRequest, InferenceResponse
from gateway.validation import validate_request
from models.knobs import Knobs
from models.runtime import BackendError, ModelMetadata
from models.window_stats import WindowStats


class ByteBudget:
    """Bytes of request tensors charged while they wait in a queue or run. Used from the event
    loop only, so a check and the charge that follows it cannot interleave."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.charged = 0

    def fits(self, nbytes: int) -> bool:
        return self.charged + nbytes <= self.limit

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Charge ``nbytes`` for the block; released exactly once however it ends."""
        self.charged += nbytes
        try:
            yield
        finally:
            self.charged -= nbytes


class InferenceService:
    def __init__(
        self,
        *,
        executor: Executor,
        metrics: GatewayMetrics,
        serving: ServingSettings | None = None,
        load_runtime: RuntimeLoader | None = None,
    ) -> None:
        serving = serving or ServingSettings()
        self.metrics = metrics
        # Python cannot stop a stuck thread: half the executor may be lost to stuck calls, the
        # other half stays for the batches of healthy instances, loads and rebuilds.
        self._stuck_calls = StuckCalls(limit=max(1, serving.executor_threads // 2))
        self.registry = ModelRegistry(
            executor=executor,
            metrics=metrics,
            serving=serving,
            watchdog=WatchdogLimits(
                limit_s=serving.batch_watchdog_s,
                max_stuck=serving.batch_watchdog_max_stuck,
                stuck_calls=self._stuck_calls,
            ),
            load_runtime=load_runtime,
        )
        self.byte_budget = ByteBudget(serving.max_queued_bytes)
        metrics.abandoned_calls.set_function(lambda: self._stuck_calls.held)
        metrics.queued_bytes.set_function(lambda: self.byte_budget.charged)

    @property
    def stuck_calls(self) -> int:
        """Executor threads held by runtime calls the watchdog gave up on. While any is held,
        shutting the executor down with ``wait=True`` would wait for a call that may never
        return."""
        return self._stuck_calls.held

    # -- what the transports ask before and while they infer -------------------------------

    def check_model(self, model: str, version: int | str | None = None) -> None:
        """Raise ``NotFound``/``ModelUnavailable`` for a model (or version) that cannot serve:
        the edge asks this before it decodes a body for it."""
        self.registry.host(model, version)

    def metadata(self, model: str, version: int | str | None = None) -> ModelMetadata:
        return self.registry.host(model, version).metadata

    def refuse_early(
        self,
        model: str,
        version: int | str | None,
        *,
        transport: str,
        unless: Callable[[], bool],
    ) -> None:
        """Refuse now, before its body is decoded, a request with the model's SLO as its budget
        if admission would refuse even one row of it (``ModelHost.refuse_early``); counted as
        ``infer`` counts a refusal."""
        host = self.registry.host(model, version)
        started = time.monotonic()
        try:
            host.refuse_early(unless)
        except GatewayError as exc:
            host.record_request(transport, exc.reason, time.monotonic() - started)
            raise

    # -- inference -------------------------------------------------------------------------

    async def infer(self, request: InferenceRequest, *, transport: str) -> InferenceResponse:
        started = time.monotonic()
        outcome = "error"
        host: ModelHost | None = None
        try:
            host = self.registry.host(request.model, request.version)
            metadata = host.metadata
            rows = validate_request(
                request, metadata, host.config.max_batch_size, host.config.allow_nonfinite
            )
            nbytes = tensor_bytes(request.inputs)
            self._check_byte_budget(host, nbytes)
            try:
                with self.byte_budget.hold(nbytes):
                    outputs, queue_s, compute_s = await host.infer(
                        request.inputs,
                        rows=rows,
                        timeout_s=request.timeout_s,
                        priority=request.priority,
                        delivery_s=request.delivery_s,
                    )
            except BackendError as exc:  # backend failure surfaced outside a batch
                raise ModelUnavailable(str(exc)) from exc
            if request.outputs is not None:
                outputs = {name: outputs[name] for name in request.outputs}
            outcome = "ok"
            return InferenceResponse(
                model=host.name,
                version=host.version,
                outputs=outputs,
                id=request.id,
                timings={"queue_s": queue_s, "compute_s": compute_s},
            )
        except Exception as exc:
            outcome = getattr(exc, "reason", "internal")
            raise
        finally:
            if host is not None:
                host.record_request(transport, outcome, time.monotonic() - started)
            elif outcome != "not_found":
                # Unknown model names are not counted: a label per name a client invents
                # would grow the metrics without bound.
                self.metrics.requests.labels(request.model, "", transport, outcome).inc()

    def _check_byte_budget(self, host: ModelHost, nbytes: int) -> None:
        budget = self.byte_budget
        if nbytes > budget.limit:
            host.record_rejection(PayloadTooLarge.reason)
            raise PayloadTooLarge(
                f"model {host.name}: the request's tensors take {nbytes} bytes, more than the "
                f"gateway's whole budget for queued requests ({budget.limit} bytes, "
                "serving.max_queued_bytes)"
            )
        if not budget.fits(nbytes):
            host.record_rejection(MemoryBudgetExceeded.reason)
            raise MemoryBudgetExceeded(
                f"model {host.name}: the gateway's budget for queued requests is full "
                f"({budget.charged} of {budget.limit} bytes in use, serving.max_queued_bytes; "
                f"this request needs {nbytes})",
                # The bytes free up as the queues drain: the slowest queue's drain time.
                retry_after=max((h.drain_time() for h in self.registry.hosts()), default=1.0),
            )

    # -- control (the tuner's surface) -----------------------------------------------------

    def knobs(self, model: str, version: int | str | None = None) -> Knobs:
        return self.registry.host(model, version).knobs

    async def set_knobs(self, model: str, version: int | str | None, knobs: Knobs) -> Knobs:
        """Set all five knobs of a ready version; returns once they are in effect."""
        return await self._ready_host(model, version).set_knobs(knobs)

    async def change_knobs(
        self, model: str, version: int | str | None, changes: Mapping[str, object]
    ) -> Knobs:
        """Change some knobs by wire name (the admin API's body); the others stay."""
        return await self._ready_host(model, version).change_knobs(changes)

    def _ready_host(self, model: str, version: int | str | None) -> ModelHost:
        host = self.registry.host(model, version)
        if not host.ready:
            raise ModelUnavailable(f"model {model} version {host.version} is not ready")
        return host

    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStats:
        return self.registry.host(model, version).stats(window_s)


def tensor_bytes(inputs: Mapping[str, np.ndarray]) -> int:
    """Bytes a request's tensors hold: ``nbytes`` of numeric ones, the element lengths of
    object (BYTES / string) ones, whose ``nbytes`` counts only pointers."""
    total = 0
    for arr in inputs.values():
        if arr.dtype.kind == "O":
            total += sum(
                len(e) if isinstance(e, bytes | bytearray | str) else arr.itemsize for e in arr.flat
            )
        else:
            total += arr.nbytes
    return total
