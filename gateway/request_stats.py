"""What one model version's requests experienced, kept by time so a window reads right at any
rate: the ``WindowStats`` of the admin API, the dashboard and the tuner.

Two stores, disjoint, each bounded:

- **exact records**: the newest ``exact`` arrivals, completions (with their latency) and
  refusals, each with its time. A window they cover is answered from them alone, exactly, at
  any edge (the tuner reads windows of half a second, and leaves out the requests answered
  within a fraction of a second of a knob change).
- **seconds**: a record pushed out of the exact store is added to the bucket of the second it
  happened in (counts, rows, SLO violations and a latency histogram of ``N_BINS`` log-spaced
  bins), for the last ``max_window_s`` seconds. A window reaching past the exact records adds
  the buckets it spans; the second at its start edge is counted by the fraction of it inside.

Once the exact store is full a window that reaches past it is served from both, so no count is
capped by how many records fit (a fixed 20,000 requests over a 10 s window read 2,000 req/s at
any higher rate), and its percentiles come from the merged histogram: within one bin, an
eighth of an octave (about 9 %), interpolated. Memory: the exact records, plus at most one
bucket per second of the longest window, ``N_BINS`` 4-byte counts each (about 3 MB a model
version at most, and nothing for a model that never filled its exact store).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from models.window_stats import WindowStats

EXACT_RECORDS = 20_000
MAX_WINDOW_S = 3600  # the longest window the admin API and the dashboard take
BINS_PER_OCTAVE = 8
_LOW_EXP = -17  # the first bin starts at 2^-17 s (7.6 µs); shorter latencies fall in it
_HIGH_EXP = 7  # the last ends at 128 s; longer ones fall in it
N_BINS = (_HIGH_EXP - _LOW_EXP) * BINS_PER_OCTAVE
_EDGES_MS = 1000.0 * np.exp2(_LOW_EXP + np.arange(N_BINS + 1) / BINS_PER_OCTAVE)
_PERCENTILES = (50.0, 95.0, 99.0)
_DONE, _ARRIVED, _REJECTED = 0, 1, 2


def latency_bin(latency_s: float) -> int:
    if latency_s <= 0.0:
        return 0
    index = math.floor((math.log2(latency_s) - _LOW_EXP) * BINS_PER_OCTAVE)
    return min(max(index, 0), N_BINS - 1)


def _bins(latencies_s: np.ndarray) -> np.ndarray:
    safe = np.maximum(latencies_s, 2.0**_LOW_EXP)
    index = np.floor((np.log2(safe) - _LOW_EXP) * BINS_PER_OCTAVE)
    return np.clip(index, 0, N_BINS - 1).astype(np.intp)


@dataclass(slots=True)
class _Second:
    """The records of one second pushed out of the exact store."""

    completed: int = 0
    rows: int = 0
    violations: int = 0
    arrived: int = 0
    arrived_rows: int = 0
    rejected: int = 0
    peak_inside: int = 0
    latency: np.ndarray | None = None  # counts per bin, made at the second's first completion


@dataclass(slots=True)
class _Spilled:
    """The buckets' share of one window (fractions at the start edge, hence floats)."""

    completed: float = 0.0
    rows: float = 0.0
    violations: float = 0.0
    arrived: float = 0.0
    arrived_rows: float = 0.0
    rejected: float = 0.0
    peak_inside: int = 0
    latency: np.ndarray = field(default_factory=lambda: np.zeros(N_BINS))
    has_done: bool = False


