"""The process-wide budget of queued request bytes: a request that does not fit is refused with
503 (reason memory) while the queue holds the budget, served again once it drains; every way a
request leaves (answered, refused, cancelled) gives its bytes back exactly once."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import MemoryBudgetExceeded, PayloadTooLarge
from gateway.service import tensor_bytes
from gateway.types import InferenceRequest
from models.runtime import Runtime
from tests.gateway.gated_runtime import (  # noqa: F401 (*_fixture: pytest fixtures)
    EVENT_DEADLINE_S,
    MODEL,
    Gate,
    features,
    gated_service,
    mlp_repo,
    reference_fixture,
    source_fixture,
)
from tests.gateway.helpers import metric_samples

# One instance, one request per batch: while the instance is held, requests wait in the queue.
BATCHING = {"concurrency": 1, "max_batch_size": 4, "batch_timeout_ms": 0.0}
ROWS = 4
REQUEST_BYTES = ROWS * 32 * 4  # float32 features
# Room for two requests, not three.
BUDGET = 2 * REQUEST_BYTES + REQUEST_BYTES // 2


def _request(seed: int, rows: int = ROWS) -> InferenceRequest:
    return InferenceRequest(MODEL, features(rows, seed), timeout_s=60.0)


def _samples(text: bytes) -> dict[tuple[str, str], float]:
    return {
        (name, labels.get("reason", "")): value
        for name, labels, value in metric_samples(text.decode())
        if name in ("iotgw_queued_bytes", "iotgw_rejections_total")
    }


async def test_a_full_byte_budget_refuses_with_503_until_the_queue_drains(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    gate = Gate()
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with gated_service(repo, gate, max_queued_bytes=BUDGET) as service:
        budget = service.byte_budget
        gate.arm()  # the first batch holds the only instance until the gate opens
        running = asyncio.create_task(service.infer(_request(1), transport="test"))
        assert await asyncio.to_thread(gate.entered.wait, EVENT_DEADLINE_S)
        queued = asyncio.create_task(service.infer(_request(2), transport="test"))
        await asyncio.sleep(0)  # let it reach the queue (one turn of the loop, no waiting)
        assert budget.charged == 2 * REQUEST_BYTES
        assert _samples(service.metrics.render())[("iotgw_queued_bytes", "")] == budget.charged

        with pytest.raises(MemoryBudgetExceeded) as caught:
            await service.infer(_request(3), transport="test")
        err = caught.value
        assert (err.status, err.reason) == (503, "memory")
        assert "serving.max_queued_bytes" in err.message and str(BUDGET) in err.message
        assert err.retry_after is not None and err.retry_after >= 1

        # Larger than the whole budget: it could never fit, so not "retry later" but 413.
        with pytest.raises(PayloadTooLarge):
            await service.infer(_request(4, rows=3 * ROWS), transport="test")

        # A cancelled request gives its bytes back: now a third one fits.
        queued.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await queued
        assert budget.charged == REQUEST_BYTES
        third = asyncio.create_task(service.infer(_request(3), transport="test"))
        await asyncio.sleep(0)
        assert budget.charged == 2 * REQUEST_BYTES

        gate.open()
        answers = await asyncio.gather(running, third)
        for seed, answer in zip((1, 3), answers, strict=True):
            want = reference.infer(features(ROWS, seed))["probabilities"]
            np.testing.assert_array_equal(answer.outputs["probabilities"], want)
        assert budget.charged == 0

        # Drained: served again, and the gauge is back at zero.
        await service.infer(_request(3), transport="test")
        samples = _samples(service.metrics.render())
        assert samples[("iotgw_queued_bytes", "")] == 0
        assert samples[("iotgw_rejections_total", "memory")] == 1
        assert samples[("iotgw_rejections_total", "payload_too_large")] == 1


def test_tensor_bytes_counts_string_elements_by_length() -> None:
    strings = np.array([b"abc", b"", b"defgh"], dtype=object)
    numbers = np.zeros((2, 3), dtype=np.float32)
    assert tensor_bytes({"s": strings, "x": numbers}) == 3 + 0 + 5 + 2 * 3 * 4
