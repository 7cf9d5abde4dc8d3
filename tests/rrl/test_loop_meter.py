"""The event loop's CPU per request, as the tuner's queueing model reads it: nothing until enough
requests have arrived, then the loop thread's CPU over them; read from another thread, the last
value; on a real gateway service, requests that reach a model are counted and the cost is read
from the loop's own thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gateway.loop_meter import LoopMeter
from gateway.metrics import GatewayMetrics
from gateway.service import InferenceService
from gateway.tuning import TunedService
from gateway.types import InferenceRequest
from models.repository import scan_repository
from rrl.control import front_end_s


def test_the_estimate_moves_only_after_enough_requests() -> None:
    clock, count = [0.0], [0]
    meter = LoopMeter(lambda: count[0], min_requests=100, clock=lambda: clock[0])
    assert meter.per_request_s() is None  # the first reading only starts a stretch
    clock[0], count[0] = 0.5, 99
    assert meter.per_request_s() is None  # 99 requests: not yet
    clock[0], count[0] = 0.6, 200
    assert meter.per_request_s() == 0.6 / 200
    clock[0], count[0] = 5.0, 210  # a quiet spell's timers: no new figure yet
    assert meter.per_request_s() == 0.6 / 200
    clock[0], count[0] = 5.1, 310  # a slow stretch: the loop's fixed work over few requests
    assert meter.per_request_s() == 0.6 / 200
    clock[0], count[0] = 5.2, 510  # a busy one, cheaper per request than the first
    assert meter.per_request_s() == pytest.approx(0.1 / 200)

    from_elsewhere: list[float | None] = []
    clock[0], count[0] = 100.0, 10_000  # another thread's reading is not the loop's CPU
    worker = threading.Thread(target=lambda: from_elsewhere.append(meter.per_request_s()))
    worker.start()
    worker.join()
    assert from_elsewhere == [pytest.approx(0.1 / 200)]
    # Only the last few stretches count: old figures age out.
    for k in range(1, 9):
        clock[0], count[0] = 5.2 + k, 510 + 100 * k  # 10 ms a request
        meter.per_request_s()
    assert meter.per_request_s() == pytest.approx(1.0 / 100)


async def test_a_gateway_reports_its_loop_cost_per_request(mlp_repo: Path) -> None:
    executor = ThreadPoolExecutor(2)
    service = InferenceService(executor=executor, metrics=GatewayMetrics())
    service.add_versions(scan_repository(mlp_repo))
    await service.load_all()
    control = TunedService(service)
    try:
        assert front_end_s(control) is None
        x = np.zeros((1, 32), dtype=np.float32)
        request = InferenceRequest("sensor_mlp", {"features": x}, timeout_s=30.0)
        for _ in range(3):
            await asyncio.gather(*(service.infer(request, transport="test") for _ in range(150)))
        assert service.host("sensor_mlp").arrived_total == 450
        cost = front_end_s(control)
        assert cost is not None and cost > 0.0
    finally:
        await service.close()
        executor.shutdown()
