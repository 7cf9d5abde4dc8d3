"""The profiling harness batches as the gateway's batcher does: it decides with the simulated
batcher's rule (held to the batcher itself by ``tests/conformance``) on its clock, so it forms
the batches and refuses the requests that simulation does; full batches when requests wait, the
timeout bounds the wait for a batch to fill, requests that cannot be answered in time are
refused, and every request is accounted for in its window. The harness's threads run on virtual
time (``tests/rrl/thread_clock.py``): a scripted runtime takes exactly its seconds on that clock
and records the batches it is given, so no decision depends on how busy the machine is."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Mapping

import numpy as np
import pytest

from models.knobs import Knobs
from models.runtime import ModelMetadata, TensorSpec, Threads
from rrl.offline.batcher_sim import BatcherSim, BatchTimes
from rrl.offline.harness import ServingHarness, WindowResult, poisson_arrivals
from tests.rrl.thread_clock import ThreadClock


class Recorder:
    """A runtime that takes ``seconds`` of ``clock`` per batch and remembers the batch sizes."""

    def __init__(self, clock: ThreadClock, seconds: float) -> None:
        self.clock = clock
        self.seconds = seconds
        self.batches: list[int] = []
        self._lock = threading.Lock()

    @property
    def metadata(self) -> ModelMetadata:
        spec = TensorSpec("x", "float32", (-1, 2))
        return ModelMetadata("rec", "1", "test", (spec,), (spec,))

    @property
    def threads(self) -> Threads:
        return Threads(1, 1)

    @property
    def device(self) -> str:
        return "cpu"

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.clock.sleep(self.seconds)
        with self._lock:
            self.batches.append(len(inputs["x"]))
        return {"x": inputs["x"]}

    def close(self) -> None:
        pass


def _serve(runtimes: list[Recorder], arrivals: np.ndarray, **kwargs: float) -> list[WindowResult]:
    harness = ServingHarness(
        runtimes, {"x": np.zeros((64, 2), np.float32)}, clock=runtimes[0].clock
    )
    try:
        return harness.run(
            arrivals_s=arrivals,
            rows_per_request=1,
            window_edges_s=[0.0, float(arrivals[-1]) + 1e-3],
            **kwargs,  # type: ignore[arg-type]
        )
    finally:
        harness.close()


# One instance, no batch timeout, a 50 ms runtime call: the first request runs alone, the three
# that came while it ran leave together, then the four after them. With a 120 ms deadline the
# rule refuses the three (a batch of 3 rows, learned from one of 1, may take far longer) and two
# arrivals that even the fastest pace would answer late.
def _constant(seconds: float, rows: int) -> float:
    return seconds


TRACE = [0.0, 0.010, 0.020, 0.030, 0.065, 0.070, 0.075, 0.080, 0.30, 0.31, 0.45]


@pytest.mark.parametrize("slo_s", [5.0, 0.12])
def test_the_harness_decides_as_the_simulated_batcher_does(slo_s: float) -> None:
    knobs = Knobs(max_batch_size=8, batch_timeout_ms=0.0, concurrency=1)
    outcomes = set()
    for seconds in (0.045, 0.05, 0.055, 0.06):
        sim = BatcherSim(knobs, BatchTimes(functools.partial(_constant, seconds)), slo_s=slo_s)
        latencies = sim.run(TRACE)
        rows = tuple(r for _, r in sim.batches)
        outcomes.add((rows, sum(1 for x in latencies if x == math.inf)))
    # One outcome for call times around 50 ms: no decision of this trace sits near a threshold,
    # where the harness's sums on its clock (times from its origin) could round the other way.
    ((batches, refused),) = outcomes
    sim = BatcherSim(knobs, BatchTimes(functools.partial(_constant, 0.05)), slo_s=slo_s)
    answered_ms = np.array([x for x in sim.run(TRACE) if x != math.inf]) * 1000.0
    rt = Recorder(ThreadClock(), 0.05)
    (w,) = _serve([rt], np.array(TRACE), max_batch_size=8, batch_timeout_s=0.0, slo_s=slo_s)
    assert tuple(rt.batches) == batches
    assert (w.completed, w.rejected) == (len(TRACE) - refused, refused)
    # On the same clock the answers come when the simulation says, to the microsecond.
    assert w.mean_ms == pytest.approx(answered_ms.mean(), abs=1e-3)
    assert w.p99_ms == pytest.approx(np.percentile(answered_ms, 99), abs=1e-3)
    if slo_s == 5.0:
        assert batches == (1, 3, 4, 1, 1, 1)


def test_waiting_requests_leave_in_full_batches() -> None:
    rt = Recorder(ThreadClock(), 0.02)
    (w,) = _serve([rt], np.zeros(8), max_batch_size=4, batch_timeout_s=0.0, slo_s=5.0)
    assert rt.batches == [4, 4]
    assert (w.offered, w.completed, w.violations, w.rejected) == (8, 8, 0, 0)
    assert w.mean_batch_rows == 4


def test_the_timeout_bounds_the_wait_for_a_batch_to_fill() -> None:
    # One request every 100 ms, batches of up to 8, a 350 ms timeout: each batch holds the first
    # request and the three that arrive within 350 ms of it.
    rt = Recorder(ThreadClock(), 0.0)
    arrivals = np.arange(12) * 0.1
    _serve([rt], arrivals, max_batch_size=8, batch_timeout_s=0.35, slo_s=5.0)
    assert rt.batches == [4, 4, 4]
    rt = Recorder(ThreadClock(), 0.0)
    _serve([rt], arrivals, max_batch_size=8, batch_timeout_s=0.0, slo_s=5.0)
    assert rt.batches == [1] * 12  # no timeout: nobody waits for company


def test_requests_past_their_deadline_are_refused_not_served() -> None:
    rt = Recorder(ThreadClock(), 0.4)  # the deadline passes 350 ms before the first batch ends
    (w,) = _serve([rt], np.zeros(4), max_batch_size=1, batch_timeout_s=0.0, slo_s=0.05)
    assert rt.batches == [1]  # the others expired while the first one computed
    assert (w.completed, w.rejected, w.violations) == (1, 3, 4)  # the served one was late too


def test_instances_run_batches_in_parallel() -> None:
    clock = ThreadClock()
    rts = [Recorder(clock, 0.05), Recorder(clock, 0.05)]
    (w,) = _serve(rts, np.zeros(4), max_batch_size=2, batch_timeout_s=0.0, slo_s=5.0)
    assert rts[0].batches == rts[1].batches == [2]
    assert w.completed == 4


def test_poisson_arrivals() -> None:
    a = poisson_arrivals(1000.0, 2.0, np.random.default_rng(0))
    assert np.all(np.diff(a) > 0) and a[-1] < 2.0
    assert abs(len(a) - 2000) < 5 * np.sqrt(2000)
