"""The workload state (arrival-rate level, request-size level) and its online estimate with change
detection.

Levels are log2 steps: rate level r means an arrival rate near ``base_rate_per_s * 2**r``, size
level k means requests of about ``2**k`` rows. The monitor sees arrival counts tick by tick (one
``update`` per gateway snapshot) and keeps the arrivals of a sliding window. The state moves to a
new rate level only when the window's count is too large or too small for *any* rate inside the
current level's band widened by a hysteresis margin (half a level plus ``hysteresis``), judged by
an exact Poisson tail at significance ``alpha``, for ``persist`` consecutive updates; the new level
is then estimated from those last updates alone (the window still holds pre-change arrivals). So a
steady noisy rate, even one sitting on a level boundary, keeps its state (at most one change when
it sits right at the band edge, after which it is inside the new band), and a rate flapping faster
than the window is averaged instead of chased.

The promise (``detection_bound_s``): a step to a rate at least two levels (a factor of 4) away from
the current state's level, at which a window holds at least ``MIN_COUNT_FOR_PROMISE`` arrivals, is
detected within ``window_s + (persist + 1) * tick_s`` seconds of the step.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

MIN_COUNT_FOR_PROMISE = 30
MIN_COUNT_FOR_LEVEL = 50  # arrivals that put a rate within about 0.2 levels (1 SD)
MEDIAN_CHI2_1 = 0.4549364  # the median of a chi-squared variable with one degree of freedom
MIN_TICKS = 8


def index_of_dispersion(counts: Sequence[float]) -> float:
    """Variance over mean of the arrivals per tick (1 for Poisson; above 1, bursty), within
    [0.25, 20]; 1 with fewer than ``MIN_TICKS`` ticks or none arrived.

    The variance is read from successive differences, not from deviations from the mean: half
    the median of the squared differences over the median of chi-squared(1). A rate that steps
    or ramps inside the ticks (a diurnal hour every few seconds) moves the mean and reads as
    burstiness in the plain variance, and the queueing model then predicts a p95 an order of
    magnitude above the measured one (rrl/README, "Measurements behind the rules"). One step is one
    large difference, which the median ignores; burstiness inside the ticks makes every
    difference large, which it keeps."""
    if len(counts) < MIN_TICKS:
        return 1.0
    mean = sum(counts) / len(counts)
    if mean <= 0:
        return 1.0
    squared = [(b - a) ** 2 for a, b in itertools.pairwise(counts)]
    variance = statistics.median(squared) / (2.0 * MEDIAN_CHI2_1)
    return min(max(variance / mean, 0.25), 20.0)


@dataclass(frozen=True, slots=True, order=True)
class WorkloadState:
    rate_level: int
    size_level: int = 0

    def distance(self, other: WorkloadState) -> int:
        return abs(self.rate_level - other.rate_level) + abs(self.size_level - other.size_level)

    def __str__(self) -> str:
        return f"rate{self.rate_level:+d}/size{self.size_level:+d}"


@dataclass(frozen=True, slots=True)
class MonitorSettings:
    base_rate_per_s: float = 1.0
    """Arrival rate of level 0; level r is base * 2**r."""
    window_s: float = 3.0
    """Sliding window the rate is estimated over."""
    hysteresis: float = 0.25
    """How far (in levels) beyond the band edge (half a level) the estimate must go."""
    alpha: float = 1e-4
    """Significance of the departure test: the chance that a steady rate inside the band yields
    a window count this extreme (exact Poisson tail)."""
    persist: int = 2
    """Consecutive updates the departure must last before the state changes."""
    min_rate_per_s: float = 0.05
    """Rates below this count as this (an idle device fleet is the lowest level, not -inf)."""

    @property
    def band_edge(self) -> float:
        """How far (in levels) from a state's own level its band reaches: half a level plus the
        hysteresis."""
        return 0.5 + self.hysteresis

    def level_of(self, rate_per_s: float) -> float:
        return math.log2(max(rate_per_s, self.min_rate_per_s) / self.base_rate_per_s)


@dataclass(frozen=True, slots=True)
class Change:
    at: float
    old: WorkloadState | None
    new: WorkloadState
    rate_per_s: float
    """The rate the new state was judged from: the latest updates after a departure (the
    window still holds arrivals from before the step), the window's at the first estimate."""


