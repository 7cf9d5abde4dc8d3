"""The profiling harness batches like the gateway's batcher: full batches when requests wait, the
timeout bounds the wait for a batch to fill, requests past their deadline are dropped, and every
request is accounted for in its window. A scripted runtime records the batches it is given."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from models.runtime import ModelMetadata, TensorSpec, Threads
from rrl.offline.harness import ServingHarness, WindowResult, poisson_arrivals


class Recorder:
    """A runtime that takes ``seconds`` per batch and remembers the batch sizes."""

    def __init__(self, seconds: float) -> None:
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
        time.sleep(self.seconds)
        with self._lock:
            self.batches.append(len(inputs["x"]))
        return {"x": inputs["x"]}

    def close(self) -> None:
        pass


def _serve(runtimes: list[Recorder], arrivals: np.ndarray, **kwargs: float) -> list[WindowResult]:
    harness = ServingHarness(runtimes, {"x": np.zeros((64, 2), np.float32)})
    try:
        return harness.run(
            arrivals_s=arrivals,
            rows_per_request=1,
            window_edges_s=[0.0, float(arrivals[-1]) + 1e-3],
            **kwargs,  # type: ignore[arg-type]
        )
    finally:
        harness.close()


def test_waiting_requests_leave_in_full_batches() -> None:
    rt = Recorder(0.02)
    (w,) = _serve([rt], np.zeros(8), max_batch_size=4, batch_timeout_s=0.0, slo_s=5.0)
    assert rt.batches == [4, 4]
    assert (w.offered, w.completed, w.violations, w.rejected) == (8, 8, 0, 0)
    assert w.mean_batch_rows == 4


def test_the_timeout_bounds_the_wait_for_a_batch_to_fill() -> None:
    # One request every 100 ms, batches of up to 8, a 350 ms timeout: each batch holds the first
    # request and the three that arrive within 350 ms of it (50 ms from either edge, so a busy
    # machine waking the dispatcher late does not move a request across it).
    rt = Recorder(0.0)
    arrivals = np.arange(12) * 0.1
    _serve([rt], arrivals, max_batch_size=8, batch_timeout_s=0.35, slo_s=5.0)
    assert rt.batches == [4, 4, 4]
    rt = Recorder(0.0)
    _serve([rt], arrivals, max_batch_size=8, batch_timeout_s=0.0, slo_s=5.0)
    assert rt.batches == [1] * 12  # no timeout: nobody waits for company


def test_requests_past_their_deadline_are_dropped_not_served() -> None:
    rt = Recorder(0.4)  # the deadline passes 350 ms before the first batch is done
    (w,) = _serve([rt], np.zeros(4), max_batch_size=1, batch_timeout_s=0.0, slo_s=0.05)
    assert rt.batches == [1]  # the others expired while the first one computed
    assert (w.completed, w.rejected, w.violations) == (1, 3, 4)  # the served one was late too


def test_instances_run_batches_in_parallel() -> None:
    rts = [Recorder(0.05), Recorder(0.05)]
    (w,) = _serve(rts, np.zeros(4), max_batch_size=2, batch_timeout_s=0.0, slo_s=5.0)
    assert rts[0].batches == rts[1].batches == [2]
    assert w.completed == 4


def test_poisson_arrivals() -> None:
    a = poisson_arrivals(1000.0, 2.0, np.random.default_rng(0))
    assert np.all(np.diff(a) > 0) and a[-1] < 2.0
    assert abs(len(a) - 2000) < 5 * np.sqrt(2000)
