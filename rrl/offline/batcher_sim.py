"""The gateway's batcher on simulated time: the same decisions, event by event.

``gateway.batching.batcher`` runs one dispatch loop per model: it takes an idle instance, waits
for rows until the batch is full, the oldest request has waited the batch timeout, or no other
request is expected in what is left of that window, takes the oldest requests, refuses those the
batch would answer late, and runs it. Requests are refused on arrival when even the fastest
recent pace cannot answer them in time. This runs that loop over a trace of arrivals with the
rule's own objects (``models.batching_rule``: the arrival estimate, the pace estimate and the
two refusals), fed as the events happen on the simulated clock, so a simulation refuses whom the
batcher refuses and forms the batches it forms (``tests/conformance`` holds the two together).

The profiling harness (``rrl.offline.harness``) runs the same loop on the wall clock, its
batches run by real sessions: only ``_advance`` and ``_start`` differ.

What it adds to the batcher, for predictions: batch times drawn from measured samples, a front
end that delays each request ``per_request_s`` before it reaches the queue, and ``serial``, the
gateway's one event loop, which forms one batch at a time and is held ``per_batch_s`` plus
``per_request_s`` a request by each (``rrl.offline.replay.simulate``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from models.batching_rule import (
    ArrivalEstimate,
    ServiceTimeEstimate,
    answered_by,
    completion_estimate,
)
from models.knobs import Knobs


@dataclass(frozen=True, slots=True)
class BatchTimes:
    """Where a simulated batch's time comes from: ``draw(rows)`` one batch's runtime call (the
    rule learns its pace from what ran, as the batcher does); ``per_batch_s`` the gateway's own
    cost per batch, ``per_request_s`` per request."""

    draw: Callable[[int], float]
    per_batch_s: float = 0.0
    per_request_s: float = 0.0


class BatcherSim:
    """One model's batcher over one trace: ``run`` returns each request's latency (``inf``:
    refused)."""

    def __init__(
        self,
        config: Knobs,
        times: BatchTimes,
        *,
        slo_s: float,
        serial: bool = False,
        max_queue: float = math.inf,
    ) -> None:
        self.config, self.times, self.slo_s = config, times, slo_s
        self.serial, self.max_queue = serial, max_queue
        self.now = 0.0
        self.pace = ServiceTimeEstimate(clock=lambda: self.now)
        self.arrivals = ArrivalEstimate()
        self.queue: deque[int] = deque()  # admitted requests not yet in a batch, oldest first
        # (done, seq, the runtime call's seconds, requests) of the batches in flight: a heap
        self.running: list[tuple[float, int, float, list[int]]] = []
        self.idle = config.concurrency
        self.collecting = False  # the dispatch loop holds an instance and waits for rows
        self.leave_at = math.inf  # when the batch being collected leaves (inf: not decided)
        self.loop_free = 0.0
        self.batches: list[tuple[float, int]] = []  # (started, rows), for the conformance tests
        self._seq = 0

    def run(self, arrivals_s: Sequence[float]) -> list[float]:
        ready = (
            list(arrivals_s) if self.serial else [a + self.times.per_request_s for a in arrivals_s]
        )
        self.arrived_s = arrivals_s
        self.latencies = [math.inf] * len(ready)
        timeout_s = self.config.batch_timeout_ms / 1000.0
        i, fill_deadline = 0, math.inf
        while True:
            if not self.collecting and self.queue and self.idle > 0:
                self.idle -= 1
                self.collecting = True
                fill_deadline = ready[self.queue[0]] + timeout_s
                self._decide(fill_deadline)
            if self.collecting and self.now >= self.leave_at:
                self._take()
                continue
            next_arrival = ready[i] if i < len(ready) else math.inf
            timer = math.inf
            if self.collecting:
                timer = self.leave_at if self.leave_at < math.inf else fill_deadline
            if self._advance(min(next_arrival, timer)):
                continue  # a batch finished
            if self.now == math.inf:
                return self.latencies
            if next_arrival <= self.now:
                # Everyone due is queued before the loop decides, as requests that reach the
                # gateway in one turn of its event loop are queued before the batcher wakes.
                while i < len(ready) and ready[i] <= self.now:
                    self._admit(i)
                    i += 1
                if self.collecting and self.leave_at == math.inf:
                    self._decide(fill_deadline)  # an arrival wakes the waiting loop
            elif self.leave_at == math.inf:
                self._decide(fill_deadline)  # the batch timeout ran out

    def _advance(self, until: float) -> bool:
        """Move the clock to the next event no later than ``until``: a running batch's end (then
        finish it and return True), else ``until`` itself. Simulated here; the profiling harness
        (``rrl.offline.harness``) waits on the wall clock for its runtime calls instead."""
        if self.running and self.running[0][0] <= until:
            self.now = self.running[0][0]
            _, _, seconds, batch = heapq.heappop(self.running)
            self._finished(batch, seconds)
            return True
        self.now = until
        return False

    def _decide(self, fill_deadline: float) -> None:
        """Whether the batch being collected leaves now: full, its timeout run out, or no other
        request expected in what is left of it (the batcher's ``_collect``)."""
        wait = fill_deadline - self.now
        leave = (
            len(self.queue) >= self.config.max_batch_size
            or wait <= 0
            or self.arrivals.expected(wait, self.now) < 1.0
        )
        if leave:
            # On the one event loop, the batch forms once the loop is free.
            self.leave_at = max(self.now, self.loop_free) if self.serial else self.now

    def _admit(self, i: int) -> None:
        """Request ``i`` arrives: queued, or refused as the batcher's admission refuses it."""
        deadline = self.arrived_s[i] + self.slo_s
        remaining = deadline - self.now
        queued = len(self.queue)
        busy = len(self.running) + self.collecting
        if queued >= self.max_queue or remaining <= 0:
            return
        estimate = completion_estimate(
            self.pace,
            self.now,
            queued_rows=queued,
            rows=1,
            max_batch_size=self.config.max_batch_size,
            batch_timeout_s=self.config.batch_timeout_ms / 1000.0,
            busy=busy,
            instances=self.config.concurrency,
            answer_lag_s=0.0,
        )
        if estimate is not None and estimate > remaining:
            return
        self.queue.append(i)
        self.arrivals.arrived(self.now)

    def _take(self) -> None:
        """The oldest requests leave as a batch; those it would answer late are refused (the
        batcher's ``_take`` and ``_refuse_late``)."""
        self.collecting, self.leave_at = False, math.inf
        batch: list[int] = []
        while self.queue and len(batch) < self.config.max_batch_size:
            j = self.queue.popleft()
            if self.now >= self.arrived_s[j] + self.slo_s:
                self.arrivals.left(self.now)
                continue
            batch.append(j)
        finish = answered_by(self.pace, self.now, len(batch), len(self.running), 0.0)
        if batch and finish is not None:
            late = [j for j in batch if self.arrived_s[j] + self.slo_s < finish]
            for _ in late:
                self.arrivals.left(self.now)
            batch = [j for j in batch if self.arrived_s[j] + self.slo_s >= finish]
        if not batch:
            self.idle += 1
            return
        self._start(batch)

    def _start(self, batch: list[int]) -> None:
        """Run a batch: its time drawn, its requests' latencies known from that."""
        rows = len(batch)
        seconds = self.times.draw(rows)
        self.batches.append((self.now, rows))
        if self.serial:
            self.loop_free = self.now + self.times.per_batch_s + rows * self.times.per_request_s
            done = self.loop_free + seconds
        else:
            done = self.now + seconds + self.times.per_batch_s
        for j in batch:
            self.latencies[j] = done - self.arrived_s[j]
        self._seq += 1
        heapq.heappush(self.running, (done, self._seq, seconds, batch))

    def _finished(self, batch: list[int], seconds: float) -> None:
        """A batch is answered: its instance is free, its pace is learned, its requests leave."""
        self.idle += 1
        self.pace.observe(len(batch), seconds)
        for _ in batch:
            self.arrivals.left(self.now)
