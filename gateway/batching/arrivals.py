"""How many requests would arrive if a batch waited a little longer.

A batch that waits for rows only gains if other requests arrive meanwhile. What matters is the
rate of arrivals that *can* come while requests are waiting, not the overall request rate: a
lone closed-loop client sends its next request only after its reply, so however fast it sends,
nothing ever arrives while its request waits, and waiting for it cannot fill a batch.

So the rate is measured on a "busy clock" that runs only while the batcher holds at least one
request (queued or computing): the arrivals that found it holding one, divided by the busy time
over the last ``window`` arrivals. For independent (Poisson) arrivals this estimates their rate
without bias; for closed-loop clients it counts exactly the others, the ones a wait could
collect. The estimate is pessimistic on purpose (an upper bound: ``prior`` arrivals are added,
about the 95 % bound of a Poisson count of zero), so a wait is skipped only once enough busy
time was watched to be sure: right after start-up, or when the busy time watched is short
compared with the wait, the batcher keeps waiting as it always did.
"""

from __future__ import annotations

import math
from collections import deque


class ArrivalEstimate:
    def __init__(self, *, window: int = 64, prior: float = 3.0) -> None:
        self._window = window
        self._prior = prior
        self._held = 0  # requests in the batcher: queued, or in a batch not yet answered
        self._busy_total = 0.0  # busy seconds before ``_busy_since``
        self._busy_since = 0.0
        # (busy clock at the arrival, whether the batcher held a request then), oldest first
        self._arrivals: deque[tuple[float, bool]] = deque(maxlen=window)
        self._busy_arrivals = 0  # how many of ``_arrivals`` found it holding one

    def busy_clock(self, now: float) -> float:
        """Seconds during which the batcher held at least one request, up to ``now``."""
        if self._held:
            return self._busy_total + (now - self._busy_since)
        return self._busy_total

    def arrived(self, now: float) -> None:
        """A request entered the batcher (admitted) at ``now``."""
        if len(self._arrivals) == self._window and self._arrivals[0][1]:
            self._busy_arrivals -= 1
        found_busy = self._held > 0
        self._arrivals.append((self.busy_clock(now), found_busy))
        self._busy_arrivals += found_busy
        if not self._held:
            self._busy_since = now
        self._held += 1

    def left(self, now: float) -> None:
        """A request left the batcher (answered, refused or cancelled) at ``now``."""
        self._held -= 1
        if not self._held:
            self._busy_total += now - self._busy_since

    def rate_upper(self, now: float) -> float:
        """Arrivals per second while requests wait, pessimistically (``inf``: not known yet)."""
        if not self._arrivals:
            return math.inf
        watched = self.busy_clock(now) - self._arrivals[0][0]
        if watched <= 0:
            return math.inf
        # The oldest arrival opens the watched span: it is not one of the arrivals inside it.
        inside = self._busy_arrivals - self._arrivals[0][1]
        return (inside + self._prior) / watched

    def expected(self, seconds: float, now: float) -> float:
        """Requests expected to arrive within ``seconds`` from ``now`` (an upper estimate)."""
        if seconds <= 0:
            return 0.0
        return self.rate_upper(now) * seconds
