"""The gateway's serving path replayed with its event loop as one serial server and the cores
shared, event by event: a configuration's latencies predicted from arrival times and measured
costs, for every model of a gateway at once over a whole trace (the tuner bench,
``benchmarks.tuner.replay``). The online agent's prediction charges the same loop one batch at
a time (``rrl.offline.replay.simulate`` with ``serial``), at a quarter of the CPU.

Each lane is the gateway's batcher deciding with the batching rule's own objects
(``models.batching_rule``, as ``rrl.offline.batcher_sim`` does: eager or timed dispatch, early
dispatch when no other request is expected, refusal on arrival when even the fastest recent pace
cannot answer in time and at a batch's start when its 90th percentile pace would answer late),
one lane per model, all lanes on one loop; ``tests/conformance`` holds a lane with no loop costs
to the real ``Batcher``.

Why not ``rrl.offline.replay.simulate`` alone: it treats the gateway's per-request and per-batch
costs as delays that take no core and that each instance pays in parallel. The gateway pays them on
one event loop, one thread at most: four instances do not make four front ends. Charged in
parallel, those costs made many instances with small batches look best on sensor_mlp (about
10 us of inference against about 0.3 ms of loop work per request), and they measured twice the
expert default's p95. Here:

- the **loop** serves its work first come, first served: a request's decoding when it arrives
  (``INGRESS_SHARE`` of ``per_request_s``); a batch's forming and crossing when an instance
  takes it (``DISPATCH_SHARE`` of ``per_batch_s``), after which the batch runs on its instance;
  its fan-out (the rest of ``per_batch_s``) and each of its requests' replies (the rest of
  ``per_request_s``) when the batch returns. The instance is free again once the loop has taken
  its result (the batcher releases it before the fan-out). So while the loop lags, batches
  form late and carry more rows, as in the gateway;
- the **cores** are shared by the loop (one thread while it works), the instances' threads
  (``t`` per running batch) and other processes (``background``: the cores they use per
  ``WINDOW_S`` bin, a fluid load): a piece of work starts at the speed
  ``min(1, cores / demand)`` of that moment and keeps it.

The measured service times (c sessions of t threads calling at once) are turned into full-speed
times by undoing the oversubscription they were measured under (``c x t > cores``), so it is not
counted twice. Latency runs from the arrival to the end of the request's reply on the loop.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from models.batching_rule import (
    ArrivalEstimate,
    ServiceTimeEstimate,
    answered_by,
    completion_estimate,
)
from models.knobs import Knobs
from rrl.offline.replay import ServiceTimes

WINDOW_S = 0.25
"""The bins of the other processes' load."""
INGRESS_SHARE = 0.5
"""Of a request's loop cost, the part paid when it arrives (decoding); the rest is its reply."""
DISPATCH_SHARE = 0.5
"""Of a batch's loop cost, the part paid when it starts (forming, concatenation, the crossing
to the executor); the rest is its fan-out."""


class Traffic(Protocol):
    """One model's arrivals (seconds from the trace's start), its costs and its SLO."""

    @property
    def arrivals_s(self) -> np.ndarray: ...

    @property
    def times(self) -> ServiceTimes: ...

    @property
    def slo_s(self) -> float: ...


@dataclass
class _Machine:
    """The cores, the loop's queue and the threads running batches."""

    cores: int
    background: np.ndarray
    """Cores the other processes use, per ``WINDOW_S`` bin."""
    loop_free: float = 0.0
    loop_cpu_s: float = 0.0
    """The loop's work so far, CPU-seconds."""
    threads: int = 0
    running: list[tuple[float, int]] = field(default_factory=list)
    """(end, threads) of the batches running, a heap."""

    def _demand(self, t: float) -> float:
        while self.running and self.running[0][0] <= t:
            self.threads -= heapq.heappop(self.running)[1]
        others = self.background[min(int(t / WINDOW_S), self.background.size - 1)]
        return self.threads + float(others)

    def loop(self, t: float, cpu_s: float) -> tuple[float, float]:
        """Queue ``cpu_s`` of loop work at ``t``: (when it starts, its speed); the loop is
        then busy until ``loop_free``."""
        start = max(t, self.loop_free)
        speed = min(1.0, self.cores / (1.0 + self._demand(start)))
        self.loop_free = start + cpu_s / speed
        self.loop_cpu_s += cpu_s
        return start, speed

    def compute(self, t: float, seconds: float, threads: int) -> float:
        """A batch of ``seconds`` at full speed on ``threads`` from ``t``: when it ends."""
        loop_busy = 1.0 if self.loop_free > t else 0.0
        speed = min(1.0, self.cores / (self._demand(t) + threads + loop_busy))
        end = t + seconds / speed
        heapq.heappush(self.running, (end, threads))
        self.threads += threads
        return end


