"""Trace replay with the cores shared: ``rrl.replay``'s batcher model, one lane per model, with
the gateway's own CPU competing with the runtime for the cores.

Why not ``rrl.replay.simulate``: it treats the gateway's per-request cost (HTTP or MQTT, decoding,
the reply, and the load generator's own work on the same machine) as a delay that takes no core,
so it sees capacity that is not there wherever that cost is large against inference: on
vision_cnn (12 KB tensors) it predicted 5 ms p95 for batch 1 on one 2-thread instance, measured
263 ms. Here the machine is ``cores`` cores shared by processor sharing between

- the **front end**: ``per_request_s`` CPU-seconds per request (calibrated from the measured
  capacity, ``servicetimes.calibrate``) at the rate requests arrive in the last ``WINDOW_S``,
  plus ``per_batch_s`` per batch started in that window (the executor crossing, concatenation and
  fan-out run on the event loop), a fluid demand of ``u`` cores;
- the **instances**: a batch running on an instance with ``t`` intra-op threads demands ``t``
  cores.

A batch starts at the speed ``min(1, cores / (busy threads + its own + u))`` and keeps it (the
model does not slow running batches when more start: cheap, and the error is one batch). The
measured service times (c sessions of t threads calling at once) are turned into full-speed
times by undoing the oversubscription they were measured under (``c x t > cores``), so it is not
counted twice. A request reaches its batcher after its front-end CPU at the speed of that moment.

Several models replay jointly: their lanes interleave in start order, so one model's burst slows
the other's batches: what a per-gateway configuration must be chosen against.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rrl.replay import Figures, ServiceTimes, batch_start, figures
from rrl.space import Config

WINDOW_S = 0.25


@dataclass(frozen=True)
class Stream:
    """One model's arrivals (seconds from the trace's start) and what it costs."""

    arrivals_s: np.ndarray
    window_of: np.ndarray
    """The report phase of each request."""
    times: ServiceTimes
    slo_s: float


@dataclass(frozen=True)
class JointScored:
    """A per-gateway configuration (one per stream) replayed: per stream, the whole trace and
    each window."""

    configs: tuple[Config, ...]
    overall: tuple[Figures, ...]
    windows: tuple[tuple[Figures, ...], ...]
    """[window][stream]."""

    def objective(self, slos_ms: Sequence[float], window: int | None = None) -> float:
        """Each stream's objective (p95 + 2 x SLO x violating share) in SLOs, summed: models
        with different SLOs weigh the same."""
        figs = self.overall if window is None else self.windows[window]
        return sum(f.objective(slo) / slo for f, slo in zip(figs, slos_ms, strict=True))


@dataclass
class _Lane:
    """One model's batcher (``rrl.replay.simulate``'s rules) stepped one batch at a time."""

    arrivals: np.ndarray
    ready: list[float]
    config: Config
    samples: dict[int, list[float]]
    per_batch_s: float
    slo_s: float
    rng: np.random.Generator
    head: int = 0
    free: list[float] = field(default_factory=list)
    batches: list[tuple[int, int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.free = [0.0] * self.config.concurrency
        self.sizes = sorted(self.samples)

    def next_start(self) -> float | None:
        """When the next batch starts (refusing what already waited out its deadline)."""
        n = len(self.ready)
        while self.head < n:
            start = batch_start(
                self.ready,
                self.head,
                self.free[0],
                self.config.max_batch_size,
                self.config.batch_timeout_ms / 1e3,
            )
            if start - self.arrivals[self.head] <= self.slo_s:
                return start
            self.head += 1  # refused: the gateway answers it at once, no service time
        return None

    def run(self, start: float, speed: float) -> float:
        end = min(
            bisect.bisect_right(self.ready, start, lo=self.head),
            self.head + self.config.max_batch_size,
        )
        rows = max(end - self.head, 1)
        i = min(bisect.bisect_left(self.sizes, rows), len(self.sizes) - 1)
        drawn = self.samples[self.sizes[i]]
        seconds = drawn[int(self.rng.integers(len(drawn)))] * max(1.0, rows / self.sizes[i])
        done = start + seconds / speed + self.per_batch_s
        self.batches.append((self.head, rows, done))
        self.head += rows
        heapq.heapreplace(self.free, done)
        return done

    def latencies(self) -> np.ndarray:
        out = np.full(len(self.arrivals), np.inf)
        for head, rows, done in self.batches:
            out[head : head + rows] = done - self.arrivals[head : head + rows]
        return out


def full_speed(times: ServiceTimes, setting: tuple[int, int], cores: int) -> dict[int, list[float]]:
    """The setting's samples with the oversubscription they were measured under undone."""
    c, t = setting
    factor = max(1.0, c * t / cores)
    return {b: [s / factor for s in v] for b, v in times.samples[setting].items()}


