"""Virtual devices that POST Open Inference Protocol requests to ``/v2/models/{m}/infer``.

Each device has its own ``aiohttp.ClientSession`` (its own keep-alive connections), as separate
devices would; aiohttp sets TCP_NODELAY on its client sockets.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from device_sim.ledger import Outcome, Result
from device_sim.wire import HEADER_LENGTH, RequestBody


def _reason(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    reason = doc.get("reason") if isinstance(doc, dict) else None
    return reason if isinstance(reason, str) else None


class HttpDevice:
    """One device; use as an async context manager (it owns its session)."""

    def __init__(self, device_id: str, base_url: str) -> None:
        self.device_id = device_id
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpDevice:
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self, model: str, body: RequestBody, request_id: str, timeout_s: float
    ) -> Result:
        assert self._session is not None, "use HttpDevice as an async context manager"
        data, header_length = body.http(request_id)
        headers = {"Content-Type": "application/json"}
        if header_length is not None:
            headers = {
                "Content-Type": "application/octet-stream",
                HEADER_LENGTH: str(header_length),
            }
        url = f"{self.base_url}/v2/models/{model}/infer"
        sent = time.perf_counter()
        try:
            async with (
                asyncio.timeout(timeout_s),
                self._session.post(url, data=data, headers=headers) as resp,
            ):
                reply = await resp.read()
                received = time.perf_counter()
                status = resp.status
        except TimeoutError:
            return Result(Outcome.LOST, sent)
        except aiohttp.ClientError:
            return Result(Outcome.ERROR, sent, time.perf_counter(), 0, "transport")
        if status == 200:
            return Result(Outcome.OK, sent, received, 200)
        # The gateway's HTTP errors carry a message but not always a reason: the status names
        # the kind then.
        kind = _reason(reply) or f"http_{status}"
        return Result(Outcome.ERROR, sent, received, status, kind)
