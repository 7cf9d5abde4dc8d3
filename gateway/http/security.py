"""HTTP security and bounds: bearer tokens per endpoint group, a cap on open connections, a
deadline for request bodies, and the TLS context.

aiohttp already bounds request heads (line, field and header counts) and closes idle keep-alive
connections (``keepalive_timeout``, armed from the moment a connection opens, so it also bounds
how long a first request head may take). What it lacks is written here as middlewares:

- tokens: ``/admin`` and ``/v2/repository/models/...`` (load, unload: admin token),
  ``/v2/models/...``, ``/v2/repository/index``, ``/v1/...`` (inference token) and ``/metrics``
  (metrics token); ``/v2`` and ``/v2/health/*`` stay open for probes. The route that matched
  decides, not the raw path, so no spelling of a path slips by.
- a connection cap: the connections accepted first are served; a request on one beyond
  ``max_connections`` gets 503 with ``Retry-After`` and the connection is closed. A reply says
  "overloaded, come back" where a reset would look like a network fault that a client retries at
  once, and would leave a client that had sent a POST unsure whether it ran.
- a body deadline: the body must arrive within ``read_timeout_s`` or the client gets 408 and the
  connection is closed (aiohttp waits for a body forever).

Every refusal is counted in ``iotgw_error_replies_total{transport="http", reason=...}``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import ssl
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from pydantic import SecretStr

from gateway.metrics import GatewayMetrics
from gateway.settings.schema import HttpSettings
from gateway.settings.security import tls_server_context

TRANSPORT = "http"
# Answered even on a connection beyond the cap: a liveness probe must not restart a gateway
# that is only busy, and the connection is accepted and closed either way.
_PROBES = frozenset({"/v2/health/live", "/v2/health/ready"})


@dataclass(frozen=True)
class _TokenGuard:
    name: str  # what the token is called in messages and reasons
    prefixes: tuple[str, ...]  # of route templates (aiohttp's canonical paths)
    token: SecretStr | None


def _guards(settings: HttpSettings) -> tuple[_TokenGuard, ...]:
    return (
        # Loading and unloading models are operator actions (the inference token does not do).
        _TokenGuard("admin", ("/admin/", "/v2/repository/models/"), settings.admin_token),
        _TokenGuard(
            "inference", ("/v2/models/", "/v2/repository/", "/v1/"), settings.inference_token
        ),
        _TokenGuard("metrics", ("/metrics",), settings.metrics_token),
    )


def _refusal(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps({"error": message}).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _bearer_matches(header: str, token: SecretStr) -> bool:
    scheme, _, credentials = header.partition(" ")
    expected = token.get_secret_value().encode()
    # compare_digest takes the same time wherever the first difference is.
    return scheme.lower() == "bearer" and hmac.compare_digest(credentials.encode(), expected)


def token_middleware(settings: HttpSettings, metrics: GatewayMetrics) -> Middleware:
    guards = tuple(g for g in _guards(settings) if g.token is not None)

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else ""
        for guard in guards:
            if not route.startswith(guard.prefixes):
                continue
            assert guard.token is not None
            header = request.headers.get("Authorization")
            if header is not None and _bearer_matches(header, guard.token):
                break
            metrics.error_replies.labels(TRANSPORT, f"unauthorized_{guard.name}").inc()
            needed = f"{guard.name} endpoints need 'Authorization: Bearer <{guard.name} token>'"
            challenge = f'Bearer realm="iotgw {guard.name}"'
            if header is not None:
                needed = f"wrong token: {needed}"
                challenge += ', error="invalid_token"'
            return _refusal(401, needed, {"WWW-Authenticate": challenge})
        return await handler(request)

    return check_token


class ConnectionLimiter:
    """Serves the ``limit`` connections accepted first (in accept order, as aiohttp's server
    lists them); a connection beyond them is served once enough of those before it closed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._server: web.Server | None = None
        # Admission is for life: positions only fall as older connections close. (Handlers
        # take no weak references; closed ones are dropped whenever a new one is judged.)
        self._admitted: set[web.RequestHandler] = set()

    def attach(self, server: web.Server) -> None:
        self._server = server

    def admits(self, connection: web.RequestHandler) -> bool:
        if self._server is None or connection in self._admitted:
            return True
        open_connections = self._server.connections  # a copy: paid once per connection
        self._admitted.intersection_update(open_connections)
        try:
            position = open_connections.index(connection)
        except ValueError:
            return True  # already gone: nothing left to protect
        if position < self.limit:
            self._admitted.add(connection)
            return True
        return False


