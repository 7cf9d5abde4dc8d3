"""A batcher-like open-loop serving harness around real runtime sessions, for profiling.

It serves one model the way the gateway's batcher does, minus the transport: ``concurrency``
runtime instances (one worker thread each, as the gateway runs one batch per instance on its
executor); a dispatcher that takes an idle instance, waits at most ``batch_timeout`` from the
oldest waiting request's arrival for ``max_batch_size`` rows, drops requests whose deadline (the
SLO) has passed when the batch is taken, and hands the batch over. Arrivals are a Poisson process
scheduled in advance (open loop), so a slow configuration builds a queue instead of slowing the
clients down, and latency is measured from each request's *scheduled* arrival, which leaves no
room for coordinated omission.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from models.runtime import Runtime

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


class ServingHarness:
    """Owns the instances' worker threads; ``run`` serves one scheduled arrival sequence."""

    def __init__(self, runtimes: Sequence[Runtime], inputs: Mapping[str, np.ndarray]) -> None:
        self._runtimes = list(runtimes)
        self._inputs = dict(inputs)  # at least max_batch_size rows of every input
        self._jobs: list[queue.SimpleQueue[tuple[int, int] | None]] = [
            queue.SimpleQueue() for _ in self._runtimes
        ]
        self._idle: queue.SimpleQueue[int] = queue.SimpleQueue()
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
        for i, t in enumerate(self._threads):
            t.start()
            self._idle.put(i)

    def close(self) -> None:
        for q in self._jobs:
            q.put(_STOP)
        for t in self._threads:
            t.join()

    def _work(self, index: int) -> None:
        runtime = self._runtimes[index]
        jobs = self._jobs[index]
        while (job := jobs.get()) is not _STOP:
            first, end = job
            rows = (end - first) * self._rows_per_request
            try:
                runtime.infer({name: arr[:rows] for name, arr in self._inputs.items()})
            except BaseException as exc:  # surfaced by run(); the instance stays usable
                self._error = exc
            self._done[first:end] = time.perf_counter()
            self._batch_rows.append(rows)
            self._idle.put(index)

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
        warm-up). Returns once every request is answered or dropped."""
        n = len(arrivals_s)
        self._done = np.full(n, np.nan)
        self._batch_rows = []
        self._rows_per_request = rows_per_request
        self._error = None
        per_batch = max(1, max_batch_size // rows_per_request)  # requests per batch
        rejected = np.zeros(n, dtype=bool)
        start = time.perf_counter() + 0.005
        arrive = start + arrivals_s
        cpu_marks = _CpuSampler(start + np.asarray(window_edges_s))
        cpu_marks.start()
        nxt = 0
        while nxt < n:
            worker = self._idle.get()  # an idle instance first, as the gateway's batcher does
            _sleep_until(arrive[nxt])
            _sleep_until(min(arrive[nxt] + batch_timeout_s, _at(arrive, nxt + per_batch - 1)))
            now = time.perf_counter()
            expired = int(np.searchsorted(arrive, now - slo_s, side="right"))
            if expired > nxt:  # their deadline passed while they waited: refused, not served
                rejected[nxt:expired] = True
                nxt = expired
            end = min(int(np.searchsorted(arrive, now, side="right")), nxt + per_batch, n)
            if end <= nxt:
                self._idle.put(worker)
                continue
            self._jobs[worker].put((nxt, end))
            nxt = end
        self._wait_idle()
        cpu_marks.join()
        if self._error is not None:
            raise self._error
        latency_ms = (self._done - arrive) * 1000.0
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

    def _wait_idle(self) -> None:
        """Until every instance is idle again (each one's token back in the idle queue)."""
        for _ in self._runtimes:
            self._idle.get()
        for i in range(len(self._runtimes)):
            self._idle.put(i)


class _CpuSampler(threading.Thread):
    """Reads this process's CPU time at each window edge (the dispatcher may be blocked then)."""

    def __init__(self, at: np.ndarray) -> None:
        super().__init__(name="profile-cpu", daemon=True)
        self._at = at
        self.cpu: list[float] = []

    def run(self) -> None:
        for t in self._at:
            _sleep_until(float(t))
            self.cpu.append(time.process_time())


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


def _at(values: np.ndarray, index: int) -> float:
    return float(values[index]) if index < len(values) else float("inf")


def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
