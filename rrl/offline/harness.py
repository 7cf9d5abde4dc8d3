"""An open-loop serving harness around real runtime sessions, for profiling: the gateway's
batching rule on the wall clock.

It serves one model as the gateway's batcher does, minus the transport: ``concurrency`` runtime
instances (one worker thread each, as the gateway runs one batch per instance on its executor),
and a dispatcher that decides with the batcher's own rule, ``rrl.offline.batcher_sim.BatcherSim``
(held to the gateway's ``Batcher`` by ``tests/conformance``): it takes an idle instance, waits
for a full batch until the oldest request has waited the batch timeout or no other request is
expected in time, refuses on arrival a request that even the fastest recent pace cannot answer
in time, and at a batch's start those it would answer late. Only its clock differs: the
dispatcher waits on the wall clock and on the instances' runtime calls instead of drawing batch
times. Arrivals are a Poisson process scheduled in advance (open loop), so a slow configuration
builds a queue instead of slowing the clients down, and latency is measured from each request's
*scheduled* arrival, which leaves no room for coordinated omission. The clock and the queues
between the threads are one seam (``rrl.offline.clock``): profiling runs on the wall clock,
tests on virtual time.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from models.knobs import Knobs
from models.runtime import Runtime
from rrl.offline.batcher_sim import BatcherSim, BatchTimes
from rrl.offline.clock import Channel, Clock, WallClock

_STOP = None


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One measurement window: what the requests that arrived in it experienced."""

    duration_s: float
    offered: int
    completed: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    violations: int
    rejected: int
    cpu_cores: float
    mean_batch_rows: float


@dataclass(frozen=True, slots=True)
class _Job:
    seq: int
    requests: np.ndarray  # indices into the trace


@dataclass(frozen=True, slots=True)
class _Done:
    seq: int
    instance: int
    seconds: float  # the runtime call's own duration, as the batcher times it


