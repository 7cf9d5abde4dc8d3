"""Service times for the trace replay (``benchmarks.tuner.replay``), measured in the same run as
the arms.

Per thread setting (concurrency c, intra-op threads t), c ONNX Runtime sessions of the model with
t threads each run batches of every size back to back from c Python threads at once, so the
contention between instances is in every sample. The gateway's own costs are then calibrated
from the CPU measured on the capacity ramps (``scenarios``; ``cpu``), the model alone on the
gateway:

- the **event loop** (the gateway's main thread) does every request's decoding and reply and
  every batch's forming, crossing and fan-out, serially. On the batch-1 ramp each request is its
  own batch; on the max ramp (eager batching) a batch carries several. Its CPU per request on
  each ramp, ``loop = per_request + per_batch x batches/request``, is two equations for the two
  costs;
- the **other processes** of the bench (the load generator, the broker over MQTT) take
  ``background_s`` CPU per request on the same cores.

Earlier the costs were inferred from the capacities alone and charged in parallel on each
instance, so four instances looked like four front ends: on sensor_mlp the replay preferred 4
instances x batch 8, which measured 25.2 ms p95 over MQTT against the expert default's 10.6 (one
loop serves them all).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.tuner.cpu import CpuUse
from rrl.offline.replay import ServiceTimes, ThreadSetting


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


@dataclass(frozen=True)
class Costs(ServiceTimes):
    """Service times and the gateway's costs as ``benchmarks.tuner.replay`` charges them:
    ``per_request_s`` and ``per_batch_s`` are CPU-seconds on the one event-loop thread;
    ``background_s`` is CPU per request of the bench's other processes on the same cores."""

    background_s: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return {**super().as_dict(), "background_ms": round(self.background_s * 1e3, 4)}


MIN_BATCH_SPREAD = 0.2
"""Batches per request must differ this much between the two ramps for the loop's cost to be
split into per request and per batch; else it is all charged per request."""


def calibrate(
    samples: dict[ThreadSetting, dict[int, list[float]]],
    cpu: dict[str, CpuUse],
    batch1: tuple[float, ThreadSetting] | None = None,
) -> Costs:
    """The loop's CPU per request and per batch, from its CPU on the two ramps (see the
    module docstring), and the other processes' CPU per request.

    ``batch1``: the batch-1 ramp's capacity (requests/s) and the thread setting it ran. Batch 1
    measured a third of what the loop's CPU allows (1,089/s against 3,100/s for sensor_mlp on
    2 cores): each batch also holds the serial path for wall time that is no CPU (the crossing
    to the executor and back, its wake-ups, the interpreter lock). What the capacity leaves
    unexplained by the loop's CPU per request and the batch's own inference is charged per
    batch, so that the replay's batch 1 saturates where the gateway's did."""
    one, top = cpu["batch1"], cpu["max"]
    loop1, loop_top = one.per_request(one.loop_s), top.per_request(top.loop_s)
    beta1, beta_top = one.batches / max(one.requests, 1), top.batches / max(top.requests, 1)
    per_batch = 0.0
    if beta1 - beta_top >= MIN_BATCH_SPREAD:
        per_batch = max(0.0, (loop1 - loop_top) / (beta1 - beta_top))
    per_request = max(0.0, loop1 - per_batch * beta1)
    if per_request == 0.0 and beta1 > 0:
        per_batch = loop1 / beta1
    if batch1 is not None and batch1[0] > 0 and batch1[1] in samples:
        capacity, (c, _) = batch1
        inference = float(np.median(samples[batch1[1]][min(samples[batch1[1]])])) / c
        per_batch = max(per_batch, 1.0 / capacity - per_request - inference)
    background = (one.others_s + top.others_s) / max(one.requests + top.requests, 1)
    return Costs(samples, per_batch_s=per_batch, per_request_s=per_request, background_s=background)