def _front_end_load(streams: Sequence[Stream], horizon_s: float) -> np.ndarray:
    """Cores the front end needs per ``WINDOW_S`` bin, from the arrivals alone."""
    bins = int(horizon_s / WINDOW_S) + 2
    load = np.zeros(bins)
    for s in streams:
        counts = np.bincount((s.arrivals_s / WINDOW_S).astype(int), minlength=bins)[:bins]
        load += counts * s.times.per_request_s / WINDOW_S
    return load


def simulate(
    streams: Sequence[Stream], configs: Sequence[Config], cores: int, *, seed: int = 0
) -> list[np.ndarray]:
    """Each stream's latencies in seconds (``inf``: refused) under ``configs``, jointly."""
    horizon = max((float(s.arrivals_s[-1]) for s in streams if s.arrivals_s.size), default=0.0)
    fe_load = _front_end_load(streams, horizon)

    def u_at(t: float) -> float:
        return float(fe_load[min(int(t / WINDOW_S), fe_load.size - 1)])

    lanes = []
    rng = np.random.default_rng(seed)
    for s, cfg in zip(streams, configs, strict=True):
        # Front end: each request's CPU at the speed the fluid load leaves it (one thread).
        slow = np.array([max(1.0, (u_at(a) + 1.0) / cores) for a in s.arrivals_s])
        ready = (s.arrivals_s + s.times.per_request_s * slow).tolist()
        setting = (cfg.concurrency, cfg.intra_op_threads)
        samples = full_speed(s.times, setting, cores)
        lanes.append(_Lane(s.arrivals_s, ready, cfg, samples, s.times.per_batch_s, s.slo_s, rng))
    running: list[tuple[float, int]] = []  # (done, threads) of batches in flight
    busy = 0
    recent: deque[tuple[float, float]] = deque()  # (start, per-batch CPU) in the last window
    recent_cpu = 0.0
    starts = [lane.next_start() for lane in lanes]
    while any(s is not None for s in starts):
        k = min((i for i, s in enumerate(starts) if s is not None), key=lambda i: starts[i])  # type: ignore[arg-type,return-value]
        start = starts[k]
        assert start is not None
        while running and running[0][0] <= start:
            busy -= heapq.heappop(running)[1]
        while recent and recent[0][0] < start - WINDOW_S:
            recent_cpu -= recent.popleft()[1]
        lane = lanes[k]
        threads = lane.config.intra_op_threads
        demand = busy + threads + u_at(start) + recent_cpu / WINDOW_S
        done = lane.run(start, min(1.0, cores / demand))
        heapq.heappush(running, (done, threads))
        busy += threads
        recent.append((start, lane.per_batch_s))
        recent_cpu += lane.per_batch_s
        starts[k] = lane.next_start()
    return [lane.latencies() for lane in lanes]


def score(
    streams: Sequence[Stream],
    joint: Sequence[tuple[Config, ...]],
    n_windows: int,
    cores: int,
    *,
    seed: int = 0,
) -> list[JointScored]:
    """Every per-gateway configuration replayed over the same arrivals."""
    out = []
    for configs in joint:
        lat = simulate(streams, configs, cores, seed=seed)
        overall = tuple(figures(x, s.slo_s) for x, s in zip(lat, streams, strict=True))
        per_window = tuple(
            tuple(figures(x[s.window_of == w], s.slo_s) for x, s in zip(lat, streams, strict=True))
            for w in range(n_windows)
        )
        out.append(JointScored(tuple(configs), overall, per_window))
    return out


def candidates(scored: Sequence[JointScored], slo_ms: float, n_windows: int) -> list[Config]:
    """One model's candidates for the joint search, from its replay alone on the machine: per
    thread setting, the best request-level configuration over the whole trace and in each
    window."""
    picked: dict[Config, None] = {}
    key = lambda s: (s.configs[0].concurrency, s.configs[0].intra_op_threads)  # noqa: E731
    for _, group in itertools.groupby(sorted(scored, key=key), key=key):
        members = list(group)
        for w in [None, *range(n_windows)]:
            best = min(members, key=lambda s: s.objective([slo_ms], w))
            picked[best.configs[0]] = None
    return list(picked)


def search(
    scored: Sequence[JointScored],
    slos_ms: Sequence[float],
    exclude: Sequence[tuple[Config, ...]],
    k: int,
) -> tuple[list[JointScored], list[JointScored]]:
    """(the k best per-gateway configurations over the whole trace, not among ``exclude``;
    each window's best: the per-phase oracle)."""
    ranked = sorted(scored, key=lambda s: s.objective(slos_ms))
    best = [s for s in ranked if s.configs not in exclude][:k]
    n_windows = len(scored[0].windows)
    oracle = [min(scored, key=lambda s: s.objective(slos_ms, w)) for w in range(n_windows)]
    return best, oracle
