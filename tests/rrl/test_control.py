"""The control protocol against a real gateway service: rrl's helpers read the knobs, change all
five of them (the gateway applies them, threads included) and turn a window snapshot into a
measurement, with requests served throughout."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gateway.metrics import GatewayMetrics
from gateway.service import InferenceService
from gateway.types import InferenceRequest
from models.repository import scan_repository
from rrl.control import ModelControl, apply_config, current_config, measure
from rrl.space import Config, ConfigSpace


async def test_the_gateway_service_is_a_model_control(mlp_repo: Path) -> None:
    executor = ThreadPoolExecutor(8)
    service = InferenceService(executor=executor, metrics=GatewayMetrics())
    service.add_versions(scan_repository(mlp_repo))
    await service.load_all()
    control: ModelControl = service  # structural: no adapter needed
    space = ConfigSpace.for_machine(2)
    try:
        assert current_config(control, "sensor_mlp", space) == Config(32, 1.0, 1, 1, 1)

        async def one() -> None:
            x = np.zeros((1, 32), dtype=np.float32)
            await service.infer(InferenceRequest("sensor_mlp", {"features": x}), transport="test")

        target = Config(8, 0.0, 2, 2, 1)
        # Requests keep flowing while the threads change (instances rebuilt and swapped).
        traffic = asyncio.gather(*(one() for _ in range(40)))
        applied = await apply_config(control, "sensor_mlp", target)
        await traffic
        assert applied == target
        assert current_config(control, "sensor_mlp", space) == target
        await asyncio.gather(*(one() for _ in range(20)))
        m = measure(control, "sensor_mlp", 30.0)
        assert m.offered == m.completed == 60
        assert m.slo_violations == 0 and m.p95_ms > 0
    finally:
        await service.close()
        executor.shutdown()
