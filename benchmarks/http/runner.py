"""The limit the gateway is held to: the same runtime (``models.backends.load_runtime``) called
in this process, no gateway, flat out."""

from __future__ import annotations

import threading
import time

import numpy as np

from benchmarks.common import machine_busy_seconds
from benchmarks.http.workload import Model


class InprocessRunner:
    """``instances`` sessions of one model with ``intra`` intra-op threads each, run flat out
    from as many Python threads (ONNX Runtime releases the GIL while it computes)."""

    def __init__(self, model: Model, intra: int, instances: int) -> None:
        from models.backends import load_runtime
        from models.runtime import Threads

        self.model = model
        self.intra = intra
        self.runtimes = [load_runtime(model.version, Threads(intra, 1)) for _ in range(instances)]

    def rows_per_s(
        self, inputs: dict[str, np.ndarray], duration_s: float
    ) -> tuple[float, float, float | None]:
        """(rows/s, CPU cores this process used meanwhile, CPU cores other processes used
        meanwhile). Every instance runs at least one batch; the window ends when the last batch
        ends."""
        rows = next(iter(inputs.values())).shape[0]
        n = len(self.runtimes)
        counts = [0] * n
        ends = [0.0] * n
        barrier = threading.Barrier(n + 1)
        start_box: list[float] = []

        def work(i: int) -> None:
            rt = self.runtimes[i]
            barrier.wait()
            until = start_box[0] + duration_s
            calls = 0
            while True:
                rt.infer(inputs)
                calls += 1
                now = time.perf_counter()
                if now >= until:
                    break
            counts[i] = calls
            ends[i] = now

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        busy0 = machine_busy_seconds()
        cpu0 = time.process_time()
        start_box.append(time.perf_counter())
        barrier.wait()
        for t in threads:
            t.join()
        cpu1 = time.process_time()
        busy1 = machine_busy_seconds()
        elapsed = max(ends) - start_box[0]
        used = (cpu1 - cpu0) / elapsed
        others = None
        if busy0 is not None and busy1 is not None:
            others = max(0.0, (busy1 - busy0) / elapsed - used)
        return sum(counts) * rows / elapsed, used, others

    def call_latencies(self, inputs: dict[str, np.ndarray], count: int) -> list[float]:
        """Seconds of each of ``count`` back-to-back calls on the first instance."""
        rt = self.runtimes[0]
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            rt.infer(inputs)
            out.append(time.perf_counter() - t0)
        return out

    def close(self) -> None:
        for rt in self.runtimes:
            rt.close()
