"""Resting: the agent costs nothing while it has nothing to do and wakes when the load moves.

On two cores every millisecond the agent spends is taken from the runtime and the front end: at
a steady load its simulations, windows and metrics cost the gateway a measurable share of its
p95 while the gate concluded, window after window, that the incumbent should stay. So once

- the gate has been asked in this workload state, for this incumbent, by a model whose error
  is proven, and let nothing through, and
- the incumbent's last window met the SLO with a margin (p95 at most ``p95_fraction`` of it,
  no violation),

the agent **rests**: it runs no simulation and asks no gate; its decision interval doubles
with every quiet window, up to ``max_interval_s``. It still ticks the workload monitor every
``tick_s`` (one counter read), and it **wakes**, back to its shortest interval and a gate asked
at once, when

- a tick's arrivals (or two ticks') are too many or too few for every rate within
  ``wake_factor`` of the rate it rested at (exact Poisson tails at ``wake_alpha``): a step is
  seen within one or two ticks, before the monitor's window confirms a new state;
- the requests' size moves by more than ``wake_size_levels`` (log2 of rows per request);
- the workload state changes, or the monitor's rate drifts half a level from the rested rate;
- a window of the incumbent no longer meets the SLO with the margin, or two windows running
  measure its p95 above twice its typical p95 when it began resting (``degrade_factor``; the
  median of its last windows at this load): the same load is served worse, so the gate's last
  answer may no longer hold;
- the core budget asks the model to yield cores.

A rest also ends by itself after ``recheck_s`` (30 s, doubling with every recheck that changed
nothing): the gate is asked again, since its calibration may since have become sure enough to
see a gain it could not tell from noise before.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, replace

from rrl.agent.settings import RestSettings


@dataclass(frozen=True, slots=True)
class Resting:
    """Why and on what the agent rests."""

    since: float
    rate_per_s: float
    rows_per_request: float
    key: object
    """The workload key and arrivals bucket it rested on; another wakes it."""
    interval_s: float
    p95_ms: float
    """The incumbent's typical p95 when the rest began: the median of its last windows on the
    same workload key (one window's p95 at a low rate is noisy, and a lucky one would make the
    next ordinary ones look degraded)."""


class Rest:
    """Whether the agent rests, the interval it rests at, and the wake detector (when to begin
    and what wakes it are decided by the rule, ``rrl.agent.policy``)."""

    def __init__(self, settings: RestSettings, base_interval_s: float) -> None:
        self.settings = settings
        self.base_interval_s = base_interval_s
        self.state: Resting | None = None
        self.wakes = 0
        self._rechecks = 0
        self._recent: deque[tuple[int, float, float]] = deque(maxlen=2)  # (arrivals, rows, span)
        self._degraded = 0  # windows running whose p95 was beyond the degradation limit
        self._windows: deque[tuple[object, float]] = deque(maxlen=5)  # (key, incumbent p95)

    @property
    def resting(self) -> bool:
        return self.state is not None

    def interval_s(self) -> float:
        return self.state.interval_s if self.state is not None else self.base_interval_s

    def note(self, key: object, p95_ms: float) -> None:
        """A window of the incumbent that met the SLO with margin, on workload key ``key``."""
        self._windows.append((key, p95_ms))

    def begin(self, now: float, rate_per_s: float, rows: float, key: object) -> None:
        """Start resting, or (already resting) double the interval."""
        s = self.settings
        if self.state is None:
            self._recent.clear()
            self._degraded = 0
            interval = min(2 * self.base_interval_s, s.max_interval_s)
            same = [p95 for k, p95 in self._windows if k == key]
            typical = statistics.median(same) if same else 0.0
            self.state = Resting(now, rate_per_s, rows, key, interval, typical)
            return
        interval = min(2 * self.state.interval_s, s.max_interval_s)
        self.state = replace(self.state, key=key, interval_s=interval)

    def degraded(self, p95_ms: float) -> str | None:
        """Feed a resting window's p95; the reason to wake once ``degrade_windows`` running
        were beyond ``degrade_factor`` times (and ``degrade_min_ms`` above) the typical p95 the
        rest began at."""
        rest, s = self.state, self.settings
        if rest is None:
            return None
        limit = max(s.degrade_factor * rest.p95_ms, rest.p95_ms + s.degrade_min_ms)
        if p95_ms <= limit:
            self._degraded = 0
            return None
        self._degraded += 1
        if self._degraded < s.degrade_windows:
            return None
        return (
            f"incumbent p95 {p95_ms:.1f}ms, {self._degraded} windows running above "
            f"{limit:.1f}ms ({s.degrade_factor:g}x the {rest.p95_ms:.1f}ms it rested at)"
        )

    def wake(self) -> bool:
        """Stop resting; True when it was resting."""
        was = self.state is not None
        if was:
            self.wakes += 1
        self.state = None
        self._rechecks = 0
        self._recent.clear()
        self._degraded = 0
        return was

    def due_for_recheck(self, now: float) -> bool:
        """True (and the rest ended) once it has lasted ``recheck_s`` times two per recheck
        before that changed nothing."""
        if self.state is None:
            return False
        if now - self.state.since < self.settings.recheck_s * 2**self._rechecks:
            return False
        self._rechecks += 1
        self.state = None
        self._recent.clear()
        return True

    def surprised(self, arrivals: int, rows: float, span_s: float) -> str | None:
        """Feed one tick; the reason to wake, if its arrivals (alone or with the tick before)
        do not fit the rested rate or size."""
        rest = self.state
        if rest is None or span_s <= 0:
            return None
        self._recent.append((arrivals, rows, span_s))
        s = self.settings
        # Deferred: SciPy is the tuner's extra (iotgw[tune]), as in rrl.tuners.workload.
        from scipy.special import pdtr, pdtrc

        for n in range(1, len(self._recent) + 1):
            ticks = list(self._recent)[-n:]
            count = sum(t[0] for t in ticks)
            span = sum(t[2] for t in ticks)
            high = rest.rate_per_s * s.wake_factor * span
            low = rest.rate_per_s / s.wake_factor * span
            if (count > 0 and pdtrc(count - 1, high) < s.wake_alpha) or pdtr(
                count, low
            ) < s.wake_alpha:
                return f"{count} arrivals in {span:.1f}s against {rest.rate_per_s:.1f}/s at rest"
        if arrivals > 0:
            size = math.log2(max(rows / arrivals, 1.0))
            rested = math.log2(max(rest.rows_per_request, 1.0))
            if abs(size - rested) > s.wake_size_levels:
                return (
                    f"{rows / arrivals:.1f} rows per request against "
                    f"{rest.rows_per_request:.1f} at rest"
                )
        return None
