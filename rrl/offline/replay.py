"""Trace replay: a configuration's latencies predicted by running arrival times through a model
of the gateway's batcher, fed with service times measured on this machine.

The model:

- **front end**: every request reaches the batcher ``per_request_s`` after it arrives (HTTP
  parsing, decoding, the reply), a delay the same under every configuration;
- **batcher**: the gateway's own rule on simulated time (``rrl.offline.batcher_sim`` with
  ``models.batching_rule``): a queue in arrival order and ``concurrency`` instances; a batch
  leaves when full, when the oldest request has waited the timeout, or when no other request is
  expected in what is left of that window; a request is refused on arrival when even the
  fastest recent pace cannot answer it in time, and when its batch starts when the batch's 90th
  percentile pace would answer it late, so it costs no service time. ``tests/conformance``
  holds it to the gateway's ``Batcher`` run on the same arrivals and batch times: the same
  batches, refusals and latencies;
- **service**: one batch of b rows takes a time drawn from those measured for the smallest
  measured batch size >= b, with ``concurrency`` instances of the same thread setting busy at
  once (so contention between instances is in the sample), plus ``per_batch_s`` of gateway
  overhead (the executor crossing, concatenation, fanning results out).

Latency is counted from the arrival to the end of the batch, as a device sees it minus the
network. The model ignores that the front end and the instances share the cores (its capacity is
calibrated instead, see ``ServiceTimes``); it is for ranking configurations, and a ranking is
checked by running the best ones for real.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from models.batching_rule import ArrivalEstimate
from models.knobs import Knobs
from rrl.offline.batcher_sim import BatcherSim, BatchTimes

ThreadSetting = tuple[int, int]  # (concurrency, intra-op threads)


@dataclass(frozen=True)
class ServiceTimes:
    """Seconds per batch, sampled per thread setting and batch size, plus gateway overheads."""

    samples: Mapping[ThreadSetting, Mapping[int, Sequence[float]]]
    per_batch_s: float = 0.0
    per_request_s: float = 0.0

    def settings(self) -> list[ThreadSetting]:
        return sorted(self.samples)

    def batch_sizes(self, setting: ThreadSetting) -> list[int]:
        return sorted(self.samples[setting])

    def sampler(self, setting: ThreadSetting, seed: int) -> _Sampler:
        return _Sampler(self.samples[setting], random.Random(seed))

    def median_s(self, setting: ThreadSetting, rows: int) -> float:
        sizes = self.batch_sizes(setting)
        size = sizes[min(bisect.bisect_left(sizes, rows), len(sizes) - 1)]
        return float(np.median(self.samples[setting][size]))

    def as_dict(self) -> dict[str, object]:
        return {
            "per_batch_ms": round(self.per_batch_s * 1e3, 4),
            "per_request_ms": round(self.per_request_s * 1e3, 4),
            "median_ms": {
                f"{c}x{t}": {
                    str(b): round(float(np.median(v)) * 1e3, 4) for b, v in sorted(by.items())
                }
                for (c, t), by in sorted(self.samples.items())
            },
        }


@dataclass
class _Sampler:
    by_size: Mapping[int, Sequence[float]]
    rng: random.Random
    sizes: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.sizes = sorted(self.by_size)

    def _size(self, rows: int) -> int:
        return self.sizes[min(bisect.bisect_left(self.sizes, rows), len(self.sizes) - 1)]

    def draw(self, rows: int) -> float:
        size = self._size(rows)
        seconds = self.rng.choice(self.by_size[size])
        # Rows beyond the largest measured batch: scale up linearly (an over-estimate).
        return seconds * max(1.0, rows / size)


def simulate(
    arrivals_s: Sequence[float],
    config: Knobs,
    times: ServiceTimes,
    *,
    slo_s: float,
    seed: int = 0,
    serial: bool = False,
) -> list[float]:
    """Each request's latency in seconds (``inf``: refused) under ``config``: the gateway's
    batcher run over the trace on simulated time (``rrl.offline.batcher_sim``, the batching
    rule's own decisions), each batch's time drawn from the measured samples.

    ``serial``: the gateway's costs are paid on its one event loop, one batch at a time, not
    as delays each instance pays in parallel: a batch forms only once the loop is free, and
    holds it for ``per_batch_s`` plus ``per_request_s`` per request (its decoding, forming,
    fan-out and replies, charged together when it forms) before its inference ends. So the
    loop caps the throughput at any concurrency, and a lagging loop forms larger batches. The
    agent's prediction (``rrl.agent.queueing``); ``benchmarks.tuner.serial_loop`` models the same
    loop event by event, with the cores shared, for the bench's offline replay."""
    sampler = times.sampler((config.concurrency, config.intra_op_threads), seed)
    batch_times = BatchTimes(sampler.draw, times.per_batch_s, times.per_request_s)
    return BatcherSim(config, batch_times, slo_s=slo_s, serial=serial).run(arrivals_s)


@dataclass(frozen=True)
class Figures:
    requests: int
    p50_ms: float | None
    p95_ms: float | None
    violations: int

    def objective(self, slo_ms: float, weight: float = 2.0) -> float:
        """``rrl.tuners.objective.LatencyObjective``'s form: p95 plus a penalty per violating
        share."""
        if self.requests == 0:
            return 0.0
        p95 = self.p95_ms if self.p95_ms is not None else slo_ms
        return p95 + weight * slo_ms * self.violations / self.requests


def figures(latencies_s: Sequence[float] | np.ndarray, slo_s: float) -> Figures:
    lat = np.asarray(latencies_s, dtype=np.float64)
    served = lat[np.isfinite(lat)]
    violations = int(np.count_nonzero(~np.isfinite(lat)) + np.count_nonzero(served > slo_s))
    if served.size == 0:
        return Figures(int(lat.size), None, None, violations)
    p50, p95 = np.percentile(served, [50, 95]) * 1e3
    return Figures(int(lat.size), round(float(p50), 3), round(float(p95), 3), violations)


@dataclass(frozen=True)
class Scored:
    """One configuration replayed over a trace: the whole trace and each phase."""

    config: Knobs
    overall: Figures
    phases: tuple[Figures, ...]


def score(
    configs: Iterable[Knobs],
    arrivals_s: Sequence[float],
    phase_of: Sequence[int],
    n_phases: int,
    times: ServiceTimes,
    *,
    slo_s: float,
    seed: int = 0,
) -> list[Scored]:
    """Every configuration replayed over the same arrivals, figures overall and per phase."""
    phase = np.asarray(phase_of)
    out = []
    for config in configs:
        lat = np.asarray(simulate(arrivals_s, config, times, slo_s=slo_s, seed=seed))
        per_phase = tuple(figures(lat[phase == k], slo_s) for k in range(n_phases))
        out.append(Scored(config, figures(lat, slo_s), per_phase))
    return out


def request_grid(
    settings: Iterable[ThreadSetting],
    batch_sizes: Sequence[int],
    timeouts_ms: Sequence[float],
) -> list[Knobs]:
    """The request-level grid under each thread setting (batch 1 never waits, so only with
    timeout 0)."""
    return [
        Knobs(b, t, c, intra, 1)
        for c, intra in settings
        for b in batch_sizes
        for t in timeouts_ms
        if b > 1 or t == 0
    ]


def closed_loop_throughput(
    population: int,
    config: Knobs,
    batch_s: Callable[[int], float | None],
    per_request_s: float,
    *,
    per_batch_s: float = 0.0,
    batches: int = 400,
) -> float | None:
    """Requests answered per second by a closed loop of ``population`` clients that send again
    the moment they are answered, under ``config`` (``batch_s(rows)``: one batch's service
    time; None when unknown). Each request is decoded by the one event loop, one after
    another, ``per_request_s`` each, before it queues; a free instance then leaves at once with
    what is queued (up to the max batch) under eager batching, or waits until the batch is full
    or the oldest queued request has waited the batch timeout.

    What the count of rows per instance cannot say, this does: answers come back a batch at a
    time and are decoded one by one, so under eager batching a free instance leaves with the
    first one or two and the others queue behind a busy one; a timeout that lets a batch fill
    spreads the loop over the instances. Deterministic (median service times); the rate over
    the last three quarters of ``batches`` batches, after the loop has settled."""
    if population < 1 or config.concurrency < 1:
        return None
    answered = _closed_loop_answers(
        population, config, batch_s, per_request_s, per_batch_s, batches
    )
    if answered is None:
        return None
    settled = answered[len(answered) // 4 :]
    span = settled[-1][0] - settled[0][0]
    return sum(rows for _, rows in settled[1:]) / span if span > 0 else None


def _closed_loop_answers(
    population: int,
    config: Knobs,
    batch_s: Callable[[int], float | None],
    per_request_s: float,
    per_batch_s: float,
    batches: int,
) -> list[tuple[float, int]] | None:
    """(done at, rows) of the closed loop's first ``batches`` batches, in the order they end;
    None when a batch time is unknown."""
    batch_time = functools.cache(batch_s)
    max_batch, timeout_s = config.max_batch_size, config.batch_timeout_ms / 1000.0
    # When each answered client's next request reaches the loop: answers come in time order,
    # so the line stays sorted.
    sending: deque[float] = deque([0.0] * population)
    loop_free = now = 0.0
    queued: deque[float] = deque()  # when each waiting request entered the queue
    free = [0.0] * config.concurrency  # when each instance is next free (a heap)
    running: list[tuple[float, int]] = []  # (done at, rows) of the batches in flight (a heap)
    answered: list[tuple[float, int]] = []
    # The batcher's own estimate of arrivals while it waits (``models.batching_rule``): a
    # loop whose clients are all inside sends nothing a wait could collect (a lone client).
    arrivals = ArrivalEstimate()
    watch = timeout_s > 0  # eager batching never asks it
    while len(answered) < batches:
        decoded = max(loop_free, sending[0]) + per_request_s if sending else math.inf
        finish = running[0][0] if running else math.inf
        start = _closed_loop_start(
            queued, sending, (free[0], now, loop_free), max_batch, timeout_s, arrivals
        )
        now = min(finish, decoded, start)
        if now == math.inf:
            return None
        if finish == now:
            _, rows = heapq.heappop(running)
            sending.extend([now] * rows)
            answered.append((now, rows))
            for _ in range(rows if watch else 0):
                arrivals.left(now)
        elif start == now and (decoded > now or queued[0] < now):
            # On a tie with a read, requests that waited for this instance leave first (before
            # the clients its last batch answered send again); an empty queue waits for reads.
            rows = min(len(queued), max_batch)
            for _ in range(rows):
                queued.popleft()
            seconds = batch_time(rows)
            if seconds is None or seconds <= 0:
                return None
            # The loop forms the batch and hands it over (its cost per batch) before the
            # instance starts: more, smaller batches cost the loop more.
            loop_free = now + per_batch_s
            heapq.heapreplace(free, loop_free + seconds)
            heapq.heappush(running, (loop_free + seconds, rows))
        else:
            sending.popleft()
            loop_free = now
            queued.append(now)
            if watch:
                arrivals.arrived(now)
    return answered


def _closed_loop_start(
    queued: Sequence[float],
    sending: Sequence[float],
    times: tuple[float, float, float],
    max_batch: int,
    timeout_s: float,
    arrivals: ArrivalEstimate,
) -> float:
    """When the next batch of a closed loop leaves (``inf``: not before the next read), given
    the first instance free, the clock and the loop's next free moment (``times``)."""
    free_at, now, loop_free = times
    wake = _closed_loop_wake(queued, free_at, max_batch, timeout_s)
    # A timer come due waits for the requests that had arrived by then (``_closed_loop_wake``).
    timer = timeout_s > 0 and len(queued) < max_batch
    if timer and queued:
        # The batcher asks once the loop's pass has read what was sent by then: while
        # requests wait to be read, it does not run.
        at = max(free_at, queued[0], now, loop_free)
        unread = bool(sending) and sending[0] <= at
        if not unread and at < wake and arrivals.expected(wake - at, at) < 1.0:
            wake, timer = at, False  # no other request expected: it leaves at once
    # A batch that leaves as its instance frees (its timeout run out before) leaves as that
    # instance's batch ends, before the clients it answered send again; one that leaves on
    # its timer waits for the loop's pass to read what was sent by then.
    on_timer = bool(queued) and queued[0] + timeout_s > free_at
    decode_first = timer and sending and (sending[0] <= wake if on_timer else sending[0] < wake)
    return math.inf if decode_first else max(wake, now, loop_free)


def _closed_loop_wake(
    queued: Sequence[float], free_at: float, max_batch: int, timeout_s: float
) -> float:
    """When the batcher wakes to send the next batch of a closed loop's queue (``inf``:
    nothing queued): an instance free and a request queued, and with a timeout, the batch
    full or the oldest request's timeout run out.

    A batch timer that comes due waits its turn on the loop: asyncio runs it after the pass's
    reads, so the requests that had arrived by then are decoded before the batch leaves, and a
    wave of answered clients leaves as one batch even when decoding it takes longer than the
    timeout (rrl/README, "Measurements behind the rules"). Without this, a short timeout was
    predicted to split every wave and a long one ranked first, though it waits out its whole
    length whenever a wave splits. Eager batching's wake-up keeps the first decoded request's
    (it under-predicts eager batches; ``rrl.agent.evidence.ClosedLoopBand`` keeps that error
    apart)."""
    if not queued:
        return math.inf
    wake = max(free_at, queued[0])
    if timeout_s > 0 and len(queued) < max_batch:
        wake = max(wake, queued[0] + timeout_s)
    return wake
