"""The event loop's CPU per request, as the tuner's queueing model reads it: nothing until enough
requests have arrived, then the loop thread's CPU over them; read from another thread, the last
value; the loop's fixed work per second told apart from its work per request when the recent
stretches' rates differ enough, the lowest CPU per request otherwise; on a real gateway service,
requests that reach a model are counted and the cost is read from the loop's own thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from gateway.loop_meter import STRETCHES, LoopMeter, Stretch, per_request_cost
from gateway.metrics import GatewayMetrics
from gateway.service import InferenceService
from gateway.tuning import AgentControl
from gateway.types import InferenceRequest
from models.repository import scan_repository


def test_the_estimate_moves_only_after_enough_requests() -> None:
    clock, wall, count = [0.0], [0.0], [0]
    meter = LoopMeter(
        lambda: count[0], min_requests=100, clock=lambda: clock[0], wall=lambda: wall[0]
    )
    assert meter.per_request_s() is None  # the first reading only starts a stretch
    clock[0], wall[0], count[0] = 0.5, 1.0, 99
    assert meter.per_request_s() is None  # 99 requests: not yet
    clock[0], wall[0], count[0] = 0.6, 1.0, 200
    assert meter.per_request_s() == 0.6 / 200
    clock[0], wall[0], count[0] = 0.7, 2.0, 210  # a quiet spell's timers: no new figure yet
    assert meter.per_request_s() == 0.6 / 200
    clock[0], wall[0], count[0] = 0.9, 3.0, 510  # cheaper per request than the first
    assert meter.per_request_s() == pytest.approx(0.3 / 310)

    from_elsewhere: list[float | None] = []
    clock[0], count[0] = 100.0, 10_000  # another thread's reading is not the loop's CPU
    worker = threading.Thread(target=lambda: from_elsewhere.append(meter.per_request_s()))
    worker.start()
    worker.join()
    assert from_elsewhere == [pytest.approx(0.3 / 310)]


LOOP_S = 0.0003
FIXED_S_PER_S = 0.075
"""sensor_mlp over HTTP: 0.3 ms of loop CPU per request, and 75 ms a second of work that does
not grow with requests (1.8 ms a request at 50 requests/s)."""


def _stretch(rate: float, seconds: float = 2.0, noise: float = 0.0) -> Stretch:
    n = round(rate * seconds)
    return Stretch((LOOP_S * n + FIXED_S_PER_S * seconds) * (1 + noise), seconds, n)


def test_the_loops_fixed_work_is_told_apart_from_its_work_per_request() -> None:
    # A diurnal night then a morning: the fit's intercept is the cost per request.
    rng = np.random.default_rng(0)
    mixed = [_stretch(r, noise=rng.normal(0, 0.03)) for r in (60, 90, 150, 400, 700, 650)]
    assert per_request_cost(mixed) == pytest.approx(LOOP_S, rel=0.15)
    # The lowest CPU per request of the same stretches still carries fixed work.
    assert min(s.cpu_s / s.requests for s in mixed) > 1.3 * LOOP_S
    # A night alone (rates within 2x): the upper bound, the lowest CPU per request.
    night = [_stretch(r) for r in (60, 80, 100, 110)]
    assert per_request_cost(night) == pytest.approx(LOOP_S + FIXED_S_PER_S / 110)
    # Too few stretches to fit, and none at all.
    first = mixed[:3]
    assert per_request_cost(first) == pytest.approx(min(s.cpu_s / s.requests for s in first))
    assert per_request_cost([]) is None


def test_a_fit_bent_by_noise_falls_back_to_the_upper_bound() -> None:
    # Busier stretches costing more per request: no fixed work can be seen, keep the bound.
    bent = [Stretch(0.0003 * 100, 1.0, 100), Stretch(0.0003 * 100, 0.5, 100)]
    bent += [Stretch(0.0006 * 400, 0.5, 400), Stretch(0.0006 * 800, 0.5, 800)]
    assert per_request_cost(bent) == pytest.approx(0.0003)


def test_the_loops_cost_per_batch_is_netted_out_of_its_cost_per_request() -> None:
    # 0.2 ms a request and 0.3 ms a batch: batches of 1 read 0.5 ms a request, batches of 32
    # about 0.21; netted of the batches each stretch ran, both read the request's own 0.2.
    clock, wall, count, batches = [0.0], [0.0], [0], [0]
    meter = LoopMeter(
        lambda: count[0],
        lambda: batches[0],
        min_requests=100,
        clock=lambda: clock[0],
        wall=lambda: wall[0],
    )
    meter.per_request_s()
    for rows in (1, 32):
        n = 3200
        clock[0] += 0.0002 * n + 0.0003 * (n // rows)
        wall[0] += 1.0
        count[0] += n
        batches[0] += n // rows
        meter.per_request_s()
    assert meter.per_request_s() == pytest.approx(0.0002 + 0.0003 / 32)  # the bound, gross
    assert meter.per_request_s(0.0003) == pytest.approx(0.0002)
    assert meter.per_request_s(0.01) == 0.0  # a per-batch cost beyond all the loop spent


def test_the_meter_fits_over_its_recent_stretches() -> None:
    clock, wall, count = [0.0], [0.0], [0]
    meter = LoopMeter(
        lambda: count[0], min_requests=100, clock=lambda: clock[0], wall=lambda: wall[0]
    )
    meter.per_request_s()
    for rate in (60, 90, 150, 400, 700, 650):
        s = _stretch(rate)
        clock[0], wall[0], count[0] = clock[0] + s.cpu_s, wall[0] + s.wall_s, count[0] + s.requests
        meter.per_request_s()
    assert meter.per_request_s() == pytest.approx(LOOP_S, rel=0.01)
    # Only the last STRETCHES count: a long steady spell at another cost replaces them.
    for _ in range(STRETCHES):
        clock[0], wall[0], count[0] = clock[0] + 1.0, wall[0] + 1.0, count[0] + 100
        meter.per_request_s()
    assert meter.per_request_s() == pytest.approx(0.01)


async def test_a_gateway_reports_its_loop_cost_per_request(mlp_repo: Path) -> None:
    executor = ThreadPoolExecutor(2)
    service = InferenceService(executor=executor, metrics=GatewayMetrics())
    service.registry.add_versions(scan_repository(mlp_repo))
    await service.registry.load_all()
    control = AgentControl(service)
    try:
        assert control.front_end_s() is None
        x = np.zeros((1, 32), dtype=np.float32)
        request = InferenceRequest("sensor_mlp", {"features": x}, timeout_s=30.0)
        for _ in range(3):
            await asyncio.gather(*(service.infer(request, transport="test") for _ in range(150)))
        host = service.registry.host("sensor_mlp")
        assert host.arrived_total == 450
        assert 0 < host.batches_total <= 450
        cost = control.front_end_s()
        assert cost is not None and cost > 0.0
        # Netted of a cost per batch, by the batches the gateway counted: less per request.
        net = control.front_end_s(cost / 4)
        assert net is not None and net < cost
    finally:
        await service.registry.close()
        executor.shutdown()
