"""A ``GatewayError`` as a gRPC status: the code, the message, and trailing metadata that says
why (``iotgw-reason``, the reason HTTP and MQTT replies carry) and when to come back
(``retry-after-ms``, and ``grpc-retry-pushback-ms`` for gRPC's own retry policies)."""

from __future__ import annotations

import grpc

from gateway.errors import (
    BadRequest,
    BatchTimeout,
    DeadlineUnmeetable,
    DuplicateRequestId,
    Forbidden,
    GatewayError,
    InsufficientMemory,
    InternalError,
    MemoryBudgetExceeded,
    ModelUnavailable,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    Unauthorized,
    Undeliverable,
)


class DeadlinePassed(GatewayError):
    """The call's gRPC deadline passed before the gateway could start on it."""

    status = 504
    reason = "deadline_exceeded"


# Most specific first: the byte budget and a memory bound are 503s over HTTP but
# RESOURCE_EXHAUSTED here, the code gRPC names for "a resource ran out; slow down".
_CODES: tuple[tuple[type[GatewayError], grpc.StatusCode], ...] = (
    (BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (Unauthorized, grpc.StatusCode.UNAUTHENTICATED),
    (Forbidden, grpc.StatusCode.PERMISSION_DENIED),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (DuplicateRequestId, grpc.StatusCode.ALREADY_EXISTS),
    (PayloadTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (MemoryBudgetExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InsufficientMemory, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Overloaded, grpc.StatusCode.UNAVAILABLE),
    (DeadlineUnmeetable, grpc.StatusCode.UNAVAILABLE),
    (ModelUnavailable, grpc.StatusCode.UNAVAILABLE),
    (Undeliverable, grpc.StatusCode.UNAVAILABLE),
    (BatchTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
    (DeadlinePassed, grpc.StatusCode.DEADLINE_EXCEEDED),
    (InternalError, grpc.StatusCode.INTERNAL),
)
_BY_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code(err: GatewayError) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(err, cls):
            return code
    return _BY_STATUS.get(err.status, grpc.StatusCode.INTERNAL)


def trailers(err: GatewayError) -> tuple[tuple[str, str], ...]:
    out: tuple[tuple[str, str], ...] = (("iotgw-reason", err.reason),)
    if err.retry_after is not None:
        ms = str(max(1, round(err.retry_after * 1000)))
        out += (("retry-after-ms", ms), ("grpc-retry-pushback-ms", ms))
    return out
