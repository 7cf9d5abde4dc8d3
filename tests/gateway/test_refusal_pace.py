"""The pace of refusals for load on one connection (``gateway.http.refusal_pace``), on a
controlled clock: what is held, for how long, and what is not."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gateway.http.refusal_pace import RefusalPace


class Connection:
    """Stands for a transport: any object a weak reference can hold."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def pace_on(clock: Clock, pace_s: float = 0.25) -> tuple[RefusalPace, list[None]]:
    held: list[None] = []
    pace = RefusalPace(pace_s, on_hold=lambda: held.append(None), clock=clock, sleep=clock.sleep)
    return pace, held


def test_a_refusal_again_within_the_pace_waits_out_the_rest_of_it() -> None:
    clock = Clock()
    pace, held = pace_on(clock)
    a = Connection()
    asyncio.run(pace.hold(a, retry_after=1.0))
    assert clock.slept == [] and not held  # the first: at once
    clock.now += 0.05
    asyncio.run(pace.hold(a, retry_after=1.0))
    assert clock.slept == [pytest.approx(0.2)] and len(held) == 1  # 0.25 s after the first
    clock.now += 0.3  # a client that waited: at once
    asyncio.run(pace.hold(a, retry_after=1.0))
    assert len(clock.slept) == 1 and len(held) == 1


def test_the_pace_counts_from_when_the_last_refusal_was_sent() -> None:
    clock = Clock()
    pace, _ = pace_on(clock)
    a = Connection()
    for _ in range(3):  # sent at once, then held to 100.25, then to 100.5
        asyncio.run(pace.hold(a, retry_after=1.0))
    assert clock.slept == [0.25, 0.25] and clock.now == 100.5


def test_connections_are_paced_apart_and_refusals_without_a_hint_never() -> None:
    clock = Clock()
    pace, held = pace_on(clock)
    a, b = Connection(), Connection()
    asyncio.run(pace.hold(a, retry_after=1.0))
    asyncio.run(pace.hold(b, retry_after=1.0))  # another connection's first
    asyncio.run(pace.hold(a, retry_after=None))  # e.g. a deadline already past
    asyncio.run(pace.hold(None, retry_after=1.0))  # no transport (the client left)
    assert clock.slept == [] and not held


def test_no_pace_holds_nothing_and_a_closed_connection_is_forgotten() -> None:
    clock = Clock()
    off, held = pace_on(clock, pace_s=0.0)
    a = Connection()
    for _ in range(3):
        asyncio.run(off.hold(a, retry_after=1.0))
    assert clock.slept == [] and not held
    pace, _ = pace_on(clock)
    asyncio.run(pace.hold(a, retry_after=1.0))
    assert len(pace._last) == 1
    del a
    gc.collect()
    assert len(pace._last) == 0
