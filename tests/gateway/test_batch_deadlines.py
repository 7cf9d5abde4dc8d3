"""What is admitted is answered within its deadline: admission plans with the fastest recent
batch (so a short slowdown does not refuse requests that would have made it), and a request
whose batch, at the recent pace, would end after its deadline is refused (503 deadline, with a
retry hint) when that batch starts, instead of being answered late.

The recent pace is set by hand in the batcher's service-time estimate (one fast batch, two
slow ones), so what is refused follows from the rule, not from how fast this machine is."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import GatewayError
from gateway.types import InferenceRequest
from models.batching_rule import STALE_AFTER_S, AnswerLag
from models.runtime import Runtime
from tests.gateway.gated_runtime import (  # noqa: F401 (*_fixture: pytest fixtures)
    MODEL,
    Gate,
    features,
    gated_service,
    mlp_repo,
    reference_fixture,
    source_fixture,
)

BATCHING = {"concurrency": 1, "max_batch_size": 4, "batch_timeout_ms": 0.0}
FASTEST_S, TYPICAL_S = 0.001, 10.0


async def test_a_request_its_batch_would_answer_late_is_refused_when_the_batch_starts(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    async with gated_service(mlp_repo(tmp_path / "repo", source, **BATCHING), Gate()) as service:
        host = service.registry.host(MODEL)
        # One-row batches: most fast, but two in ten slow, so one answer in ten or more would
        # come late: planned with the 90th percentile, not the median (which is fast here).
        for seconds in (FASTEST_S,) * 8 + (TYPICAL_S,) * 2:
            host._batcher.service_time.observe(1, seconds)

        # 5 s left: the fastest pace would make it (admitted), the slow tenth would not.
        late = InferenceRequest(MODEL, features(1, 0), timeout_s=5.0)
        with pytest.raises(GatewayError) as refused:
            await service.infer(late, transport="test")
        error = refused.value
        assert (error.status, error.reason) == (503, "deadline")
        # Refused at the batch, not at the door.
        assert "takes up to about 10000.0 ms" in error.message
        assert error.retry_after is not None and error.retry_after > 0

        # With time enough for the recent pace, a request is served, and correctly.
        timely = InferenceRequest(MODEL, features(1, 1), timeout_s=60.0)
        response = await service.infer(timely, transport="test")
        want = reference.infer(features(1, 1))["probabilities"]
        np.testing.assert_array_equal(response.outputs["probabilities"], want)

        stats = host.stats()
        assert (stats.rejected, stats.completed) == (1, 1)
        assert service.byte_budget.charged == 0


async def test_a_request_that_cannot_make_it_even_at_the_fastest_pace_is_refused_at_once(
    source: Path, tmp_path: Path
) -> None:
    async with gated_service(mlp_repo(tmp_path / "repo", source, **BATCHING), Gate()) as service:
        host = service.registry.host(MODEL)
        for _ in range(3):
            host._batcher.service_time.observe(1, TYPICAL_S)
        request = InferenceRequest(MODEL, features(1, 0), timeout_s=5.0)
        with pytest.raises(GatewayError) as refused:
            await service.infer(request, transport="test")
        assert (refused.value.status, refused.value.reason) == (503, "deadline")
        assert "cannot be met (estimated" in refused.value.message  # at admission
        assert host.queue_depth == 0


async def test_the_event_loop_s_recent_delay_in_resuming_answers_counts_against_the_deadline(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    async with gated_service(mlp_repo(tmp_path / "repo", source, **BATCHING), Gate()) as service:
        host = service.registry.host(MODEL)
        for _ in range(3):
            host._batcher.service_time.observe(1, FASTEST_S)
            host._batcher.answer_lag.observe(TYPICAL_S)  # e.g. a loop saturated by a flood
        # Batches are fast, but answers lately waited 10 s for the loop: 5 s is not enough.
        request = InferenceRequest(MODEL, features(1, 0), timeout_s=5.0)
        with pytest.raises(GatewayError) as refused:
            await service.infer(request, transport="test")
        assert (refused.value.status, refused.value.reason) == (503, "deadline")
        assert "cannot be met (estimated" in refused.value.message
        timely = InferenceRequest(MODEL, features(1, 1), timeout_s=60.0)
        response = await service.infer(timely, transport="test")
        want = reference.infer(features(1, 1))["probabilities"]
        np.testing.assert_array_equal(response.outputs["probabilities"], want)


async def test_refusals_on_a_stalled_pace_end_once_nothing_can_correct_it(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    """After a stall (recent batches and answers slow), refusing on that pace stops every batch,
    so nothing would ever correct it. Once nothing has run for STALE_AFTER_S, the next request
    runs as a probe, and what it measures replaces the stall's figures."""
    async with gated_service(mlp_repo(tmp_path / "repo", source, **BATCHING), Gate()) as service:
        batcher = service.registry.host(MODEL)._batcher
        for _ in range(3):
            batcher.service_time.observe(1, TYPICAL_S)
            batcher.answer_lag.observe(TYPICAL_S)
        refused = InferenceRequest(MODEL, features(1, 0), timeout_s=5.0)
        with pytest.raises(GatewayError) as error:
            await service.infer(refused, transport="test")
        assert (error.value.status, error.value.reason) == (503, "deadline")
        await asyncio.sleep(STALE_AFTER_S * 1.2)  # nothing runs meanwhile: the figures age
        for i in (1, 2):  # the probe, then a request admitted on the probe's pace
            request = InferenceRequest(MODEL, features(1, i), timeout_s=5.0)
            response = await service.infer(request, transport="test")
            want = reference.infer(features(1, i))["probabilities"]
            np.testing.assert_array_equal(response.outputs["probabilities"], want)
        high = batcher.service_time.high(1)
        assert high is not None and high < TYPICAL_S
        assert batcher.answer_lag.high < TYPICAL_S


def test_the_answer_lag_is_a_high_percentile_of_the_recent_waits() -> None:
    lag = AnswerLag(window=10, every=5)
    assert lag.high == 0.0
    for seconds in (0.001, 0.001, 0.001, 0.001, 0.050):  # one slow pass of the loop ...
        lag.observe(seconds)
    assert lag.high == 0.001  # ... is not the 90th percentile of five
    for _ in range(5):  # a saturated loop: half the recent waits are long
        lag.observe(0.050)
    assert lag.high == 0.050
    for _ in range(10):  # and it is forgotten once the window holds only short ones
        lag.observe(0.001)
    assert lag.high == 0.001