@dataclass
class _Lane:
    """One model's batcher: its queue (requests the loop has decoded), its idle instances, the
    batch it is collecting (the batcher's loop waits for one batch at a time) and the rule's
    estimates, fed as the events happen (``models.batching_rule``)."""

    stream: Traffic
    config: Knobs
    samples: dict[int, list[float]]
    rng: np.random.Generator
    idle: int = 0
    collecting: bool = False
    """An instance is held and the batch waits for rows (or its dispatch is queued)."""
    leaving: bool = False
    fill_deadline: float = np.inf
    running: int = 0
    batches: int = 0
    now: float = 0.0
    queue: deque[int] = field(default_factory=deque)
    done: list[float] = field(init=False)
    enqueued: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.idle = self.config.concurrency
        self.sizes = sorted(self.samples)
        self.done = [np.inf] * len(self.stream.arrivals_s)
        self.pace = ServiceTimeEstimate(clock=lambda: self.now)
        self.arrivals = ArrivalEstimate()

    def draw(self, rows: int) -> float:
        i = min(bisect.bisect_left(self.sizes, rows), len(self.sizes) - 1)
        drawn = self.samples[self.sizes[i]]
        return drawn[int(self.rng.random() * len(drawn))] * max(1.0, rows / self.sizes[i])

    def deadline(self, i: int) -> float:
        return float(self.stream.arrivals_s[i]) + self.stream.slo_s

    def admit(self, i: int, t: float) -> bool:
        """Request ``i`` reaches the batcher at ``t``: queued, or refused (False) as the
        batcher's admission refuses it."""
        self.now = t
        queued = len(self.queue)
        remaining = self.deadline(i) - t
        busy = self.running + self.collecting
        if remaining <= 0:
            return False
        estimate = completion_estimate(
            self.pace,
            t,
            queued_rows=queued,
            rows=1,
            max_batch_size=self.config.max_batch_size,
            batch_timeout_s=self.config.batch_timeout_ms / 1e3,
            busy=busy,
            instances=self.config.concurrency,
            answer_lag_s=0.0,
        )
        if estimate is not None and estimate > remaining:
            return False
        self.queue.append(i)
        self.enqueued[i] = t
        self.arrivals.arrived(t)
        return True

    def leaves(self, t: float) -> bool:
        """Whether the batch being collected leaves at ``t``: full, its timeout run out, or no
        other request expected in what is left of it (the batcher's ``_collect``)."""
        self.now = t
        wait = self.fill_deadline - t
        return (
            len(self.queue) >= self.config.max_batch_size
            or wait <= 0
            or self.arrivals.expected(wait, t) < 1.0
        )

    def take(self, t: float) -> tuple[list[int], int]:
        """(the requests of a batch formed at ``t``, how many were refused instead: past their
        deadline, or answered late at the batch's 90th percentile pace)."""
        self.now = t
        rows: list[int] = []
        refused = 0
        while self.queue and len(rows) < self.config.max_batch_size:
            i = self.queue.popleft()
            if t >= self.deadline(i):
                refused += 1  # refused: the gateway answers it at once, no service time
                self.arrivals.left(t)
            else:
                rows.append(i)
        finish = answered_by(self.pace, t, len(rows), self.running, 0.0)
        if rows and finish is not None:
            late = [i for i in rows if self.deadline(i) < finish]
            for _ in late:
                self.arrivals.left(t)
            refused += len(late)
            rows = [i for i in rows if self.deadline(i) >= finish]
        return rows, refused

    def finished(self, t: float, rows: int, seconds: float) -> None:
        """A batch of ``rows`` that ran ``seconds`` is answered at ``t``."""
        self.now = t
        self.pace.observe(rows, seconds)
        for _ in range(rows):
            self.arrivals.left(t)


def full_speed(times: ServiceTimes, setting: tuple[int, int], cores: int) -> dict[int, list[float]]:
    """The setting's samples with the oversubscription they were measured under undone."""
    c, t = setting
    factor = max(1.0, c * t / cores)
    return {b: [s / factor for s in v] for b, v in times.samples[setting].items()}


_ARRIVE, _COMPLETE, _ENQUEUE, _TRY, _TIMER, _DISPATCH = range(6)
"""Event kinds; at equal times a completion frees its instance before a dispatch is tried."""


@dataclass(frozen=True)
class Replayed:
    latencies: list[np.ndarray]
    """Per stream, each request's latency in seconds (``inf``: refused)."""
    batches: list[int]
    loop_cpu_s: float
    """The work the loop did, CPU-seconds, all streams together."""


