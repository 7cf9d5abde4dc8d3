"""Service times for the trace replay (``rrl.replay``), measured in the same run as the arms.

Per thread setting (concurrency c, intra-op threads t), c ONNX Runtime sessions of the model with
t threads each run batches of every size back to back from c Python threads at once, so the
contention between instances is in every sample. The gateway's own costs are then calibrated
from the capacities measured through it on the ramp (``scenarios``), seen as CPU on the shared
cores (``benchmarks.tuner.replay``):

- ``per_request_s``: CPU-seconds per request of everything but inference (HTTP or MQTT, decoding,
  the reply, the load generator): at the max capacity the cores are saturated, so
  ``cores / max = per_request + inference CPU per request`` of the expert default's instances
  at its largest batch (wall time x the cores its threads occupy, over the rows);
- ``per_batch_s`` (when the batch-1 capacity was measured): at batch 1 the instances are the
  bottleneck, each busy for ``c / batch1`` per batch, of which ``s_c(1)`` slowed by the front
  end's share of the cores is inference; the rest is the gateway's cost per batch.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from rrl.replay import ServiceTimes, ThreadSetting
from rrl.space import Config


def measure_samples(
    repo: Path,
    model: str,
    settings: list[ThreadSetting],
    batch_sizes: list[int],
    *,
    seconds_per_cell: float,
) -> dict[ThreadSetting, dict[int, list[float]]]:
    from models.backends import load_runtime
    from models.repository import ModelVersion, scan_repository
    from models.runtime import Threads

    (version,) = [v for v in scan_repository(repo) if v.name == model]
    assert isinstance(version, ModelVersion), version
    out: dict[ThreadSetting, dict[int, list[float]]] = {}
    for c, intra in settings:
        runtimes = [load_runtime(version, Threads(intra, 1)) for _ in range(c)]
        try:
            (spec,) = runtimes[0].metadata.inputs
            rng = np.random.default_rng(0)
            out[(c, intra)] = {}
            for b in batch_sizes:
                inputs = {spec.name: rng.standard_normal((b, *spec.shape[1:])).astype(np.float32)}
                for rt in runtimes:  # warm: first calls allocate
                    rt.infer(inputs)
                out[(c, intra)][b] = _concurrent_calls(runtimes, inputs, seconds_per_cell)
        finally:
            for rt in runtimes:
                rt.close()
    return out


def _concurrent_calls(runtimes: list, inputs: dict, seconds: float) -> list[float]:
    """Per-call seconds of every session calling back to back at once (at least 3 calls each)."""
    samples: list[list[float]] = [[] for _ in runtimes]
    barrier = threading.Barrier(len(runtimes))

    def work(i: int) -> None:
        barrier.wait()
        until = time.perf_counter() + seconds
        while len(samples[i]) < 3 or time.perf_counter() < until:
            t0 = time.perf_counter()
            runtimes[i].infer(inputs)
            samples[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(runtimes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [s for per in samples for s in per]


def calibrate(
    samples: dict[ThreadSetting, dict[int, list[float]]],
    expert: Config,
    capacity_rps: dict[str, float],
    cores: int,
) -> ServiceTimes:
    """The gateway's per-request CPU and per-batch costs from the measured capacities (see the
    module docstring)."""
    setting = (expert.concurrency, expert.intra_op_threads)
    raw = ServiceTimes(samples)
    b = expert.max_batch_size
    c, t = setting
    occupied = min(c * t, cores)  # cores the instances' threads hold while all are busy
    inference_cpu = raw.median_s(setting, b) * occupied / (b * c)
    per_request = max(0.0, cores / capacity_rps["max"] - inference_cpu)
    per_batch = 0.0
    if capacity_rps.get("batch1"):
        s1 = raw.median_s(setting, 1) / max(1.0, c * t / cores)
        front_end = capacity_rps["batch1"] * per_request
        speed = min(1.0, cores / (c * t + front_end))
        per_batch = max(0.0, c / capacity_rps["batch1"] - s1 / speed)
    return ServiceTimes(samples, per_batch_s=per_batch, per_request_s=per_request)
