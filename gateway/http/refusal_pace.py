"""Refusals for load paced per connection, so that clients who send again at once cannot turn
an overload into a storm of refusals that takes the cores from the batches.

A refusal for load (a full queue, a deadline the queue cannot meet, the byte budget) carries a
retry hint (``Retry-After``). A client that ignores it and sends again at once on the same
connection, and is refused again, gets that refusal no sooner than ``pace_s`` after its
previous one; its first refusal, and every refusal of a client that waits, is answered at once.
A held refusal costs a timer, not a core: the request was already refused.

Why: with vision_cnn under 128 connections of wrk (which sends again as soon as it is
answered), batch 32 eager on one instance of two threads could answer about 500 a second if
every client waited its turn; a few refusals for the deadline became 3,200 refusals a second,
their parsing and replies took the cores from the batches, and the gateway answered 190 a
second, round after round; ``iotgw bench find`` measured the same knobs at 184 and 298 a second
in one run, and batch 16 with 2 ms at 494 in one round and 196 in the next. Paced at 0.25 s, the
128 connections cannot ask for more than about 500 refusals a second, while a paced client
still returns within a default SLO (300 ms), when the queue that refused it has moved on.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.metrics import GatewayMetrics
from gateway.settings.schema import HttpSettings


class RefusalPace:
    """The last refusal for load sent on each open connection (weakly held: a closed
    connection is forgotten) and the pace between two on one connection; ``on_hold`` is
    called for each refusal held (a metric counts them)."""

    def __init__(
        self,
        pace_s: float,
        *,
        on_hold: Callable[[], object] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.pace_s, self._on_hold = pace_s, on_hold
        self._clock, self._sleep = clock, sleep
        self._last: weakref.WeakKeyDictionary[object, float] = weakref.WeakKeyDictionary()

    async def hold(self, connection: object | None, retry_after: float | None) -> None:
        """Wait, before a refusal is sent on ``connection``, until ``pace_s`` has passed since
        the last refusal for load sent on it; return at once for a refusal without a retry
        hint (retrying would not help: nothing to pace), an unknown connection, or no pace."""
        if retry_after is None or connection is None or self.pace_s <= 0:
            return
        last = self._last.get(connection)
        if last is not None and (wait := last + self.pace_s - self._clock()) > 0:
            self._on_hold()
            await self._sleep(wait)
        self._last[connection] = self._clock()


REFUSAL_PACE_KEY = web.AppKey("refusal_pace", RefusalPace)


def refusal_pace(settings: HttpSettings, metrics: GatewayMetrics) -> RefusalPace:
    """The pace an HTTP server's connections are held to (``HttpSettings.refusal_pace_s``)."""
    return RefusalPace(settings.refusal_pace_s, on_hold=metrics.refusals_paced.labels("http").inc)