def replay(
    streams: Sequence[Traffic],
    configs: Sequence[Knobs],
    cores: int,
    *,
    seed: int = 0,
    background: np.ndarray | None = None,
) -> Replayed:
    """``configs`` (one per stream) replayed jointly over the streams' arrivals; ``background``:
    the cores other processes use per ``WINDOW_S`` bin from the start (none by default)."""
    machine = _Machine(cores, background if background is not None else np.zeros(1))
    rng = np.random.default_rng(seed)
    lanes = [
        _Lane(s, cfg, full_speed(s.times, (cfg.concurrency, cfg.intra_op_threads), cores), rng)
        for s, cfg in zip(streams, configs, strict=True)
    ]
    run = _Events(machine, lanes)
    for k, s in enumerate(streams):
        for i, a in enumerate(s.arrivals_s):
            run.push(float(a), _ARRIVE, k, i)
    while run.events:
        run.step(*heapq.heappop(run.events))
    return Replayed(
        [np.asarray(lane.done) - lane.stream.arrivals_s for lane in lanes],
        [lane.batches for lane in lanes],
        machine.loop_cpu_s,
    )


@dataclass
class _Events:
    """The replay's events in time order, and what each does to the loop and its lane."""

    machine: _Machine
    lanes: list[_Lane]
    events: list[tuple[float, int, int, int, object]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)

    def push(self, t: float, kind: int, k: int, data: object = None) -> None:
        heapq.heappush(self.events, (t, kind, next(self.seq), k, data))

    def collect(self, k: int, t: float) -> None:
        """The lane's batcher waits for rows, or leaves now (the batcher's ``_collect``)."""
        lane = self.lanes[k]
        if lane.leaves(t):
            lane.leaving = True
            self.push(t, _DISPATCH, k)
        else:
            self.push(lane.fill_deadline, _TIMER, k, lane.fill_deadline)

    def step(self, t: float, kind: int, _: int, k: int, data: object) -> None:
        machine, lane = self.machine, self.lanes[k]
        times = lane.stream.times
        reply = (1.0 - INGRESS_SHARE) * times.per_request_s
        if kind == _ARRIVE:  # decoded on the loop, then it reaches the batcher
            machine.loop(t, INGRESS_SHARE * times.per_request_s)
            self.push(machine.loop_free, _ENQUEUE, k, data)
        elif kind == _ENQUEUE:
            assert isinstance(data, int)
            if not lane.admit(data, t):
                machine.loop(t, reply)  # refused: answered at once, no service time
            elif lane.collecting and not lane.leaving:
                self.collect(k, t)  # an arrival wakes the waiting batcher
            else:
                self.push(t, _TRY, k)
        elif kind == _TRY:
            if lane.idle and not lane.collecting and lane.queue:
                lane.idle -= 1
                lane.collecting = True
                timeout_s = lane.config.batch_timeout_ms / 1e3
                lane.fill_deadline = lane.enqueued[lane.queue[0]] + timeout_s
                self.collect(k, t)
        elif kind == _TIMER:
            if lane.collecting and not lane.leaving and data == lane.fill_deadline:
                lane.leaving = True
                self.push(t, _DISPATCH, k)
        elif kind == _DISPATCH:
            launched = _dispatch(machine, lane, t, reply)
            if launched is not None:
                self.push(launched[0], _COMPLETE, k, launched[1])
            self.push(machine.loop_free, _TRY, k)  # the batcher's loop goes round
        else:
            assert isinstance(data, tuple)
            rows, seconds = data
            _complete(machine, lane, t, rows)
            lane.finished(t, len(rows), seconds)
            lane.running -= 1
            lane.idle += 1
            # The batcher releases the instance before the fan-out: the next dispatch is
            # queued on the loop behind this completion.
            self.push(machine.loop_free, _TRY, k)


def _dispatch(
    machine: _Machine, lane: _Lane, t: float, reply: float
) -> tuple[float, tuple[list[int], float]] | None:
    """The batcher's loop takes a batch: what the loop has decoded by the time it runs this;
    its requests refused instead are answered at once. (When it ends, (its requests, its
    runtime seconds)), or None when no request was left to run."""
    times = lane.stream.times
    lane.collecting = lane.leaving = False
    start = max(t, machine.loop_free)
    rows, refused = lane.take(start)
    if not rows:  # every request it held was refused: the instance goes back
        machine.loop(t, refused * reply)
        lane.idle += 1
        return None
    machine.loop(t, DISPATCH_SHARE * times.per_batch_s + refused * reply)
    lane.batches += 1
    lane.running += 1
    begins = machine.loop_free
    end = machine.compute(begins, lane.draw(len(rows)), lane.config.intra_op_threads)
    return end, (rows, end - begins)


def _complete(machine: _Machine, lane: _Lane, t: float, rows: list[int]) -> None:
    """A batch returns: its fan-out, then each request's reply, on the loop."""
    times = lane.stream.times
    fan_out = (1.0 - DISPATCH_SHARE) * times.per_batch_s
    reply = (1.0 - INGRESS_SHARE) * times.per_request_s
    start, speed = machine.loop(t, fan_out + len(rows) * reply)
    at = start + fan_out / speed
    for i in rows:
        at += reply / speed
        lane.done[i] = at
