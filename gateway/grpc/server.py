"""The gRPC server: grpcio's asyncio server on the gateway's event loop, with every service of
the package, the bounds of ``grpc.*`` settings, HTTP's tokens and TLS files, and a drain that
waits for the requests already taken.

- Bounds: a request message over ``max_message_bytes`` is refused by grpc with
  RESOURCE_EXHAUSTED before it is parsed; at most ``max_concurrent_rpcs`` calls run at once
  (grpc refuses the next with RESOURCE_EXHAUSTED), ``max_streams_per_connection`` per
  connection (HTTP/2's own limit, which holds a client back rather than failing it), and a
  ModelStreamInfer stream answers at most ``stream_max_in_flight`` requests at once.
- Tokens, in the ``authorization`` metadata as ``Bearer <token>``: the inference token for
  inference and model metadata (ServerLive, ServerReady and ServerMetadata stay open, like
  ``/v2`` and ``/v2/health/*``), the admin token for loading and unloading models; health and
  reflection stay open for probes and tools.
- SO_REUSEPORT is off: grpc turns it on by default on Linux, which would let a second gateway
  bind the same port silently and take half of its connections.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from concurrent.futures import Executor
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from pydantic import SecretStr

from gateway.edge import Edge
from gateway.grpc import messages, oip_service, tfs_service
from gateway.lifecycle import InFlight, Readiness, StartupError
from gateway.service import InferenceService
from gateway.settings.schema import GrpcSettings, HttpSettings

log = logging.getLogger("gateway.grpc")

SERVICES = (
    messages.OIP,
    messages.OIP_EXTENSIONS,
    messages.TFS_PREDICTION,
    messages.TFS_MODEL,
    messages.HEALTH,
    messages.REFLECTION,
)
_OPEN = frozenset({f"/{messages.OIP}/{m}" for m in ("ServerLive", "ServerReady", "ServerMetadata")})
_ADMIN = frozenset(
    f"/{service}/{m}"
    for service in (messages.OIP, messages.OIP_EXTENSIONS)
    for m in ("RepositoryModelLoad", "RepositoryModelUnload")
)
_INFERENCE_PREFIXES = tuple(
    f"/{s}/"
    for s in (messages.OIP, messages.OIP_EXTENSIONS, messages.TFS_PREDICTION, messages.TFS_MODEL)
)
# How often a Watch call looks at readiness: a probe learns of a drain within this.
_WATCH_POLL_S = 0.25


class Health(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: SERVING exactly when ``/v2/health/ready`` answers 200 (the same
    ``Readiness``), for the server ("") and each of its services; NOT_SERVING otherwise,
    draining included."""

    def __init__(self, readiness: Readiness) -> None:
        self._readiness = readiness

    def _status(self, service: str) -> int:
        if service and service not in SERVICES:
            return int(health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        if self._readiness.ready:
            return int(health_pb2.HealthCheckResponse.SERVING)
        return int(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def Check(self, request: Any, context: Any) -> Any:
        status = self._status(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> None:
        last: int | None = None
        while True:  # until the client cancels or the server stops
            status = self._status(request.service)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            await asyncio.sleep(_WATCH_POLL_S)


class TokenGuard(grpc.aio.ServerInterceptor):
    """Bearer tokens per group of calls (see the module's docstring); a refusal is counted in
    ``iotgw_error_replies_total{transport="grpc", reason="unauthorized_<group>"}``."""

    def __init__(self, http: HttpSettings, edge: Edge) -> None:
        self._admin = http.admin_token
        self._inference = http.inference_token
        self._edge = edge

    def _needed(self, method: str) -> tuple[str, SecretStr | None]:
        if method in _ADMIN:
            return "admin", self._admin
        if method in _OPEN or not method.startswith(_INFERENCE_PREFIXES):
            return "", None
        return "inference", self._inference

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        group, token = self._needed(details.method)
        if handler is None or token is None:
            return handler
        given = dict(details.invocation_metadata or ()).get("authorization")
        if isinstance(given, str) and _bearer_matches(given, token):
            return handler
        self._edge.service.metrics.error_replies.labels(
            oip_service.TRANSPORT, f"unauthorized_{group}"
        ).inc()
        needed = f"{group} calls need the metadata 'authorization: Bearer <{group} token>'"
        return _refusing(handler, f"wrong token: {needed}" if given else needed)


def _bearer_matches(header: str, token: SecretStr) -> bool:
    scheme, _, credentials = header.partition(" ")
    # compare_digest takes the same time wherever the first difference is.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        credentials.encode(), token.get_secret_value().encode()
    )


def _refusing(handler: Any, message: str) -> Any:
    """A handler of ``handler``'s kind that answers UNAUTHENTICATED and runs nothing."""

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class GrpcServer:
    """Built by ``gateway.main``: ``start`` listens (``port`` is then the bound one), ``drain``
    waits for the requests in flight, ``stop`` closes."""

    def __init__(
        self,
        *,
        settings: GrpcSettings,
        http: HttpSettings,
        service: InferenceService,
        edge: Edge,
        readiness: Readiness,
        executor: Executor,
    ) -> None:
        self.settings = settings
        self.host = http.host
        self.port = settings.port
        self.in_flight = InFlight()
        self._http = http
        self._metrics = service.metrics
        self._listening = False
        limit = settings.max_message_bytes
        guarded = http.admin_token is not None or http.inference_token is not None
        self._server = grpc.aio.server(
            # Only with a token to check: an interceptor costs every call a few µs.
            interceptors=[TokenGuard(http, edge)] if guarded else None,
            maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.max_concurrent_streams", settings.max_streams_per_connection),
                # Idle connections close as HTTP's keep-alive ones do (http.keepalive_timeout_s).
                ("grpc.max_connection_idle_ms", round(http.keepalive_timeout_s * 1000)),
            ],
        )
        oip = oip_service.InferenceServicer(
            service=service,
            edge=edge,
            readiness=readiness,
            executor=executor,
            stream_max_in_flight=settings.stream_max_in_flight,
            in_flight=self.in_flight,
        )
        self._oip = oip
        handlers = oip_service.method_handlers(oip)
        extensions = {m: h for m, h in handlers.items() if m not in oip_service.KSERVE_METHODS}
        generic = [
            grpc.method_handlers_generic_handler(messages.OIP, handlers),
            grpc.method_handlers_generic_handler(messages.OIP_EXTENSIONS, extensions),
        ]
        tfs = tfs_service.TfServingServicer(service=service, edge=edge, in_flight=self.in_flight)
        for name, methods in tfs_service.method_handlers(tfs).items():
            generic.append(grpc.method_handlers_generic_handler(name, methods))
        self._server.add_generic_rpc_handlers(generic)
        health_pb2_grpc.add_HealthServicer_to_server(Health(readiness), self._server)
        reflection.enable_server_reflection(SERVICES, self._server, pool=messages.POOL)

    @property
    def tls(self) -> bool:
        return self._http.tls_cert_file is not None

    async def start(self) -> None:
        host = f"[{self.host}]" if ":" in self.host else self.host
        address = f"{host}:{self.settings.port}"
        try:
            if self._http.tls_cert_file is not None and self._http.tls_key_file is not None:
                credentials = grpc.ssl_server_credentials(
                    [(self._http.tls_key_file.read_bytes(), self._http.tls_cert_file.read_bytes())]
                )
                self.port = self._server.add_secure_port(address, credentials)
            else:
                self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's only word for a port it cannot bind
            raise StartupError(
                f"cannot listen for gRPC on {address}: {exc} (in use? set --grpc-port, or "
                "--no-grpc)"
            ) from exc
        await self._server.start()
        self._listening = True
        self._metrics.watch_grpc(
            f"{host}:{self.port}",
            tls=self.tls,
            listening=lambda: self._listening,
            in_flight=lambda: self.in_flight.count,
            streams=lambda: self._oip.open_streams,
        )
        scheme = "grpcs" if self.tls else "grpc"
        log.info("gRPC listening on %s://%s:%d", scheme, self.host, self.port)

    async def drain(self, grace_s: float) -> bool:
        """True when every request taken finished within ``grace_s`` (new calls are still
        served meanwhile, as HTTP's are: health already says NOT_SERVING)."""
        done = await self.in_flight.wait_idle(grace_s)
        if not done:
            log.warning(
                "%d gRPC requests still running after the %.0f s grace period",
                self.in_flight.count,
                grace_s,
            )
        return done

    async def stop(self, grace_s: float) -> None:
        # Calls still open after ``grace_s`` (streams, health watches) are cancelled.
        self._listening = False  # grpc serves no new call from here on
        await self._server.stop(grace_s)
