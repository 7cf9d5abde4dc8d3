"""Whom the batcher refuses, and why: beside its queue, not inside it.

A request is refused rather than served late, with a reason and a retry hint:

- on arrival, when the queue is full (``Overloaded``), its deadline has passed, or even the
  fastest recent pace cannot answer it in time (``models.batching_rule.completion_estimate``);
- when its batch starts, when the batch's 90th percentile pace and the event loop's lag in
  resuming callers would answer it after its deadline (``models.batching_rule.answered_by``):
  admission plans with the fastest pace, so a request can reach its batch with less time left
  than the batch takes, and the median pace left one admitted answer in ten late whenever the
  queue ran up to the deadlines (overload).

Both rest on the pace of recent batches (``ServiceTimeEstimate``) and on the answer lag
(``AnswerLag``), which this object keeps. Figures no batch can correct any more (none running,
none measured for ``STALE_AFTER_S``) refuse nobody: the next batch runs as a probe.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gateway.errors import DeadlineUnmeetable, Overloaded
from models.batching_rule import (
    AnswerLag,
    ServiceTimeEstimate,
    answered_by,
    completion_estimate,
)
from models.knobs import Knobs


class Admission:
    def __init__(self, name: str, clock: Callable[[], float]) -> None:
        self.name = name
        self._clock = clock
        self.service_time = ServiceTimeEstimate(clock=clock)
        self.answer_lag = AnswerLag(clock=clock)

    def check_arrival(
        self,
        *,
        rows: int,
        deadline: float,
        knobs: Knobs,
        queued: int,
        queued_rows: int,
        max_queue_size: int,
        busy: int,
        instances: int,
    ) -> None:
        """Raise the refusal of a request of ``rows`` arriving now, if it is refused: the queue
        (``queued`` requests, ``queued_rows`` rows) full, its deadline passed, or the deadline
        nearer than the pessimistic estimate of its answer (``busy`` of ``instances`` held)."""
        if queued >= max_queue_size:
            raise Overloaded(
                f"model {self.name}: queue is full ({max_queue_size} requests waiting)",
                retry_after=self.drain_time(knobs, queued_rows, instances),
            )
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise DeadlineUnmeetable(f"model {self.name}: the request's deadline has passed")
        estimate = completion_estimate(
            self.service_time,
            self._clock(),
            queued_rows=queued_rows,
            rows=rows,
            max_batch_size=knobs.max_batch_size,
            batch_timeout_s=knobs.batch_timeout_s,
            busy=busy,
            instances=instances,
            answer_lag_s=self.answer_lag.high,
        )
        if estimate is not None and estimate > remaining:
            raise DeadlineUnmeetable(
                f"model {self.name}: deadline cannot be met (estimated {estimate * 1e3:.1f} ms "
                f"with {queued} request(s) queued, {remaining * 1e3:.1f} ms left)",
                # Retrying at once would meet the same queue: tell the client when it drains.
                retry_after=self.drain_time(knobs, queued_rows, instances),
            )

    def answered_by(self, rows: int, now: float, running: int) -> float | None:
        """When a batch of ``rows`` starting ``now`` answers at its 90th percentile pace, the
        event loop's lag included (``running``: the other batches in flight); None when the
        figures are unknown or stale, and nobody is refused for them."""
        return answered_by(self.service_time, now, rows, running, self.answer_lag.high)

    def late(
        self, rows: int, now: float, deadline: float, enqueued: float, retry_after: float
    ) -> DeadlineUnmeetable:
        """The refusal of a request of a starting batch of ``rows`` that it would answer late."""
        return DeadlineUnmeetable(
            f"model {self.name}: a batch of {rows} rows takes up to about "
            f"{(self.service_time.high(rows) or 0.0) * 1e3:.1f} ms and an answer then waits up "
            f"to {self.answer_lag.high * 1e3:.1f} ms for the event loop; "
            f"{(deadline - now) * 1e3:.1f} ms were left "
            f"after {(now - enqueued) * 1e3:.1f} ms in the queue",
            retry_after=retry_after,
        )

    def drain_time(self, knobs: Knobs, queued_rows: int, instances: int) -> float:
        """Seconds until ``queued_rows`` are worked off (at least 1): a retry hint."""
        per_batch = self.service_time.predict(knobs.max_batch_size) or 0.1
        batches = math.ceil(queued_rows / knobs.max_batch_size)
        return max(1.0, batches * per_batch / max(instances, 1))
