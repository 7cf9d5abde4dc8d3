"""The edge both transports share: what happens to a client's bytes before the service sees a
request, and how any failure becomes an error reply.

- The model (and version) is looked up before the body is decoded: an unknown model costs a
  dictionary lookup, not a JSON parse.
- Decoding applies the ``DecodeLimits`` (tensors, dimensions, elements, nesting); a body at or
  above ``offload_bytes`` is decoded on the executor, so a large payload does not stall the event
  loop and every other device's request with it.
- ``as_gateway_error`` maps *every* exception to a ``GatewayError``: client errors as they are,
  ``RecursionError`` as a malformed body, ``MemoryError`` as a retryable 503, anything else raised
  while decoding as a request that cannot be decoded (400), and bugs elsewhere as 500. Each
  refusal is counted in ``iotgw_error_replies_total`` by transport and reason; none logs a
  traceback except an internal error (a bug, logged once with its traceback).
- ``error_document`` is the one error envelope: ``status``, ``reason``, ``error`` (the message),
  and ``id`` / ``retry_after_s`` when known. HTTP sends ``{"error": ...}`` with the status as
  the HTTP code (the Open Inference Protocol's form); MQTT sends the whole envelope.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Literal, TypeVar

from gateway.codecs import oip, tfserving
from gateway.codecs.limits import DecodeLimits
from gateway.core import ServingCore
from gateway.errors import BadRequest, GatewayError, InsufficientMemory, InternalError
from gateway.metrics import GatewayMetrics
from gateway.types import InferenceRequest

log = logging.getLogger("gateway.edge")

Phase = Literal["decode", "infer"]
_T = TypeVar("_T")
# Bodies from this size on are decoded on the executor: parsing megabytes of JSON would stall
# the loop for tens of milliseconds. Smaller ones decode faster than a thread hop costs.
OFFLOAD_BYTES = 256 * 1024


def as_gateway_error(exc: BaseException, *, phase: Phase, model: str = "") -> GatewayError:
    """The error reply for ``exc``: never raises, whatever ``exc`` is."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, RecursionError):
        return BadRequest("malformed request: nested too deeply")
    if isinstance(exc, MemoryError):
        return InsufficientMemory(
            "not enough memory to take this request now; retry later", retry_after=1.0
        )
    what = f"model {model}: " if model else ""
    if phase == "decode":
        # The client's bytes reached a path the decoders do not guard: still the request's
        # fault, and named as such, but logged (without the payload) so the gap gets closed.
        log.warning("%srequest could not be decoded: %s: %s", what, type(exc).__name__, exc)
        return BadRequest(f"{what}request could not be decoded ({type(exc).__name__})")
    log.error("%sinternal error", what, exc_info=exc)
    return InternalError(f"{what}internal error; see the gateway log")


def error_document(err: GatewayError, request_id: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"status": err.status, "reason": err.reason, "error": err.message}
    request_id = request_id if request_id is not None else err.request_id
    if request_id is not None:
        doc["id"] = request_id
    if err.retry_after is not None:
        doc["retry_after_s"] = round(err.retry_after, 3)
    return doc


class Edge:
    """Decoding with limits and error mapping for one transport (``transport`` labels the
    metrics). Holds no state per request: the adapters own their requests' life."""

    def __init__(
        self,
        *,
        service: ServingCore,
        executor: Executor,
        limits: DecodeLimits,
        transport: str,
        offload_bytes: int = OFFLOAD_BYTES,
    ) -> None:
        self.service = service
        self.limits = limits
        self.transport = transport
        self._executor = executor
        self._offload_bytes = offload_bytes
        self._metrics: GatewayMetrics = service.metrics

    def for_transport(self, transport: str) -> Edge:
        return Edge(
            service=self.service,
            executor=self._executor,
            limits=self.limits,
            transport=transport,
            offload_bytes=self._offload_bytes,
        )

    def check_model(self, model: str, version: str | int | None = None) -> None:
        """Refuse an unknown or unavailable model (or version) before its body is decoded."""
        self.service.check_model(model, version)

    def refuse_before_decoding(self, body: bytes, *, model: str, version: str | None) -> None:
        """Refuse a request admission would refuse anyway before its body is decoded
        (``ServingCore.refuse_early``): only one that cannot name a budget of its own
        (``oip.may_name_budget``), whose deadline is therefore the model's SLO. MQTT does not
        ask: a request's expiry and its reply's correlation id are read from the decoded
        message."""
        self.service.refuse_early(
            model, version, transport=self.transport, unless=lambda: oip.may_name_budget(body)
        )

    async def decode_oip(
        self, body: bytes, *, model: str, version: str | None, header_length: int | None
    ) -> tuple[InferenceRequest, oip.OutputFormat]:
        self.check_model(model, version)
        return await self._run(
            len(body),
            lambda: oip.decode_request(
                body,
                model=model,
                version=int(version) if version else None,
                header_length=header_length,
                limits=self.limits,
            ),
            model,
        )

    async def decode_tfs(
        self, body: bytes, *, model: str, version: str | None
    ) -> tuple[InferenceRequest, bool]:
        metadata = self.service.metadata(model, version)
        return await self._run(
            len(body),
            lambda: tfserving.decode_predict(
                body,
                metadata,
                model=model,
                version=int(version) if version else None,
                limits=self.limits,
            ),
            model,
        )

    async def run_decode(self, size: int, decode: Callable[[], _T], *, model: str) -> _T:
        """``decode()`` for a message of ``size`` bytes that a transport has already parsed
        (gRPC's protobuf): on the executor from ``offload_bytes`` on, its failures mapped as
        ``decode_oip``'s are."""
        return await self._run(size, decode, model)

    def reject(self, exc: BaseException, *, phase: Phase, model: str = "") -> GatewayError:
        """Map ``exc`` and count the refusal by reason (bounded label values: reasons and
        transports, never a client-chosen name)."""
        err = as_gateway_error(exc, phase=phase, model=model)
        self._metrics.error_replies.labels(self.transport, err.reason).inc()
        log.debug("%s request refused (%s): %s", self.transport, err.reason, err.message)
        return err

    async def _run(self, size: int, decode: Callable[[], _T], model: str) -> _T:
        try:
            if size < self._offload_bytes:
                return decode()
            # Off the loop: a large body's parse would hold every other request up.
            return await asyncio.get_running_loop().run_in_executor(self._executor, decode)
        except GatewayError:
            raise
        except Exception as exc:
            raise as_gateway_error(exc, phase="decode", model=model) from None