class ServingHarness:
    """Owns the instances' worker threads; ``run`` serves one scheduled arrival sequence."""

    def __init__(
        self,
        runtimes: Sequence[Runtime],
        inputs: Mapping[str, np.ndarray],
        clock: Clock | None = None,
    ) -> None:
        self._runtimes = list(runtimes)
        self._inputs = dict(inputs)  # at least max_batch_size rows of every input
        self._clock: Clock = clock or WallClock()
        self._jobs: list[Channel[_Job | None]] = [self._clock.channel() for _ in self._runtimes]
        self._returned: Channel[_Done] = self._clock.channel()
        self._done = np.zeros(0)
        self._batch_rows: list[int] = []
        self._rows_per_request = 1
        self._error: BaseException | None = None
        self.window_latencies: list[np.ndarray] = []
        """After ``run``: the answered requests' latencies (ms, sorted) of each window."""
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"instance-{i}", daemon=True)
            for i in range(len(self._runtimes))
        ]
        for t in self._threads:
            self._clock.thread_started()
            t.start()

    def close(self) -> None:
        for q in self._jobs:
            q.put(_STOP)
        for t in self._threads:
            t.join()

    def _work(self, index: int) -> None:
        try:
            self._serve(index)
        finally:
            self._clock.thread_ended()

    def _serve(self, index: int) -> None:
        runtime = self._runtimes[index]
        jobs = self._jobs[index]
        while (job := jobs.get()) is not _STOP:
            rows = len(job.requests) * self._rows_per_request
            began = self._clock.now()
            try:
                runtime.infer({name: arr[:rows] for name, arr in self._inputs.items()})
            except BaseException as exc:  # surfaced by run(); the instance stays usable
                self._error = exc
            ended = self._clock.now()
            self._done[job.requests] = ended
            self._batch_rows.append(rows)
            self._returned.put(_Done(job.seq, index, ended - began))

    def run(
        self,
        *,
        max_batch_size: int,
        batch_timeout_s: float,
        arrivals_s: np.ndarray,
        rows_per_request: int,
        slo_s: float,
        window_edges_s: Sequence[float],
    ) -> list[WindowResult]:
        """Serve requests arriving at ``arrivals_s`` (seconds from the start, sorted) and report
        the windows between consecutive ``window_edges_s`` (requests before the first edge are
        warm-up). A batch holds at most ``max_batch_size`` rows, so
        ``max_batch_size // rows_per_request`` requests (the rule counts requests). Returns once
        every request is answered or refused."""
        n = len(arrivals_s)
        self._done = np.full(n, np.nan)
        self._batch_rows = []
        self._rows_per_request = rows_per_request
        self._error = None
        start = self._clock.now() + 0.005
        knobs = Knobs(
            max_batch_size=max(1, max_batch_size // rows_per_request),
            batch_timeout_ms=batch_timeout_s * 1000.0,
            concurrency=len(self._runtimes),
            intra_op_threads=1,  # the rule reads neither thread count
            inter_op_threads=1,
        )
        cpu_marks = _CpuSampler(start + np.asarray(window_edges_s), self._clock)
        self._clock.thread_started()
        cpu_marks.start()
        dispatch = _ClockDispatch(knobs, slo_s, self._clock, start, self._jobs, self._returned)
        dispatch.run(arrivals_s.tolist())
        # The sampler reads the last edge's CPU then; waiting for that time on the clock (not
        # only in join) lets a virtual clock move to it.
        self._clock.sleep_until(start + float(window_edges_s[-1]))
        cpu_marks.join()
        if self._error is not None:
            raise self._error
        arrive = start + arrivals_s
        latency_ms = (self._done - arrive) * 1000.0
        rejected = np.isnan(self._done)
        self.window_latencies = [
            np.sort(latency_ms[(arrivals_s >= lo) & (arrivals_s < hi) & ~rejected])
            for lo, hi in itertools.pairwise(window_edges_s)
        ]
        return _windows(
            arrivals_s,
            latency_ms,
            rejected,
            window_edges_s,
            cpu_marks.cpu,
            slo_s * 1000.0,
            float(np.mean(self._batch_rows)) if self._batch_rows else 0.0,
        )


def _no_draw(rows: int) -> float:
    raise AssertionError("the wall-clock dispatch runs its batches, it draws no times")


class _ClockDispatch(BatcherSim):
    """``BatcherSim``'s decisions, its clock the harness's (seconds since ``start``), its
    batches run by the harness's instances: a batch goes to an idle instance's queue, and the
    dispatcher waits for a runtime call to return or for its next arrival or timer, whichever
    comes first."""

    def __init__(
        self,
        config: Knobs,
        slo_s: float,
        clock: Clock,
        start: float,
        jobs: Sequence[Channel[_Job | None]],
        returned: Channel[_Done],
    ) -> None:
        super().__init__(config, BatchTimes(_no_draw), slo_s=slo_s)
        self._clock = clock
        self._origin = start
        self._jobs = jobs
        self._returned = returned
        self._idle_instances = list(range(len(jobs)))

    def _elapsed(self) -> float:
        return self._clock.now() - self._origin

    def _start(self, batch: list[int]) -> None:
        self._seq += 1
        self.batches.append((self.now, len(batch)))
        # The rule counts running batches by this list; their ends are unknown until they come.
        self.running.append((math.inf, self._seq, 0.0, batch))
        instance = self._idle_instances.pop()
        self._jobs[instance].put(_Job(self._seq, np.asarray(batch, dtype=np.intp)))

    def _advance(self, until: float) -> bool:
        if until == math.inf and not self.running:
            self.now = math.inf  # nothing left to arrive, wait for or run
            return False
        try:
            done = self._returned.get(self._origin + until)
        except queue.Empty:
            self.now = max(until, self._elapsed())
            return False
        self.now = self._elapsed()
        (entry,) = (e for e in self.running if e[1] == done.seq)
        self.running.remove(entry)
        batch = entry[3]
        self._idle_instances.append(done.instance)
        self._finished(batch, done.seconds)
        return True


class _CpuSampler(threading.Thread):
    """Reads this process's CPU time at each window edge (the dispatcher may be blocked then)."""

    def __init__(self, at: np.ndarray, clock: Clock) -> None:
        super().__init__(name="profile-cpu", daemon=True)
        self._at = at
        self._clock = clock
        self.cpu: list[float] = []

    def run(self) -> None:
        try:
            for t in self._at:
                self._clock.sleep_until(float(t))
                self.cpu.append(time.process_time())
        finally:
            self._clock.thread_ended()


def _windows(
    arrivals_s: np.ndarray,
    latency_ms: np.ndarray,
    rejected: np.ndarray,
    edges: Sequence[float],
    cpu: Sequence[float],
    slo_ms: float,
    mean_batch_rows: float,
) -> list[WindowResult]:
    out = []
    for k in range(len(edges) - 1):
        lo, hi = edges[k], edges[k + 1]
        mask = (arrivals_s >= lo) & (arrivals_s < hi)
        answered = latency_ms[mask & ~rejected]
        offered = int(mask.sum())
        refused = int((mask & rejected).sum())
        late = int((answered > slo_ms).sum())
        if answered.size:
            p50, p95, p99 = np.percentile(answered, [50, 95, 99]).tolist()
            mean = float(answered.mean())
        else:
            p50 = p95 = p99 = mean = float("nan")
        out.append(
            WindowResult(
                duration_s=hi - lo,
                offered=offered,
                completed=int(answered.size),
                p50_ms=p50,
                p95_ms=p95,
                p99_ms=p99,
                mean_ms=mean,
                violations=late + refused,
                rejected=refused,
                cpu_cores=(cpu[k + 1] - cpu[k]) / (hi - lo),
                mean_batch_rows=mean_batch_rows,
            )
        )
    return out


def poisson_arrivals(rate_per_s: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate_per_s`` over ``[0, duration_s)``."""
    expected = rate_per_s * duration_s
    gaps = rng.exponential(1.0 / rate_per_s, size=int(expected + 6 * np.sqrt(expected) + 16))
    times = np.cumsum(gaps)
    return times[times < duration_s]
