"""Everything an ingest process does not serve itself (metadata, health, admin, metrics, the
dashboard) is passed to the serving process's loopback listener as it came, headers and token
included, so there is one implementation of each and one place that knows the models' state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from multidict import CIMultiDict

from gateway.ingest.remote import ServingGone

# Per RFC 9110 7.6.1 these describe one connection, not the message: never forwarded.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)
_TIMEOUT = ClientTimeout(total=60, connect=5)
# Connections to the serving process per ingest process: admin and metadata calls are rare.
_CONNECTIONS = 16

PROXY_SESSION_KEY = web.AppKey("proxy_session", ClientSession)
PROXY_BASE_KEY = web.AppKey("proxy_base", str)


def install(app: web.Application, base_url: str) -> None:
    """Route every request no other route takes to ``base_url`` (``http://127.0.0.1:port``)."""
    app[PROXY_BASE_KEY] = base_url.rstrip("/")
    app.router.add_route("*", "/{tail:.*}", forward)

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        session = ClientSession(
            connector=TCPConnector(limit=_CONNECTIONS),
            timeout=_TIMEOUT,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
        )
        app[PROXY_SESSION_KEY] = session
        yield
        await session.close()

    app.cleanup_ctx.append(session_ctx)


def _forwardable(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in _HOP_BY_HOP:
            out.add(name, value)
    return out


async def forward(request: web.Request) -> web.StreamResponse:
    session = request.app[PROXY_SESSION_KEY]
    body = await request.read()  # bounded by client_max_size, as every body here
    url = request.app[PROXY_BASE_KEY] + request.rel_url.raw_path_qs
    try:
        async with session.request(
            request.method,
            url,
            headers=_forwardable(request.headers),
            data=body if body else None,
            allow_redirects=False,
        ) as upstream:
            payload = await upstream.read()
            return web.Response(
                status=upstream.status,
                reason=upstream.reason,
                headers=_forwardable(upstream.headers),
                body=payload,
            )
    except (ClientError, TimeoutError) as exc:
        raise ServingGone(
            f"the serving process did not answer ({type(exc).__name__}); retry", retry_after=1
        ) from None
