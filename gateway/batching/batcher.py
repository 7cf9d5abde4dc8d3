"""The one batching primitive: a bounded queue of (request, future, deadline) per model version.

A dispatch loop takes an idle runtime instance, waits at most ``batch_timeout`` (counted from the
arrival of the oldest waiting request) for ``max_batch_size`` rows, but not while fewer than one
more request is expected in what is left of that window (``models.batching_rule``: a lone
closed-loop client is served at once), runs the batch off the event loop, and fans the outputs
(or the error) back to every caller. Knobs are read once per batch, so they can change at any
moment. A request that cannot meet its deadline is refused rather than served late: at once when
even the fastest recent pace cannot serve it, else when its batch starts and the recent pace of
such batches would end past its deadline. A full queue is refused with a retry hint.

Two guards keep a model serving through faults: the watchdog (``gateway.batching.watchdog``) runs
each batch's runtime call and gives up on one that does not return in time (504), whose instance
the pool abandons; and a supervisor restarts the dispatch loop if a bug kills it, with every
queued request kept.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from gateway.batching.admission import Admission
from gateway.batching.instances import Instance, InstancePool
from gateway.batching.watchdog import CallWatchdog, Outputs
from gateway.errors import (
    DeadlineUnmeetable,
    GatewayError,
    InternalError,
)
from models.batching_rule import AnswerLag, ArrivalEstimate, ServiceTimeEstimate
from models.knobs import Knobs

log = logging.getLogger("gateway.batcher")

DEFAULT_PRIORITY_LEVEL = 5
# Bounds the scan for requests that fit a batch, so forming one stays cheap with a long queue.
_MAX_SKIPPED_PER_BATCH = 64
# Pause before restarting a dispatch loop that died, doubled while it keeps dying without
# dispatching a batch: a bug that fires on every iteration must not spin the event loop.
_RESTART_BACKOFF_S = (0.05, 5.0)


@dataclass(frozen=True, slots=True)
class Fill:
    """How a batch was formed: why it left (``full``; ``timeout``: ``batch_timeout`` ran out;
    ``no_arrival_expected``: an instance was free and waiting could not bring another request)
    and how long the dispatch loop waited for rows with an instance in hand."""

    trigger: Literal["full", "timeout", "no_arrival_expected"]
    waited_s: float


@dataclass(slots=True)
class BatchRecord:
    """What one batch did, for metrics and the tuner."""

    rows: int
    requests: int
    queue_s: list[float]
    compute_s: float
    fill: Fill


@dataclass(order=True, slots=True)
class _Pending:
    sort_key: tuple[int, int]
    rows: int = field(compare=False)
    signature: tuple[tuple[int, ...], ...] = field(compare=False)
    inputs: dict[str, np.ndarray] = field(compare=False)
    deadline: float = field(compare=False)
    enqueued: float = field(compare=False)
    future: asyncio.Future[tuple[Outputs, float, float]] = field(compare=False)
    done_at: float = field(compare=False, default=0.0)  # when its batch's outputs came back


class Batcher:
    def __init__(
        self,
        *,
        name: str,
        pool: InstancePool,
        watchdog: CallWatchdog,
        knobs: Callable[[], Knobs],
        max_queue_size: int,
        on_batch: Callable[[BatchRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._pool = pool
        self._watchdog = watchdog
        self._knobs = knobs
        self.max_queue_size = max_queue_size
        self._on_batch = on_batch
        self._clock = clock
        self._heap: list[_Pending] = []
        self._queued_rows = 0
        self._seq = itertools.count()
        self._arrival = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._dispatched = 0  # batches launched: tells the supervisor a restarted loop works
        self.admission = Admission(name, clock)
        self.arrivals = ArrivalEstimate()

    @property
    def service_time(self) -> ServiceTimeEstimate:
        """The pace of recent batches, which admission plans with."""
        return self.admission.service_time

    @property
    def answer_lag(self) -> AnswerLag:
        return self.admission.answer_lag

    @property
    def queue_depth(self) -> int:
        return len(self._heap)

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._supervise(), name=f"batcher:{self.name}")

    async def stop(self) -> None:
        """Stop taking batches, let running ones finish, refuse what is still queued."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.refuse_queued(DeadlineUnmeetable(f"model {self.name} is shutting down"))

    def refuse_queued(self, error: GatewayError) -> None:
        """Fail every request still waiting in the queue with ``error``."""
        while self._heap:
            item = heapq.heappop(self._heap)
            if not item.future.done():
                item.future.set_exception(error)
        self._queued_rows = 0

    def check_arrival(self, *, rows: int, deadline: float) -> None:
        """Raise the refusal a request of ``rows`` arriving now with ``deadline`` would get
        (``Admission.check_arrival``), if it would be refused; nothing is queued."""
        self.admission.check_arrival(
            rows=rows,
            deadline=deadline,
            knobs=self._knobs(),
            queued=len(self._heap),
            queued_rows=self._queued_rows,
            max_queue_size=self.max_queue_size,
            busy=self._pool.busy,
            instances=self._pool.size,
        )

    async def submit(
        self,
        inputs: dict[str, np.ndarray],
        *,
        rows: int,
        deadline: float,
        priority: int = 0,
    ) -> tuple[Outputs, float, float]:
        """Queue one request; returns (outputs, queue seconds, compute seconds)."""
        self.check_arrival(rows=rows, deadline=deadline)
        now = self._clock()
        level = priority if priority > 0 else DEFAULT_PRIORITY_LEVEL
        future: asyncio.Future[tuple[Outputs, float, float]] = (
            asyncio.get_running_loop().create_future()
        )
        signature = tuple(arr.shape[1:] for arr in inputs.values())
        item = _Pending((level, next(self._seq)), rows, signature, inputs, deadline, now, future)
        heapq.heappush(self._heap, item)
        self._queued_rows += rows
        self.arrivals.arrived(now)
        self._arrival.set()
        try:
            result = await future
            self.answer_lag.observe(self._clock() - item.done_at)
            return result
        finally:
            self.arrivals.left(self._clock())

    def drain_time(self) -> float:
        """Seconds until the queue, as it stands, is worked off (at least 1): a retry hint."""
        return self.admission.drain_time(self._knobs(), self._queued_rows, self._pool.size)

    async def _supervise(self) -> None:
        """Run the dispatch loop; if a bug kills it, log that once and start it again. Without
        it every request queued on this model would wait until its client gave up. ``stop``
        cancels this task, which ends it for good."""
        backoff = _RESTART_BACKOFF_S[0]
        while True:
            dispatched = self._dispatched
            try:
                await self._dispatch_loop()
            except Exception:
                log.exception(
                    "model %s: the dispatch loop failed; restarting it in %.2f s with %d "
                    "request(s) queued",
                    self.name,
                    backoff,
                    len(self._heap),
                )
            if self._dispatched > dispatched:
                backoff = _RESTART_BACKOFF_S[0]
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _RESTART_BACKOFF_S[1])

    async def _dispatch_loop(self) -> None:
        while True:
            while not self._heap:
                self._arrival.clear()
                await self._arrival.wait()
            inst = await self._pool.acquire()
            batch: list[_Pending] = []
            try:
                knobs = self._knobs()  # read once per batch: changes apply from the next one
                batch, fill = await self._collect(knobs)
                if batch:
                    self._launch(inst, batch, fill)
            except BaseException:
                # Whatever went wrong, the requests taken go back to the queue: the restarted
                # loop (or ``stop``) answers them.
                self._requeue(batch)
                await self._pool.release(inst)
                raise
            if not batch:
                await self._pool.release(inst)

    def _launch(self, inst: Instance, batch: list[_Pending], fill: Fill) -> None:
        task = asyncio.create_task(self._run_batch(inst, batch, fill), name=f"batch:{self.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._dispatched += 1

    def _requeue(self, items: list[_Pending]) -> None:
        """Put taken requests back; their sort keys keep their places in line."""
        for item in items:
            if not item.future.done():
                heapq.heappush(self._heap, item)
                self._queued_rows += item.rows
        if items:
            self._arrival.set()

    async def _collect(self, knobs: Knobs) -> tuple[list[_Pending], Fill]:
        """Wait (an instance in hand) until the queue fills a batch or ``batch_timeout`` after
        the oldest request's arrival, but not while no other request is expected within what
        is left of that window: such a wait cannot fill the batch and only adds latency."""
        if not self._heap:
            return [], Fill("full", 0.0)
        waited = 0.0
        oldest = min(item.enqueued for item in self._heap)
        fill_deadline = oldest + knobs.batch_timeout_s
        trigger: Literal["full", "timeout", "no_arrival_expected"] = "full"
        while self._queued_rows < knobs.max_batch_size:
            now = self._clock()
            wait = fill_deadline - now
            if wait <= 0:
                trigger = "timeout"
                break
            if self.arrivals.expected(wait, now) < 1.0:
                trigger = "no_arrival_expected"
                break
            self._arrival.clear()
            try:
                await asyncio.wait_for(self._arrival.wait(), timeout=wait)
            except TimeoutError:
                trigger = "timeout"
                break
            finally:
                waited += self._clock() - now
        return self._take(knobs.max_batch_size), Fill(trigger, waited)

    def _take(self, max_rows: int) -> list[_Pending]:
        """Pop the most urgent requests that fit in one batch and share the head's shapes."""
        batch: list[_Pending] = []
        skipped: list[_Pending] = []
        rows = 0
        signature: tuple[tuple[int, ...], ...] | None = None
        now = self._clock()
        while self._heap:
            item = heapq.heappop(self._heap)
            if item.future.done():  # the caller went away (cancelled): nothing to compute
                self._queued_rows -= item.rows
                continue
            if signature is not None and (
                item.signature != signature or rows + item.rows > max_rows
            ):
                skipped.append(item)
                if rows >= max_rows or len(skipped) >= _MAX_SKIPPED_PER_BATCH:
                    break
                continue
            self._queued_rows -= item.rows
            if now >= item.deadline:
                item.future.set_exception(
                    DeadlineUnmeetable(
                        f"model {self.name}: deadline passed after "
                        f"{(now - item.enqueued) * 1e3:.1f} ms in the queue"
                    )
                )
                continue
            batch.append(item)
            rows += item.rows
            signature = item.signature
            if rows >= max_rows:
                break
        for item in skipped:
            heapq.heappush(self._heap, item)
        return self._refuse_late(batch, now, rows)

    def _refuse_late(self, batch: list[_Pending], now: float, rows: int) -> list[_Pending]:
        """Refuse (503 deadline, with a retry hint) the requests of a batch about to start that
        it would answer after their deadlines (``gateway.batching.admission``)."""
        # The other batches in flight: this one's instance is held already.
        finish = self.admission.answered_by(rows, now, self._pool.busy - 1) if batch else None
        if finish is None or all(item.deadline >= finish for item in batch):
            return batch
        kept = []
        for item in batch:
            if item.deadline >= finish:
                kept.append(item)
                continue
            item.future.set_exception(
                self.admission.late(rows, now, item.deadline, item.enqueued, self.drain_time())
            )
        return kept

    async def _run_batch(self, inst: Instance, batch: list[_Pending], fill: Fill) -> None:
        names = list(batch[0].inputs)
        if len(batch) == 1:
            inputs = batch[0].inputs
        else:
            inputs = {n: np.concatenate([item.inputs[n] for item in batch]) for n in names}
        rows = sum(item.rows for item in batch)
        started = self._clock()
        call = self._watchdog.start(inst.runtime.infer, inputs)
        abandoned = False
        try:
            result = await self._watchdog.wait(call)
            if result is None:
                abandoned = True
                self._pool.abandon(inst, call.done)
                self._fail(batch, self._watchdog.give_up(rows))
                return
        except Exception as exc:
            log.exception("model %s: batch of %d rows failed", self.name, rows)
            self._fail(batch, exc)
            return
        finally:
            if not abandoned:
                await self._pool.release(inst)
        outputs, infer_s = result
        self._fan_out(batch, outputs, started, rows, infer_s, fill)

    def _fail(self, batch: list[_Pending], exc: Exception) -> None:
        error = (
            exc
            if isinstance(exc, GatewayError)
            else InternalError(f"model {self.name}: inference failed: {exc}")
        )
        for item in batch:
            if not item.future.done():
                item.future.set_exception(error)

    def _fan_out(
        self,
        batch: list[_Pending],
        outputs: Outputs,
        started: float,
        rows: int,
        infer_s: float,
        fill: Fill,
    ) -> None:
        done = self._clock()
        compute = done - started
        # The call's own duration, not the wait for an executor thread (a session rebuild may
        # hold one): admission plans with what a batch costs.
        self.service_time.observe(rows, infer_s)
        queue_times: list[float] = []
        offset = 0
        for item in batch:
            part = {n: v[offset : offset + item.rows] for n, v in outputs.items()}
            offset += item.rows
            queue_s = started - item.enqueued
            queue_times.append(queue_s)
            item.done_at = done
            if not item.future.done():
                item.future.set_result((part, queue_s, compute))
        if self._on_batch is not None:
            self._on_batch(BatchRecord(rows, len(batch), queue_times, compute, fill))
