"""A served model in virtual time, for deciding the online agent's rules: the agent runs its own
loop (``ModelAgent.run``) against a ``ScriptedGateway`` on a ``VirtualClock``, so every window
it measures follows from the scripted service times and arrivals, and a minute of load takes a
fraction of a second and reads the same on any machine.

``ScriptedGateway`` is a ``ModelControl``: FIFO batching over ``concurrency`` instances (a free
instance takes what is queued up to the max batch at once, or waits out the batch timeout for a
full one; a full queue, ``max_queue``, refuses at once), one row per request, each batch taking
``service_s(knobs, rows)``, each request decoded first by one serial event loop
(``FRONT_END_S``); arrivals are a closed loop of N clients that send again when answered (or
refused), or seeded Poisson at a rate that may follow the clock. A knob change applies from
the next batch (instances added free, removed once idle). It answers ``stats`` and
``service_samples`` as the gateway does, from what it simulated.

Its batching is simpler than the gateway's on purpose (no early dispatch when no other request is
expected, no refusal for a deadline): the tests here script the agent's world to decide the
agent's rules, and nothing outside them trusts its figures. What the agent and the benches do
trust, the replay and the closed-loop simulation, runs the batcher's rule and is held to the
batcher by ``tests/conformance``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import math
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from models.knobs import Knobs
from models.window_stats import WindowStats
from rrl.agent.control import ModelControl
from rrl.agent.model_agent import ModelAgent

FRONT_END_S = 50e-6
"""The event loop's work per request (decoding), one request at a time."""

ServiceTime = Callable[[Knobs, int], float]
"""Seconds one batch of ``rows`` takes on one instance under ``knobs``."""


