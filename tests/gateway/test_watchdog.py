"""The batch watchdog: a runtime call that hangs fails its batch with 504 and its instance is
replaced, so the model keeps serving at its concurrency; the stuck instance is never used
again and is closed once its call returns; too many stuck calls mark the model unavailable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.batching.batcher import Batcher
from gateway.batching.instances import InstancePool
from gateway.batching.watchdog import CallWatchdog, timed_call
from gateway.errors import BatchTimeout, ModelUnavailable
from gateway.model_host import ModelState
from gateway.service import InferenceService
from gateway.types import InferenceRequest, InferenceResponse
from models.knobs import Knobs
from models.runtime import Runtime, Threads
from tests.conformance.virtual_batcher import (
    INPUT,
    ScriptedExecutor,
    ScriptedRuntime,
    on_virtual_loop,
)
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

# Far above what a sensor_mlp batch takes (well under a millisecond), short enough for a test.
WATCHDOG_S = 1.5
# One instance, one request per batch: the second request waits behind the stuck one.
BATCHING = {"concurrency": 1, "max_batch_size": 1, "batch_timeout_ms": 0.0}


def _request(seed: int) -> InferenceRequest:
    return InferenceRequest(MODEL, features(1, seed), timeout_s=60.0)


async def _stick_one_batch(
    service: InferenceService, gate: Gate
) -> tuple[asyncio.Task[InferenceResponse], asyncio.Task[InferenceResponse]]:
    """Send a request whose batch hangs, then one that queues behind it."""
    gate.arm()
    stuck = asyncio.create_task(service.infer(_request(1), transport="test"))
    # The call blocks on an executor thread: wait for it there, not on the loop.
    assert await asyncio.to_thread(gate.entered.wait, EVENT_DEADLINE_S)
    queued = asyncio.create_task(service.infer(_request(2), transport="test"))
    return stuck, queued


async def test_a_stuck_batch_fails_with_504_and_a_fresh_instance_serves_on(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    gate = Gate()
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with gated_service(repo, gate, batch_watchdog_s=WATCHDOG_S) as service:
        host = service.registry.host(MODEL)
        stuck, queued = await _stick_one_batch(service, gate)

        with pytest.raises(BatchTimeout) as caught:
            await stuck
        err = caught.value
        assert (err.status, err.reason) == (504, "batch_timeout")
        assert MODEL in err.message and f"{WATCHDOG_S:g} s" in err.message

        # The request queued behind it is answered, by a replacement instance.
        response = await queued
        want = reference.infer(features(1, 2))
        np.testing.assert_array_equal(response.outputs["probabilities"], want["probabilities"])
        assert gate.stuck is not None
        replacements = [r for r in gate.runtimes.values() if r is not gate.stuck and r.calls]
        assert replacements, "no other runtime instance answered after the stuck one"
        assert host.state is ModelState.READY
        assert host._pool.size == BATCHING["concurrency"]
        assert host._pool.stuck == 1

        # More requests are served, never by the stuck instance.
        calls_before = gate.stuck.calls
        for seed in range(3, 8):
            await service.infer(_request(seed), transport="test")
        assert gate.stuck.calls == calls_before
        assert service.byte_budget.charged == 0

        samples = metric_samples(service.metrics.render().decode())
        assert ("iotgw_batch_watchdog_total", {"model": MODEL, "version": "1"}, 1.0) in samples
        assert ("iotgw_abandoned_calls", {}, 1.0) in samples
        timed_out = {
            "model": MODEL,
            "version": "1",
            "transport": "test",
            "outcome": "batch_timeout",
        }
        assert ("iotgw_requests_total", timed_out, 1.0) in samples

        # Once the hung call returns, its thread is free and its runtime closed.
        gate.open()
        assert await asyncio.to_thread(gate.stuck.closed.wait, EVENT_DEADLINE_S)
        assert host._pool.stuck == 0
        samples = metric_samples(service.metrics.render().decode())
        assert ("iotgw_abandoned_calls", {}, 0.0) in samples


# The model's own limit (one stuck call), or the process's: with 2 executor threads at most one
# may be held by a stuck call, whatever the model's limit says.
@pytest.mark.parametrize(("max_stuck", "executor_threads"), [(1, 4), (5, 2)])
async def test_at_the_stuck_limit_the_model_is_marked_unavailable(
    source: Path, tmp_path: Path, max_stuck: int, executor_threads: int
) -> None:
    gate = Gate()
    repo = mlp_repo(tmp_path / "repo", source, **BATCHING)
    async with gated_service(
        repo,
        gate,
        executor_threads=executor_threads,
        batch_watchdog_s=WATCHDOG_S,
        batch_watchdog_max_stuck=max_stuck,
    ) as service:
        host = service.registry.host(MODEL)
        stuck, queued = await _stick_one_batch(service, gate)
        with pytest.raises(BatchTimeout):
            await stuck
        # No replacement: what waited is refused rather than left waiting.
        with pytest.raises(ModelUnavailable) as caught:
            await queued
        assert caught.value.status == 503
        assert host.state is ModelState.UNAVAILABLE
        assert "watchdog" in host.reason
        (status,) = service.registry.statuses()
        assert status.state == "UNAVAILABLE" and "watchdog" in status.reason
        with pytest.raises(ModelUnavailable):
            await service.infer(_request(3), transport="test")
        assert service.byte_budget.charged == 0
        assert service.stuck_calls == 1
        assert host._pool.size == BATCHING["concurrency"] - 1  # not replaced


class _QueuedExecutor(ScriptedExecutor):
    """Starts each runtime call ``queue_s`` after it is handed over (the executor's threads
    busy with other work meanwhile), then completes it ``service_s(rows)`` after its start,
    all on the virtual loop's clock."""

    def __init__(self, queue_s: float, service_s: float) -> None:
        super().__init__(lambda rows: service_s)
        self.queue_s = queue_s

    def run(self, loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> Any:
        if fn is not timed_call:
            return super().run(loop, fn, *args)
        future = loop.create_future()

        def start() -> None:
            infer, inputs, on_start = args
            on_start()
            seconds = self.service_s(len(inputs[INPUT]))
            loop.call_later(seconds, future.set_result, (infer(inputs), seconds))

        loop.call_later(self.queue_s, start)
        return future


def _one_batch_past_the_limit(queue_s: float, service_s: float, watchdog_s: float) -> str:
    """One request through a real ``Batcher`` on virtual time whose call waits ``queue_s`` for
    a thread and then runs ``service_s``: "answered" or the watchdog's refusal."""

    async def run() -> str:
        executor = _QueuedExecutor(queue_s, service_s)
        pool = InstancePool(factory=ScriptedRuntime, executor=executor, warmup_batch_sizes=())
        await pool.start(1, Threads(1, 1))
        clock = asyncio.get_running_loop().time
        batcher = Batcher(
            name="scripted",
            pool=pool,
            watchdog=CallWatchdog(
                name="scripted", executor=executor, limit_s=watchdog_s, clock=clock
            ),
            knobs=lambda: Knobs(1, 0.0, 1, 1, 1),
            max_queue_size=8,
            clock=clock,
        )
        batcher.start()
        row = {INPUT: np.zeros((1, 1), dtype=np.float32)}
        try:
            await batcher.submit(row, rows=1, deadline=asyncio.get_running_loop().time() + 3600)
            return "answered"
        except BatchTimeout:
            return "watchdog"
        finally:
            await batcher.stop()

    loop = on_virtual_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def test_the_watchdog_times_the_call_from_its_start_not_from_the_wait_for_a_thread() -> None:
    # 40 s waiting for a busy executor thread, then 5 s of work, against a 30 s limit: answered.
    assert _one_batch_past_the_limit(queue_s=40.0, service_s=5.0, watchdog_s=30.0) == "answered"
    # Started at once and still running 30 s later: the watchdog fails the batch.
    assert _one_batch_past_the_limit(queue_s=0.0, service_s=45.0, watchdog_s=30.0) == "watchdog"
    # Started after 20 s and running past 30 s from its start (50 s from its hand-over).
    assert _one_batch_past_the_limit(queue_s=20.0, service_s=31.0, watchdog_s=30.0) == "watchdog"
    assert _one_batch_past_the_limit(queue_s=20.0, service_s=29.0, watchdog_s=30.0) == "answered"