class RequestStats:
    def __init__(
        self, *, slo_s: float, exact: int = EXACT_RECORDS, max_window_s: int = MAX_WINDOW_S
    ) -> None:
        self._slo_s = slo_s
        self._exact = exact
        self._max_window_s = max_window_s
        # (completion time, latency s, rows, violated SLO), (arrival time, rows, requests inside
        # with it), refusal time.
        self._done: deque[tuple[float, float, int, bool]] = deque()
        self._arrived: deque[tuple[float, int, int]] = deque()
        self._rejected: deque[float] = deque()
        # The time of the newest record of each kind pushed into the seconds (done, arrived,
        # rejected): a window starting after it is served by the exact records alone.
        self._spilled_to = [-math.inf, -math.inf, -math.inf]
        self._seconds: dict[int, _Second] = {}
        self._order: deque[int] = deque()  # the seconds' keys as made (nearly in time order)

    @property
    def seconds_kept(self) -> int:
        """Buckets held (at most about ``max_window_s``)."""
        return len(self._seconds)

    # -- recording, each in the order it happens ---------------------------------------------

    def arrive(self, at: float, rows: int, inside: int = 0) -> None:
        """A request reached the model; ``inside``: the requests inside with it, itself
        counted (the count only grows at an arrival, so the window's peak is read here)."""
        if len(self._arrived) >= self._exact:
            t, r, peak = self._arrived.popleft()
            if (second := self._second(t, at, _ARRIVED)) is not None:
                second.arrived += 1
                second.arrived_rows += r
                second.peak_inside = max(second.peak_inside, peak)
        self._arrived.append((at, rows, inside))

    def complete(self, at: float, latency_s: float, rows: int) -> None:
        if len(self._done) >= self._exact:
            t, latency, r, violated = self._done.popleft()
            if (second := self._second(t, at, _DONE)) is not None:
                second.completed += 1
                second.rows += r
                second.violations += violated
                if second.latency is None:
                    second.latency = np.zeros(N_BINS, dtype=np.uint32)
                second.latency[latency_bin(latency)] += 1
        self._done.append((at, latency_s, rows, latency_s > self._slo_s))

    def reject(self, at: float) -> None:
        if len(self._rejected) >= self._exact:
            t = self._rejected.popleft()
            if (second := self._second(t, at, _REJECTED)) is not None:
                second.rejected += 1
        self._rejected.append(at)

    def _second(self, t: float, now: float, kind: int) -> _Second | None:
        """The bucket of the second ``t`` fell in, or None when no window reaches it."""
        self._spilled_to[kind] = t
        oldest = math.floor(now) - self._max_window_s - 1
        while self._order and self._order[0] < oldest:
            self._seconds.pop(self._order.popleft(), None)
        key = math.floor(t)
        if key < oldest:
            return None
        second = self._seconds.get(key)
        if second is None:
            second = self._seconds[key] = _Second()
            self._order.append(key)
        return second

    # -- reading -----------------------------------------------------------------------------

    def window(
        self, now: float, window_s: float, *, queue_depth: int, in_system: int
    ) -> WindowStats:
        """The last ``window_s`` seconds up to ``now``."""
        since = now - window_s
        done = _newest(self._done, since)
        arrived = _newest(self._arrived, since)
        rejected = len(_newest(self._rejected, since))
        spilled = self._spill(since)
        completed = len(done) + spilled.completed
        rows = sum(d[2] for d in done) + spilled.rows
        if spilled.has_done:
            latencies = np.array([d[1] for d in done], dtype=np.float64)
            histogram = spilled.latency + np.bincount(_bins(latencies), minlength=N_BINS)
            p50, p95, p99 = _histogram_percentiles(histogram)
        elif done:
            latencies_ms = np.array([d[1] for d in done], dtype=np.float64) * 1000.0
            p50, p95, p99 = np.percentile(latencies_ms, _PERCENTILES).tolist()
        else:
            p50 = p95 = p99 = 0.0
        return WindowStats(
            window_s=window_s,
            completed=round(completed),
            rate_per_s=completed / window_s if window_s > 0 else 0.0,
            rows_per_request=rows / completed if completed else 0.0,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            slo_violations=round(sum(1 for d in done if d[3]) + spilled.violations),
            rejected=round(rejected + spilled.rejected),
            queue_depth=queue_depth,
            arrived=round(len(arrived) + spilled.arrived),
            arrived_rows=round(sum(a[1] for a in arrived) + spilled.arrived_rows),
            in_system=in_system,
            in_system_peak=max(in_system, spilled.peak_inside, *(a[2] for a in arrived)),
        )

    def _spill(self, since: float) -> _Spilled:
        """The buckets' share of a window from ``since``: only for the kinds whose exact
        records no longer reach back to it."""
        out = _Spilled()
        reach = [to >= since for to in self._spilled_to]
        if not any(reach):
            return out
        for key, second in self._seconds.items():
            if key + 1 <= since:
                continue
            done = _share(key, since, self._spilled_to[_DONE]) if reach[_DONE] else 0.0
            if done and second.completed:
                out.has_done = True
                out.completed += done * second.completed
                out.rows += done * second.rows
                out.violations += done * second.violations
                if second.latency is not None:
                    out.latency += done * second.latency
            came = _share(key, since, self._spilled_to[_ARRIVED]) if reach[_ARRIVED] else 0.0
            out.arrived += came * second.arrived
            out.arrived_rows += came * second.arrived_rows
            if came:  # the second's peak, wherever in it: a window takes all of its edge second
                out.peak_inside = max(out.peak_inside, second.peak_inside)
            if reach[_REJECTED]:
                out.rejected += _share(key, since, self._spilled_to[_REJECTED]) * second.rejected
        return out

    def completions_per_second(self, now: float, seconds: int) -> list[int]:
        """Requests answered in each of the last ``seconds`` seconds, oldest first, the last
        being the second ``now`` is in, so far (the dashboard's history at its first load)."""
        end = math.floor(now) + 1
        first = end - seconds
        counts = [0] * seconds
        for t, *_ in _newest(self._done, first):
            if (i := math.floor(t) - first) < seconds:
                counts[i] += 1
        for key in range(first, end):
            second = self._seconds.get(key)
            if second is not None:
                counts[key - first] += second.completed
        return counts


def _share(key: int, since: float, spilled_to: float) -> float:
    """The fraction of bucket ``key``'s records of one kind inside a window from ``since``,
    taking them as spread evenly over the part of the second they cover (up to the newest
    record of that kind pushed out, ``spilled_to``)."""
    if key > spilled_to:
        return 0.0  # this kind's records of that second are still exact
    if since <= key:
        return 1.0
    end = min(key + 1.0, spilled_to)
    return max(0.0, (end - since) / (end - key)) if end > key else 0.0


def _histogram_percentiles(histogram: np.ndarray) -> list[float]:
    """p50, p95 and p99 (ms) of a latency histogram, interpolated linearly within a bin."""
    total = float(histogram.sum())
    if total <= 0:
        return [0.0, 0.0, 0.0]
    cumulative = np.cumsum(histogram)
    out = []
    for p in _PERCENTILES:
        target = total * p / 100.0
        i = min(int(np.searchsorted(cumulative, target)), N_BINS - 1)
        before = float(cumulative[i - 1]) if i else 0.0
        inside = float(histogram[i])
        position = (target - before) / inside if inside else 0.0
        lo, hi = float(_EDGES_MS[i]), float(_EDGES_MS[i + 1])
        out.append(lo + (hi - lo) * min(max(position, 0.0), 1.0))
    return out


def _newest(records: deque[Any], since: float) -> list[Any]:
    """The records stamped at or after ``since`` (a time, or a tuple led by one). Each is
    appended when it happens, so they are the newest: read from the end, a short window costs
    what it holds, not the whole history."""
    return list(
        itertools.takewhile(
            lambda r: (r[0] if isinstance(r, tuple) else r) >= since,
            reversed(records),
        )
    )
