"""Running estimate of how long a batch of a given size takes to compute.

Kept per power-of-two size bucket, because compute time grows with batch size but not linearly
(fixed per-call overhead dominates small batches). Each bucket predicts the fastest of its last
``window`` batches: admission control refuses a request when even that pace cannot meet its
deadline, so batches slowed by something else (a session's first calls, a rebuild next to them,
another process on the cores) do not refuse requests that would have made it, as an average
that a few outliers set would. A lasting slowdown shows once it is the whole window.

Figures are refreshed only by batches that run, and refusals based on them stop batches from
running: after a stall (every recent batch slow), every request could be refused for good. So a
batch measured after ``STALE_AFTER_S`` without any describes another time: the windows start
afresh from it, and the batcher lets a batch through as a probe once the figures are that old
with nothing running (``Batcher``).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

STALE_AFTER_S = 1.0
HIGH_QUANTILE = 0.9


class ServiceTimeEstimate:
    def __init__(self, *, window: int = 15, clock: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._clock = clock
        self._recent: dict[int, deque[float]] = {}
        self._by_bucket: dict[int, float] = {}  # each bucket's fastest, updated on observe
        self._high: dict[int, float] = {}  # each bucket's 90th percentile, updated on observe
        self.observed_at = -math.inf  # clock of the last batch measured

    @staticmethod
    def _bucket(rows: int) -> int:
        return max(0, math.ceil(math.log2(max(rows, 1))))

    def observe(self, rows: int, seconds: float) -> None:
        now = self._clock()
        if now - self.observed_at > STALE_AFTER_S:  # the old figures describe another time
            self._recent.clear()
            self._by_bucket.clear()
            self._high.clear()
        self.observed_at = now
        b = self._bucket(rows)
        recent = self._recent.get(b)
        if recent is None:
            recent = self._recent[b] = deque(maxlen=self._window)
        recent.append(seconds)
        self._by_bucket[b] = min(recent)
        ordered = sorted(recent)
        self._high[b] = ordered[int(HIGH_QUANTILE * (len(ordered) - 1))]

    def samples(self) -> dict[int, tuple[float, ...]]:
        """The recent batch times of each bucket, keyed by the bucket's largest batch size."""
        return {2**b: tuple(recent) for b, recent in sorted(self._recent.items())}

    def high(self, rows: int) -> float | None:
        """Seconds that nine in ten recent batches of ``rows`` stayed within (the 90th
        percentile of its bucket's window): what a batch about to start is planned with when a
        late answer counts as a failure. Sizes not measured fall back to ``predict``."""
        high = self._high.get(self._bucket(rows))
        return high if high is not None else self.predict(rows)

    def predict(self, rows: int) -> float | None:
        """Seconds for one batch of ``rows``; None before anything was measured."""
        if not self._by_bucket:
            return None
        b = self._bucket(rows)
        if b in self._by_bucket:
            return self._by_bucket[b]
        nearest = min(self._by_bucket, key=lambda k: abs(k - b))
        # A larger batch than any measured: scale up linearly, which over-estimates (safe for
        # admission); a smaller one: take the smallest measured, also an over-estimate.
        scale = 2.0 ** (b - nearest) if b > nearest else 1.0
        return self._by_bucket[nearest] * scale
