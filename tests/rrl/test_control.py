"""The control protocol against a real gateway service: the agent's control reads the knobs,
changes all five of them (the gateway applies them, threads included) and turns a window snapshot
into a measurement, with requests served throughout."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gateway.metrics import GatewayMetrics
from gateway.service import InferenceService
from gateway.tuning import AgentControl
from gateway.types import InferenceRequest
from models.knobs import Knobs
from models.repository import scan_repository
from rrl.agent.control import ModelControl, current_config, measure
from rrl.tuners.space import ConfigSpace


async def test_the_agents_control_sets_every_knob_while_requests_are_served(mlp_repo: Path) -> None:
    executor = ThreadPoolExecutor(8)
    service = InferenceService(executor=executor, metrics=GatewayMetrics())
    service.registry.add_versions(scan_repository(mlp_repo))
    await service.registry.load_all()
    control: ModelControl = AgentControl(service)
    space = ConfigSpace.for_machine(2)
    try:
        assert current_config(control, "sensor_mlp", space) == Knobs(32, 1.0, 1, 1, 1)

        async def one() -> None:
            # A generous deadline: a session rebuild on a busy machine may take longer than the
            # model's 100 ms SLO, which must not refuse requests in a test of the control path.
            x = np.zeros((1, 32), dtype=np.float32)
            request = InferenceRequest("sensor_mlp", {"features": x}, timeout_s=30.0)
            await service.infer(request, transport="test")

        target = Knobs(8, 0.0, 2, 2, 1)
        # Requests keep flowing while the threads change (instances rebuilt and swapped).
        traffic = asyncio.gather(*(one() for _ in range(40)))
        applied = await control.set_knobs("sensor_mlp", None, target)
        await traffic
        assert applied == target
        assert current_config(control, "sensor_mlp", space) == target
        await asyncio.gather(*(one() for _ in range(20)))
        m = measure(control, "sensor_mlp", 30.0)
        assert m.offered == m.completed == 60 and m.rejected == 0  # none lost to the rebuild
        assert m.p95_ms > 0 and m.p50_ms <= m.p95_ms <= m.p99_ms
    finally:
        await service.registry.close()
        executor.shutdown()


async def test_requests_count_as_arrivals_when_they_reach_the_model(mlp_repo: Path) -> None:
    """The workload monitor reads ``arrived``: requests still queued count, so a burst is seen
    at its own rate while completions lag it."""
    executor = ThreadPoolExecutor(2)
    service = InferenceService(executor=executor, metrics=GatewayMetrics())
    service.registry.add_versions(scan_repository(mlp_repo))
    await service.registry.load_all()
    try:
        x = np.zeros((2, 32), dtype=np.float32)  # two rows per request
        traffic = asyncio.gather(
            *(
                service.infer(InferenceRequest("sensor_mlp", {"features": x}), transport="test")
                for _ in range(30)
            )
        )
        await asyncio.sleep(0)  # every request reaches the batcher; none is answered yet
        waiting = service.stats("sensor_mlp", window_s=30.0)
        assert (waiting.arrived, waiting.arrived_rows, waiting.completed) == (30, 60, 0)
        assert waiting.queue_depth == 30
        await traffic
        done = service.stats("sensor_mlp", window_s=30.0)
        assert (done.arrived, done.arrived_rows, done.completed) == (30, 60, 30)
        assert service.stats("sensor_mlp", window_s=0.0).arrived == 0
    finally:
        await service.registry.close()
        executor.shutdown()
