"""Trace replay for the tuner bench: every model of a gateway at once over a whole seeded trace,
through ``benchmarks.tuner.serial_loop`` (the gateway's event loop as one serial server, the cores
shared, the batcher of ``rrl.offline.replay``), with the bench's other processes (the load
generators, a broker) as the background load on the same cores: ``background_s`` CPU per request at
the rate requests arrive in the last ``WINDOW_S``. Then the searches: each model's candidates, the
best per-gateway configurations over the trace, and each window's best (the per-phase oracle).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.tuner import serial_loop
from benchmarks.tuner.serial_loop import WINDOW_S, Replayed
from models.knobs import Knobs
from rrl.offline.replay import Figures, ServiceTimes, figures


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

    configs: tuple[Knobs, ...]
    overall: tuple[Figures, ...]
    windows: tuple[tuple[Figures, ...], ...]
    """[window][stream]."""

    def objective(self, slos_ms: Sequence[float], window: int | None = None) -> float:
        """Each stream's objective (p95 + 2 x SLO x violating share) in SLOs, summed: models
        with different SLOs weigh the same."""
        figs = self.overall if window is None else self.windows[window]
        return sum(f.objective(slo) / slo for f, slo in zip(figs, slos_ms, strict=True))


def background_s(times: ServiceTimes) -> float:
    """CPU per request of the bench's other processes (``servicetimes.Costs``; 0 otherwise)."""
    return float(getattr(times, "background_s", 0.0))


def _background_load(streams: Sequence[Stream], horizon_s: float) -> np.ndarray:
    """Cores the bench's other processes need per ``WINDOW_S`` bin, from the arrivals alone."""
    bins = int(horizon_s / WINDOW_S) + 2
    load = np.zeros(bins)
    for s in streams:
        counts = np.bincount((s.arrivals_s / WINDOW_S).astype(int), minlength=bins)[:bins]
        load += counts * background_s(s.times) / WINDOW_S
    return load


def simulate(
    streams: Sequence[Stream], configs: Sequence[Knobs], cores: int, *, seed: int = 0
) -> list[np.ndarray]:
    """Each stream's latencies in seconds (``inf``: refused) under ``configs``, jointly."""
    return replay(streams, configs, cores, seed=seed).latencies


def replay(
    streams: Sequence[Stream], configs: Sequence[Knobs], cores: int, *, seed: int = 0
) -> Replayed:
    """``configs`` (one per stream) replayed jointly over the streams' arrivals, the other
    processes' load drawn from them."""
    horizon = max((float(s.arrivals_s[-1]) for s in streams if s.arrivals_s.size), default=0.0)
    background = _background_load(streams, horizon)
    return serial_loop.replay(streams, configs, cores, seed=seed, background=background)


def score(
    streams: Sequence[Stream],
    joint: Sequence[tuple[Knobs, ...]],
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


def candidates(scored: Sequence[JointScored], slo_ms: float, n_windows: int) -> list[Knobs]:
    """One model's candidates for the joint search, from its replay alone on the machine: per
    thread setting, the best request-level configuration over the whole trace and in each
    window."""
    picked: dict[Knobs, None] = {}
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
    exclude: Sequence[tuple[Knobs, ...]],
    k: int,
) -> tuple[list[JointScored], list[JointScored]]:
    """(the k best per-gateway configurations over the whole trace, not among ``exclude``;
    each window's best: the per-phase oracle)."""
    ranked = sorted(scored, key=lambda s: s.objective(slos_ms))
    best = [s for s in ranked if s.configs not in exclude][:k]
    n_windows = len(scored[0].windows)
    oracle = [min(scored, key=lambda s: s.objective(slos_ms, w)) for w in range(n_windows)]
    return best, oracle