def connection_limit_middleware(limiter: ConnectionLimiter, metrics: GatewayMetrics) -> Middleware:
    @web.middleware
    async def limit_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
        if limiter.admits(request.protocol):
            return await handler(request)
        if request.path in _PROBES:
            response = await handler(request)
        else:
            metrics.error_replies.labels(TRANSPORT, "connection_limit").inc()
            response = _refusal(
                503,
                f"too many connections: the gateway serves {limiter.limit} at once "
                "(http.max_connections); retry later, reusing one connection",
                {"Retry-After": "1"},
            )
        response.force_close()  # Connection: close, and this connection's slot is freed
        return response

    return limit_connections


def body_deadline_middleware(settings: HttpSettings, metrics: GatewayMetrics) -> Middleware:
    timeout = settings.read_timeout_s

    @web.middleware
    async def read_body_in_time(request: web.Request, handler: Handler) -> web.StreamResponse:
        declared = request.content_length
        if (
            request.body_exists
            and request.match_info.http_exception is None
            # A body declared too large is refused by the handler before a byte is read.
            and (declared is None or declared <= settings.max_body_bytes)
        ):
            try:
                async with asyncio.timeout(timeout):
                    await request.read()  # kept by aiohttp: the handler's read() returns it
            except TimeoutError:
                metrics.error_replies.labels(TRANSPORT, "read_timeout").inc()
                return await _close_with(
                    request,
                    _refusal(
                        408,
                        f"the request body did not arrive within {timeout:g} s "
                        "(http.read_timeout_s)",
                    ),
                )
        return await handler(request)

    return read_body_in_time


async def _close_with(request: web.Request, response: web.Response) -> web.Response:
    """Send ``response`` and close the connection at once: aiohttp would otherwise linger for
    the rest of a body that is not coming."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()  # the reply is flushed before the socket closes
    return response


CONNECTIONS_KEY = web.AppKey("connection_limiter", ConnectionLimiter)


def install(app: web.Application, settings: HttpSettings, metrics: GatewayMetrics) -> None:
    """Add the security middlewares to ``app`` (after any already there, so an error middleware
    installed first still wraps them)."""
    limiter = ConnectionLimiter(settings.max_connections)
    app[CONNECTIONS_KEY] = limiter
    app.middlewares.append(connection_limit_middleware(limiter, metrics))
    app.middlewares.append(token_middleware(settings, metrics))
    app.middlewares.append(body_deadline_middleware(settings, metrics))


class _GatewayRunner(web.AppRunner):
    async def setup(self) -> None:
        await super().setup()
        assert self.server is not None
        self.app[CONNECTIONS_KEY].attach(self.server)


def http_runner(app: web.Application, settings: HttpSettings, **options: Any) -> web.AppRunner:
    """An ``AppRunner`` for an app set up by ``install``: idle connections close after
    ``keepalive_timeout_s`` and the connection cap knows the server it counts."""
    return _GatewayRunner(app, keepalive_timeout=settings.keepalive_timeout_s, **options)


def server_ssl_context(settings: HttpSettings) -> ssl.SSLContext | None:
    """The HTTPS context, or None for plain HTTP (the settings checked that both files load)."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    return tls_server_context(settings.tls_cert_file, settings.tls_key_file)
