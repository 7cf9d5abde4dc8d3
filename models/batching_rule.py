"""The batching rule's decisions, one copy for the gateway's batcher and every simulation of it.

When a batch leaves and which requests are refused rest on what is kept here: how many
requests would arrive if a batch waited a little longer (``ArrivalEstimate``), how long a batch
of a given size takes (``ServiceTimeEstimate``), how long an answer then waits for the event
loop (``AnswerLag``), and the two refusals built on them: at
admission, when even the fastest recent pace cannot answer the request in time
(``completion_estimate``), and when its batch starts, when the batch's 90th percentile pace
would answer it late (``answered_by``). ``gateway.batching.batcher`` decides with them on the
event loop; ``rrl.offline.replay`` (the agent's queueing model simulates with it) decides with
the same objects on simulated time, and ``tests/conformance`` holds the two to the same
batches, refusals and latencies.

**Arrivals while a batch waits.** A batch that waits for rows only gains if other requests
arrive meanwhile. What matters is the rate of arrivals that *can* come while requests are
waiting, not the overall request rate: a lone closed-loop client sends its next request only
after its reply, so however fast it sends, nothing ever arrives while its request waits, and
waiting for it cannot fill a batch.

So the rate is measured on a "busy clock" that runs only while the batcher holds at least one
request (queued or computing): the arrivals that found it holding one, divided by the busy time
over the last ``window`` arrivals. For independent (Poisson) arrivals this estimates their rate
without bias; for closed-loop clients it counts exactly the others, the ones a wait could
collect. The estimate is pessimistic on purpose (an upper bound: ``prior`` arrivals are added,
about the 95 % bound of a Poisson count of zero), so a wait is skipped only once enough busy
time was watched to be sure: right after start-up, or when the busy time watched is short
compared with the wait, the batcher keeps waiting as it always did.

**Service times.** A running estimate of how long a batch of a given size takes, kept per power-
of-two size bucket, because compute time grows with batch size but not linearly (fixed per-call
overhead dominates small batches). Each bucket predicts the fastest of its last ``window``
batches: admission control refuses a request when even that pace cannot meet its deadline, so
batches slowed by something else (a session's first calls, a rebuild next to them, another
process on the cores) do not refuse requests that would have made it, as an average that a few
outliers set would. A lasting slowdown shows once it is the whole window.

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
        """ceil(log2(rows)), exactly and cheaply (a simulation asks it per batch)."""
        return (max(rows, 1) - 1).bit_length()

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

    def stale(self, now: float, running: int) -> bool:
        """Whether the figures can no longer be corrected by what runs: no other batch
        ``running`` and none measured for ``STALE_AFTER_S``; refusing on them then could last
        for good, so the next batch runs as a probe instead."""
        return running <= 0 and now - self.observed_at > STALE_AFTER_S

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


def completion_estimate(
    pace: ServiceTimeEstimate,
    now: float,
    *,
    queued_rows: int,
    rows: int,
    max_batch_size: int,
    batch_timeout_s: float,
    busy: int,
    instances: int,
    answer_lag_s: float,
) -> float | None:
    """Seconds until a request of ``rows`` arriving ``now`` would be answered, pessimistically:
    the batches ahead of it and in flight (``busy`` instances held), in waves of
    ``instances``, each taking the fastest recent pace of a full batch; a batch that would not
    be full waits out its timeout; then the answer waits for the event loop (``answer_lag_s``).
    Admission refuses a request whose deadline is nearer. None when the pace is unknown or
    stale: nobody is refused on it."""
    ahead = queued_rows + rows
    if pace.stale(now, busy):
        return None
    per_batch_s = pace.predict(min(ahead, max_batch_size))
    if per_batch_s is None:
        return None
    batches = math.ceil(ahead / max_batch_size)
    waves = math.ceil((batches + busy) / max(instances, 1))
    fill_wait = batch_timeout_s if ahead < max_batch_size else 0.0
    return waves * per_batch_s + fill_wait + answer_lag_s


def answered_by(
    pace: ServiceTimeEstimate, now: float, rows: int, running: int, answer_lag_s: float
) -> float | None:
    """When a batch of ``rows`` starting ``now`` answers at its 90th percentile pace, with the
    event loop's lag (``running``: the other batches in flight): a request of the batch whose
    deadline comes sooner is refused at once (a late answer is an SLO violation all the same,
    and a refusal now lets a retry help). None when the pace is unknown or stale."""
    high = pace.high(rows)
    if high is None or pace.stale(now, running):
        return None
    return now + high + answer_lag_s


class AnswerLag:
    """How long an answered request waits, after its batch is done, for the event loop to
    resume it (the batcher's answers; MQTT's reply leg keeps its own, at the 99th percentile).

    Its caller still has to encode and send the reply from there, on the same loop. At low load
    the wait is a fraction of a millisecond; on a loop saturated by a flood (every pass reading
    hundreds of packets) it reaches tens of milliseconds (docs/performance.md, "Measurements
    behind the backend settings"), and a request admitted with less time left than that is
    answered late however fast its batch ran. Admission and
    the check at the start of a batch therefore plan with a high percentile of the recent waits
    (``answer_lag_s`` above). Waits recorded before a pause of ``STALE_AFTER_S`` without answers
    are forgotten: otherwise a flood's waits, once every request is refused for them, would
    never be corrected."""

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
