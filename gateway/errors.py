"""One error root for serving. Each error carries a status (HTTP semantics, also sent in MQTT
error replies) and a message that names the problem; transports pick their wire form at the edge.
"""

from __future__ import annotations


class GatewayError(Exception):
    status: int = 500
    reason: str = "internal"

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        # The refused request's id when it could be read: MQTT 3.1.1 devices match replies by it.
        self.request_id: str | None = None


class BadRequest(GatewayError):
    """The request is malformed or does not match the model (names, dtypes, shapes, values)."""

    status = 400
    reason = "bad_request"


class Unauthorized(GatewayError):
    status = 401
    reason = "unauthorized"


class Forbidden(GatewayError):
    """The caller is known but may not do this (e.g. name another device's reply topic)."""

    status = 403
    reason = "forbidden"


class NotFound(GatewayError):
    """Unknown model, version or route."""

    status = 404
    reason = "not_found"


class DuplicateRequestId(GatewayError):
    """Another request of the same device used this id (or Correlation Data) recently."""

    status = 409
    reason = "duplicate_id"


class PayloadTooLarge(GatewayError):
    status = 413
    reason = "payload_too_large"


class Overloaded(GatewayError):
    """The model's queue is full; the client should retry after ``retry_after`` seconds."""

    status = 503
    reason = "queue_full"


class DeadlineUnmeetable(GatewayError):
    """The request cannot be answered before its deadline; refused rather than served late."""

    status = 503
    reason = "deadline"


class InsufficientMemory(GatewayError):
    """Taking the request now would exceed a memory bound; the client should retry later."""

    status = 503
    reason = "memory"


class MemoryBudgetExceeded(GatewayError):
    """The bytes of requests already queued or running fill the gateway's budget
    (``serving.max_queued_bytes``); the client should retry after ``retry_after`` seconds."""

    status = 503
    reason = "memory"


class ModelUnavailable(GatewayError):
    """The model exists but is not ready (loading, failed to load, or shutting down)."""

    status = 503
    reason = "unavailable"


class Undeliverable(GatewayError):
    """The request's reply could not be delivered where it asked (the broker refused it)."""

    status = 502
    reason = "undeliverable"


class InternalError(GatewayError):
    status = 500
    reason = "internal"


class BatchTimeout(GatewayError):
    """The backend did not finish the request's batch within the watchdog limit
    (``serving.batch_watchdog_s``); the stuck runtime instance was taken out of service."""

    status = 504
    reason = "batch_timeout"
