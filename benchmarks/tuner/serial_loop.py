"""The gateway's serving path replayed with its event loop as one serial server and the cores
shared, event by event: a configuration's latencies predicted from arrival times and measured
costs, for every model of a gateway at once over a whole trace (the tuner bench,
``benchmarks.tuner.replay``). The online agent's prediction charges the same loop one batch at
a time (``rrl.offline.replay.simulate`` with ``serial``), at a quarter of the CPU.

The batcher is ``rrl.offline.replay``'s (eager or timed dispatch, early dispatch when no arrival is
expected, refusal of what waited out its SLO), one lane per model, all lanes on one loop.

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

from models.knobs import Knobs
from rrl.offline.replay import ServiceTimes, batch_start

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
    """One model's batcher: its queue (requests the loop has decoded), its idle instances and
    the one dispatch it may have pending (the batcher's loop waits for one batch at a time)."""

    stream: Traffic
    config: Knobs
    samples: dict[int, list[float]]
    rng: np.random.Generator
    ready: list[float]
    """When each request reaches the queue: an estimate (arrival + decoding) until the loop
    has decoded it, which the timed dispatch reads ahead."""
    idle: int = 0
    pending: bool = False
    batches: int = 0
    queue: deque[int] = field(default_factory=deque)
    done: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.idle = self.config.concurrency
        self.sizes = sorted(self.samples)
        self.done = [np.inf] * len(self.ready)

    def draw(self, rows: int) -> float:
        i = min(bisect.bisect_left(self.sizes, rows), len(self.sizes) - 1)
        drawn = self.samples[self.sizes[i]]
        return drawn[int(self.rng.random() * len(drawn))] * max(1.0, rows / self.sizes[i])

    def leave_at(self, t: float) -> float:
        """When an instance free at ``t`` leaves with the queue's head (``rrl.offline.replay``)."""
        cfg = self.config
        return batch_start(
            self.ready, self.queue[0], t, cfg.max_batch_size, cfg.batch_timeout_ms / 1e3
        )

    def take(self, t: float) -> tuple[list[int], int]:
        """(the requests of a batch formed at ``t``, how many were refused instead: they had
        waited past the SLO)."""
        arrivals, slo = self.stream.arrivals_s, self.stream.slo_s
        rows: list[int] = []
        refused = 0
        while self.queue and len(rows) < self.config.max_batch_size:
            i = self.queue.popleft()
            if t - arrivals[i] > slo:
                refused += 1  # refused: the gateway answers it at once, no service time
            else:
                rows.append(i)
        return rows, refused


def full_speed(times: ServiceTimes, setting: tuple[int, int], cores: int) -> dict[int, list[float]]:
    """The setting's samples with the oversubscription they were measured under undone."""
    c, t = setting
    factor = max(1.0, c * t / cores)
    return {b: [s / factor for s in v] for b, v in times.samples[setting].items()}


_ARRIVE, _COMPLETE, _TRY, _DISPATCH = range(4)
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
    lanes = []
    for s, cfg in zip(streams, configs, strict=True):
        samples = full_speed(s.times, (cfg.concurrency, cfg.intra_op_threads), cores)
        ready = (s.arrivals_s + INGRESS_SHARE * s.times.per_request_s).tolist()
        lanes.append(_Lane(s, cfg, samples, rng, ready))
    seq = itertools.count()
    events: list[tuple[float, int, int, int, object]] = [
        (float(a), _ARRIVE, next(seq), k, i)
        for k, s in enumerate(streams)
        for i, a in enumerate(s.arrivals_s)
    ]
    heapq.heapify(events)

    def try_dispatch(k: int, t: float) -> None:
        lane = lanes[k]
        if lane.idle and not lane.pending and lane.queue:
            lane.pending = True
            lane.idle -= 1
            heapq.heappush(events, (max(t, lane.leave_at(t)), _DISPATCH, next(seq), k, None))

    while events:
        t, kind, _, k, data = heapq.heappop(events)
        lane = lanes[k]
        times = lane.stream.times
        if kind == _ARRIVE:
            assert isinstance(data, int)
            machine.loop(t, INGRESS_SHARE * times.per_request_s)
            lane.ready[data] = machine.loop_free
            lane.queue.append(data)
            heapq.heappush(events, (machine.loop_free, _TRY, next(seq), k, None))
        elif kind == _TRY:
            try_dispatch(k, t)
        elif kind == _DISPATCH:
            _dispatch(machine, lane, t, events, seq, k)
        else:
            assert isinstance(data, list)
            _complete(machine, lane, t, data)
            lane.idle += 1
            # The batcher releases the instance before the fan-out: the next dispatch is
            # queued on the loop behind this completion.
            heapq.heappush(events, (machine.loop_free, _TRY, next(seq), k, None))
    return Replayed(
        [np.asarray(lane.done) - lane.stream.arrivals_s for lane in lanes],
        [lane.batches for lane in lanes],
        machine.loop_cpu_s,
    )


def _dispatch(
    machine: _Machine,
    lane: _Lane,
    t: float,
    events: list[tuple[float, int, int, int, object]],
    seq: itertools.count[int],
    k: int,
) -> None:
    """The batcher's loop takes a batch: what the loop has decoded by the time it runs this."""
    times = lane.stream.times
    lane.pending = False
    start = max(t, machine.loop_free)
    rows, refused = lane.take(start)
    reply = (1.0 - INGRESS_SHARE) * times.per_request_s
    if not rows:  # every request it held was refused: the instance goes back
        machine.loop(t, refused * reply)
        lane.idle += 1
        heapq.heappush(events, (machine.loop_free, _TRY, next(seq), k, None))
        return
    machine.loop(t, DISPATCH_SHARE * times.per_batch_s + refused * reply)
    lane.batches += 1
    threads = lane.config.intra_op_threads
    end = machine.compute(machine.loop_free, lane.draw(len(rows)), threads)
    heapq.heappush(events, (end, _COMPLETE, next(seq), k, rows))
    # The batcher's loop goes round: another idle instance may take what is still queued.
    heapq.heappush(events, (machine.loop_free, _TRY, next(seq), k, None))


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
