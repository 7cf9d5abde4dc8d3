"""How long an answered request waits, after its batch is done, for the event loop to resume it.

Its caller still has to encode and send the reply from there, on the same loop. At low load the
wait is a fraction of a millisecond; on a loop saturated by a flood (every pass reading hundreds
of packets) it was measured at 10-20 ms (p90-p99) and more, and a request admitted with less
time left than that is answered late however fast its batch ran. Admission and the check at the
start of a batch therefore plan with a high percentile of the recent waits. Waits recorded before
a pause of ``STALE_AFTER_S`` without answers are forgotten (``models.batching_rule``):
otherwise a flood's waits, once every request is refused for them, would never be corrected.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from models.batching_rule import STALE_AFTER_S


class AnswerLag:
    def __init__(
        self,
        *,
        window: int = 64,
        every: int = 16,
        quantile: float = 0.9,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._observed_at = -math.inf
        self._recent: deque[float] = deque(maxlen=window)
        self._every = every
        self._quantile = quantile
        self._seen = 0
        self._high = 0.0

    def observe(self, seconds: float) -> None:
        now = self._clock()
        if now - self._observed_at > STALE_AFTER_S:
            self._recent.clear()
            self._seen = 0
        self._observed_at = now
        self._recent.append(seconds)
        self._seen += 1
        # Re-sorted every few answers, not on each: it is read on every admission.
        if self._seen % self._every == 0 or self._seen < self._every:
            ordered = sorted(self._recent)
            self._high = ordered[int(self._quantile * (len(ordered) - 1))]

    @property
    def high(self) -> float:
        """Seconds: the recent waits' high percentile (0 before any answer)."""
        return self._high