class WorkloadMonitor:
    def __init__(self, settings: MonitorSettings | None = None) -> None:
        self.settings = settings or MonitorSettings()
        self._ticks: deque[tuple[float, int, float]] = deque()  # (time, arrivals, rows)
        self._started: float | None = None
        self._last_update: float | None = None
        self._rate_streak = 0
        self._size_streak = 0
        self.state: WorkloadState | None = None
        self.changes: list[Change] = []

    @property
    def rate_per_s(self) -> float:
        rate, _count = self._window()
        return rate

    @property
    def rows_per_request(self) -> float:
        arrivals = sum(a for _, a, _ in self._ticks)
        rows = sum(r for _, _, r in self._ticks)
        return rows / arrivals if arrivals else 1.0

    def in_band(self, rate_per_s: float) -> bool:
        """Whether ``rate_per_s`` lies inside the current state's band (half a level plus the
        hysteresis either side): a window measured while the state was changing lies outside."""
        if self.state is None:
            return False
        s = self.settings
        return abs(s.level_of(rate_per_s) - self.state.rate_level) <= s.band_edge

    def detection_bound_s(self, tick_s: float) -> float:
        """The promised detection time of a two-level step (see the module docstring)."""
        return self.settings.window_s + (self.settings.persist + 1) * tick_s

    def update(self, now: float, arrivals: int, rows: float | None = None) -> WorkloadState:
        """Record ``arrivals`` requests (``rows`` rows in all; default one each) that arrived
        since the previous update, and return the (possibly new) state."""
        if self._started is None:
            # The first update has no start of its interval; treat it as one tick long.
            self._started = now - 1.0 if self._last_update is None else self._last_update
        self._last_update = now
        self._ticks.append((now, arrivals, float(arrivals if rows is None else rows)))
        cutoff = now - self.settings.window_s
        while self._ticks and self._ticks[0][0] <= cutoff:
            self._ticks.popleft()
        rate, count = self._window()
        level = self.settings.level_of(rate)
        size = math.log2(max(self.rows_per_request, 1.0))
        if self.state is None:
            if now - self._started >= self.settings.window_s or count >= MIN_COUNT_FOR_PROMISE:
                self._switch(now, WorkloadState(round(level), round(size)), rate)
            return self.state or WorkloadState(round(level), round(size))
        departure = self._rate_departure(count, self._span())
        new_size_level = self._size_departure(size)
        if departure is not None or new_size_level is not None:
            self._switch(
                now,
                WorkloadState(
                    self.state.rate_level if departure is None else departure[0],
                    self.state.size_level if new_size_level is None else new_size_level,
                ),
                rate if departure is None else departure[1],
            )
        return self.state

    def _span(self) -> float:
        if self._last_update is None or self._started is None:
            return 0.0
        return min(self.settings.window_s, self._last_update - self._started)

    def _window(self) -> tuple[float, int]:
        count = sum(a for _, a, _ in self._ticks)
        span = self._span()
        return (count / span if span > 0 else 0.0), count

    def _rate_departure(self, count: int, span: float) -> tuple[int, float] | None:
        """A new rate level, and the rate it was estimated from, once the window's count is,
        ``persist`` updates running, too many or too few for any rate inside the current band
        (exact Poisson tails at level ``alpha``); the new level is estimated from the updates
        since the departure began only."""
        assert self.state is not None
        s = self.settings
        edge = s.band_edge
        upper = s.base_rate_per_s * 2.0 ** (self.state.rate_level + edge) * span
        lower = s.base_rate_per_s * 2.0 ** (self.state.rate_level - edge) * span
        # Deferred: SciPy is the tuner's extra (iotgw[tune]); the gateway imports this module
        # without it and only runs an agent when it is installed (gateway.tuning).
        from scipy.special import pdtr, pdtrc

        # P(N >= count) under the band's highest rate, P(N <= count) under its lowest.
        too_many = count > 0 and pdtrc(count - 1, upper) < s.alpha
        departed = too_many or pdtr(count, lower) < s.alpha
        if not departed:
            self._rate_streak = 0
            return None
        self._rate_streak += 1
        if self._rate_streak < s.persist:
            return None
        self._rate_streak = 0
        # The new level from the fewest latest updates (at most ``persist``) that hold enough
        # arrivals to say it: the first update of a departure may straddle the step, and
        # including it would put a step up to a high rate a level short (a second change
        # moments later); at low rates all ``persist`` updates are needed.
        ticks = list(self._ticks)
        used = 1
        while used < s.persist and sum(a for _, a, _ in ticks[-used:]) < MIN_COUNT_FOR_LEVEL:
            used += 1
        arrivals = sum(a for _, a, _ in ticks[-used:])
        start = ticks[-used - 1][0] if len(ticks) > used else self._started
        assert start is not None and self._last_update is not None
        rate = arrivals / max(self._last_update - start, 1e-9)
        return round(s.level_of(rate)), rate

    def _size_departure(self, size: float) -> int | None:
        assert self.state is not None
        if abs(size - self.state.size_level) > self.settings.band_edge:
            self._size_streak += 1
        else:
            self._size_streak = 0
        if self._size_streak >= self.settings.persist:
            self._size_streak = 0
            return round(size)
        return None

    def _switch(self, now: float, new: WorkloadState, rate: float) -> None:
        if new == self.state:
            return
        self.changes.append(Change(now, self.state, new, rate))
        self.state = new
        self._rate_streak = self._size_streak = 0