class VirtualClock:
    """A monotonic clock that moves only when the agent sleeps. A sleep that would pass
    ``pause_at`` stops there until ``resume``: ``run_agent``'s actions run at their exact time
    on the clock, whatever the real time the agent's decisions take (an action polled for in
    real time once ran at 54.9 s on a quiet machine and at a later clock on a busy one)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.pause_at = math.inf
        self.paused = asyncio.Event()
        self._resume = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        target = self.now + max(seconds, 0.0)
        while target >= self.pause_at:
            self.now = max(self.now, self.pause_at)
            self.paused.set()
            await self._resume.wait()
        self.now = target
        await asyncio.sleep(0)

    def resume(self, pause_at: float = math.inf) -> None:
        """Let a paused sleep go on, to stop again at ``pause_at``."""
        self.pause_at = pause_at
        self.paused.clear()
        resume, self._resume = self._resume, asyncio.Event()
        resume.set()


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    clients: int


@dataclass(frozen=True, slots=True)
class OpenLoop:
    rate_per_s: Callable[[float], float]
    """Requests per second at a time since the start."""
    seed: int = 0


@dataclass(slots=True)
class _Request:
    arrived: float
    queued: float = math.nan
    started: float = math.nan
    finished: float = math.nan


class ScriptedGateway(ModelControl):
    def __init__(
        self,
        clock: VirtualClock,
        knobs: Knobs,
        service_s: ServiceTime,
        load: ClosedLoop | OpenLoop,
        *,
        slo_ms: float = 100.0,
        max_queue: int = 512,
        jitter: float = 0.0,
    ) -> None:
        self.clock, self._knobs, self.service_s, self.load = clock, knobs, service_s, load
        self.slo_ms, self.max_queue = slo_ms, max_queue
        self.jitter = jitter
        """Each batch's time is its scripted time times a seeded log-normal factor of this
        spread (0: exactly the scripted time): a closed loop on exact times can lock into one
        pattern of batches for good, which measured service times never hold."""
        self._jitter_rng = np.random.default_rng(12345)
        self.refused: list[float] = []  # when a full queue refused a request
        self.slowdown = 1.0
        """Every batch takes this many times its scripted time (other work on the cores)."""
        self.start = self._now = clock.now
        self.knob_changes: list[tuple[float, Knobs]] = [(clock.now, knobs)]
        self._free = [clock.now] * knobs.concurrency  # when each instance is next free
        self._queue: deque[_Request] = deque()
        self._entering: deque[tuple[float, _Request]] = deque()  # (queued at, request)
        self._running: list[tuple[float, int, list[_Request]]] = []  # (finish, seq, batch)
        self._seq = 0
        self._arrivals: list[float] = []  # closed loop: the clients' next sends (a heap)
        self._rng = np.random.default_rng(load.seed if isinstance(load, OpenLoop) else 0)
        self._next_open = math.inf
        self._loop_free = clock.now  # the event loop decodes one request at a time
        self.requests: list[_Request] = []  # by arrival
        self._longest_s = 0.0  # the longest any request has taken to be answered or refused
        self._batches: dict[tuple[int, int], dict[int, deque[float]]] = {}
        if isinstance(load, ClosedLoop):
            self._arrivals = [clock.now] * load.clients
        else:
            self._next_open = clock.now + self._gap(clock.now)

    # -- the control protocol ------------------------------------------------------------------

    def knobs(self, model: str, version: int | str | None = None) -> Knobs:
        return self._knobs

    async def set_knobs(self, model: str, version: int | str | None, knobs: Knobs) -> Knobs:
        self._advance(self.clock.now)
        now = self.clock.now
        free = sorted(self._free)
        if knobs.concurrency >= len(free):
            free += [now] * (knobs.concurrency - len(free))
        else:  # the instances that free up first go on; the others finish and close
            free = free[: knobs.concurrency]
        self._free, self._knobs = free, knobs
        self.knob_changes.append((now, knobs))
        return knobs

    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStats:
        now = self.clock.now
        self._advance(now)
        since = now - window_s
        done = [
            r for r in self._recent(since) if since < r.finished <= now and r.queued == r.queued
        ]  # answered (a refused request was never queued: its ``queued`` is NaN)
        refused = len(self.refused) - bisect.bisect_right(self.refused, since)
        ms = np.array([1000.0 * (r.finished - r.arrived) for r in done]) if done else None
        arrived = len(self.requests) - bisect.bisect_right(
            self.requests, since, key=lambda r: r.arrived
        )
        running = sum(len(batch) for _, _, batch in self._running)
        in_system = len(self._entering) + len(self._queue) + running
        span = max(window_s, 1e-9)

        def pct(q: float) -> float:
            return 0.0 if ms is None else float(np.percentile(ms, q))

        return WindowStats(
            window_s=window_s,
            completed=len(done),
            rate_per_s=len(done) / span,
            rows_per_request=1.0,
            p50_ms=pct(50),
            p95_ms=pct(95),
            p99_ms=pct(99),
            slo_violations=0 if ms is None else int((ms > self.slo_ms).sum()),
            rejected=refused,
            queue_depth=len(self._queue),
            arrived=arrived,
            arrived_rows=arrived,
            in_system=in_system,
            in_system_peak=self._peak_inside(since, now),
        )

    def _peak_inside(self, since: float, now: float) -> int:
        """The most requests inside (arrived, not yet answered or refused) at once in
        (since, now], as the gateway counts it at each arrival."""
        inside, events = 0, []
        for r in self._recent(since):
            if r.arrived > now:
                break
            done = r.finished <= now  # False while unanswered (NaN)
            if r.arrived <= since:
                inside += not (r.finished <= since)
            else:
                events.append((r.arrived, 1))
            if since < r.finished and done:
                events.append((r.finished, -1))
        peak = inside
        for _, step in sorted(events):  # at one instant, answers (-1) before arrivals (+1)
            inside += step
            peak = max(peak, inside)
        return peak

    def service_samples(
        self, model: str, version: int | str | None = None
    ) -> Mapping[int, Sequence[float]]:
        k = self._knobs
        return {
            b: list(t)
            for b, t in self._batches.get((k.concurrency, k.intra_op_threads), {}).items()
        }

    def front_end_s(self, per_batch_s: float = 0.0) -> float | None:
        return FRONT_END_S

    # -- what was served -----------------------------------------------------------------------

    def knobs_at(self, t: float) -> Knobs:
        """The knobs in effect at clock time ``t``."""
        at = bisect.bisect_right([c for c, _ in self.knob_changes], t) - 1
        return self.knob_changes[max(at, 0)][1]

    def answered(self, since: float, until: float) -> int:
        return sum(1 for r in self.requests if since < r.finished <= until and r.queued == r.queued)

    def served_for(self, seconds: float) -> int:
        """Requests answered over the next ``seconds`` with the knobs left as they are (a static
        configuration's figure, for comparison)."""
        begin = self.clock.now
        self._advance(begin + seconds)
        return self.answered(begin, begin + seconds)

    def p99_ms(self, since: float, until: float) -> float:
        """The 99th percentile latency of the requests answered in (since, until]."""
        done = [
            r.finished - r.arrived
            for r in self.requests
            if since < r.finished <= until and r.queued == r.queued
        ]
        return 1000.0 * float(np.percentile(done, 99))

    # -- the simulation ------------------------------------------------------------------------

    def _recent(self, since: float) -> list[_Request]:
        """The requests inside at ``since`` or arriving after it: every one that arrived after
        the earliest of ``since`` less the longest answer so far and the oldest arrival still
        inside now (a request inside at ``since`` is one of those; a 3,000/s load keeps
        hundreds of thousands of requests, and a window reads only its own)."""
        inside = [self._queue[0].arrived] if self._queue else []
        inside += [self._entering[0][1].arrived] if self._entering else []
        inside += [batch[0].arrived for _, _, batch in self._running]
        earliest = min([since - self._longest_s, *inside])
        first = bisect.bisect_left(self.requests, earliest, key=lambda r: r.arrived)
        return self.requests[first:]

    def _gap(self, t: float) -> float:
        assert isinstance(self.load, OpenLoop)
        rate = self.load.rate_per_s(t - self.start)
        return float(self._rng.exponential(1.0 / rate)) if rate > 0 else 1.0

    def _next_start(self) -> float:
        if not self._queue:
            return math.inf
        k = self._knobs
        # Not before the present: a batch that filled while its instance waited leaves then.
        start = max(min(self._free), self._queue[0].queued, self._now)
        if k.batch_timeout_ms > 0 and len(self._queue) < k.max_batch_size:
            start = max(start, self._queue[0].queued + k.batch_timeout_ms / 1000.0)
        return start

    def _advance(self, until: float) -> None:
        while True:
            arrival = min(self._arrivals[0] if self._arrivals else math.inf, self._next_open)
            finish = self._running[0][0] if self._running else math.inf
            enter = self._entering[0][0] if self._entering else math.inf
            start = self._next_start()
            t = min(arrival, finish, enter, start)
            if t > until:
                return
            self._now = t
            if enter == t:
                _, request = self._entering.popleft()
                if len(self._queue) >= self.max_queue:  # answered at once with a refusal
                    request.finished = t
                    self._longest_s = max(self._longest_s, t - request.arrived)
                    self.refused.append(t)
                    if isinstance(self.load, ClosedLoop):
                        heapq.heappush(self._arrivals, t)
                    continue
                request.queued = t
                self._queue.append(request)
            elif finish == t:
                _, _, batch = heapq.heappop(self._running)
                self._longest_s = max(self._longest_s, t - batch[0].arrived)  # FIFO: [0] oldest
                for r in batch:
                    r.finished = t
                    if isinstance(self.load, ClosedLoop):
                        heapq.heappush(self._arrivals, t)
            elif arrival == t:
                if self._arrivals and self._arrivals[0] == t:
                    heapq.heappop(self._arrivals)
                else:
                    self._next_open = t + self._gap(t)
                # Decoded by the one event loop, one request after another, before it queues:
                # what spreads a closed loop's clients over the instances.
                self._loop_free = max(self._loop_free, t) + FRONT_END_S
                request = _Request(t)
                self.requests.append(request)
                self._entering.append((self._loop_free, request))
            else:
                self._start_batch(t)

    def _start_batch(self, t: float) -> None:
        k = self._knobs
        rows = min(len(self._queue), k.max_batch_size)
        batch = [self._queue.popleft() for _ in range(rows)]
        seconds = self.service_s(k, rows) * self.slowdown
        if self.jitter > 0:
            seconds *= float(self._jitter_rng.lognormal(0.0, self.jitter))
        instance = self._free.index(min(self._free))
        self._free[instance] = t + seconds
        for r in batch:
            r.started = t
        self._seq += 1
        heapq.heappush(self._running, (t + seconds, self._seq, batch))
        bucket = 1 << (rows - 1).bit_length()
        times = self._batches.setdefault((k.concurrency, k.intra_op_threads), {})
        times.setdefault(bucket, deque(maxlen=15)).append(seconds)


Action = Callable[[], Awaitable[None]]


async def run_agent(
    agent: ModelAgent,
    clock: VirtualClock,
    seconds: float,
    at: Sequence[tuple[float, Action]] = (),
) -> None:
    """Run ``agent`` until the clock has moved ``seconds`` (its simulations in a thread of this
    process: they take no time on the clock), running each of ``at``'s actions (an operator's,
    say) when the clock reaches its seconds, the agent held still meanwhile (an action that
    fails fails the run here, not inside the agent, which would log it and go on)."""
    begin = clock.now
    end = begin + seconds
    pending = sorted(at, key=lambda a: a[0])

    def next_pause() -> float:
        return begin + pending[0][0] if pending else math.inf

    clock.resume(next_pause())
    task = asyncio.create_task(agent.run())
    try:
        while clock.now < end:
            if task.done():
                task.result()  # an agent that stopped says why
            if clock.paused.is_set():
                await pending.pop(0)[1]()
                clock.resume(next_pause())
            await asyncio.sleep(0.001)
    finally:
        clock.resume()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def model_pool() -> ThreadPoolExecutor:
    """The queueing model's simulations in a thread (deterministic: seeded traces)."""
    return ThreadPoolExecutor(max_workers=1)
