"""A batch waits for rows only while other requests can come: a lone closed-loop client (whose
next request leaves only after its reply) is dispatched at once as soon as the batcher has
watched long enough to be sure nobody else is sending, while requests that arrive while others
wait (a burst) still fill batches. ``batch_timeout`` stays the longest wait.

The estimator is checked on explicit times; the batcher on a real ONNX Runtime session, with
the batches' own records (why each left, how long it waited) rather than wall-clock bounds."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np

from gateway.batching.batcher import BatchRecord
from gateway.service import InferenceService
from gateway.types import InferenceRequest
from models.batching_rule import ArrivalEstimate
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

MAX_BATCH = 8
TIMEOUT_S = 0.2
BATCHING = {"concurrency": 1, "max_batch_size": MAX_BATCH, "batch_timeout_ms": TIMEOUT_S * 1e3}
# With the estimate's prior of 3 arrivals, a lone client is trusted once its requests kept the
# batcher busy for 3 windows without another arrival: at most this many waits before that.
LEARNING_WAITS = 4


def _closed_loop_client(
    estimate: ArrivalEstimate, requests: int, busy_s: float, start: float = 0.0
) -> float:
    """One client that sends its next request 1 ms after each reply; returns the time."""
    now, gap_s = start, 0.001
    for _ in range(requests):
        estimate.arrived(now)
        now += busy_s
        estimate.left(now)
        now += gap_s
    return now


def test_nothing_watched_means_unknown() -> None:
    estimate = ArrivalEstimate()
    assert math.isinf(estimate.rate_upper(0.0))
    estimate.arrived(5.0)
    assert math.isinf(estimate.rate_upper(5.0))  # no busy time watched yet
    assert estimate.expected(0.002, 5.0) >= 1.0


def test_a_lone_closed_loop_client_is_expected_to_send_nothing_while_it_waits() -> None:
    estimate = ArrivalEstimate()
    # Requests every 1.5 ms: a high rate, but each one waits for the previous reply.
    now = _closed_loop_client(estimate, 64, busy_s=0.0005)
    assert estimate.expected(0.002, now) < 1.0
    # Its rate on the wall clock would have promised more than one row in a 2 ms window.
    assert 64 / now * 0.002 > 1.0


def test_too_little_watched_busy_time_keeps_the_wait() -> None:
    estimate = ArrivalEstimate()
    now = _closed_loop_client(estimate, 3, busy_s=0.0005)
    # 1.5 ms of busy time without another arrival says little about a 2 ms window.
    assert estimate.expected(0.002, now) >= 1.0


def test_arrivals_while_others_wait_are_counted() -> None:
    estimate = ArrivalEstimate()
    _closed_loop_client(estimate, 64, busy_s=0.0005)
    # Then many clients at once, each arriving while the others' requests are held. A few
    # such arrivals are not enough against 32 ms of quiet (meanwhile the queue that builds
    # behind a busy instance batches them anyway) ...
    now = 1.0
    for i in range(16):
        if i == 8:
            assert estimate.expected(0.002, now) < 1.0
        estimate.arrived(now)
        now += 0.0001
    # ... but a quarter of the window is: a wait is worth it again.
    assert estimate.expected(0.002, now) >= 1.0
    for _ in range(16):
        estimate.left(now)
    assert estimate.busy_clock(now) == estimate.busy_clock(now + 5.0)  # idle: the clock stops


def test_the_window_forgets_old_arrivals() -> None:
    estimate = ArrivalEstimate(window=16)
    for i in range(16):  # a burst: all held together
        estimate.arrived(i * 0.0001)
    for _ in range(16):
        estimate.left(0.002)
    assert estimate.rate_upper(0.002) == (15 + 3) / 0.002
    # Then a lone client, for a whole window: only its own quiet busy time is left.
    now = _closed_loop_client(estimate, 16, busy_s=0.001, start=1.0)
    assert math.isclose(estimate.rate_upper(now), 3 / 0.016)


async def _one(service: InferenceService, seed: int) -> np.ndarray:
    request = InferenceRequest(MODEL, features(1, seed), timeout_s=60.0)
    response = await service.infer(request, transport="test")
    return response.outputs["probabilities"]


async def test_a_lone_client_is_not_held_and_a_burst_still_fills_batches(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    records: list[BatchRecord] = []
    async with gated_service(mlp_repo(tmp_path / "repo", source, **BATCHING), Gate()) as service:
        batcher = service.registry.host(MODEL)._batcher
        record_batch = batcher._on_batch
        assert record_batch is not None

        def recorded(record: BatchRecord) -> None:
            records.append(record)
            record_batch(record)

        batcher._on_batch = recorded

        lone = 12
        answers = [await _one(service, seed) for seed in range(lone)]  # one after the other
        alone = records[:]

        async def burst_request(seed: int, delay_turns: int) -> np.ndarray:
            for _ in range(delay_turns):  # arrive one by one, spread over loop turns
                await asyncio.sleep(0)
            return await _one(service, seed)

        burst = 1 + 4 * MAX_BATCH
        answers += await asyncio.gather(*(burst_request(lone + i, i) for i in range(burst)))
        in_burst = records[len(alone) :]

    for seed, got in enumerate(answers):
        np.testing.assert_array_equal(got, reference.infer(features(1, seed))["probabilities"])

    assert [r.rows for r in alone] == [1] * lone
    # Fresh, the batcher knows nothing of its clients and waits as configured ...
    assert alone[0].fill.trigger == "timeout" and alone[0].fill.waited_s > 0
    # ... and once it watched the lone client long enough, it dispatches at once.
    waits = [r for r in alone if r.fill.waited_s > 0]
    assert len(waits) <= LEARNING_WAITS
    settled = alone[LEARNING_WAITS:]
    assert all(r.fill.trigger == "no_arrival_expected" for r in settled)
    assert all(r.fill.waited_s == 0.0 for r in settled)

    # The burst: its first request may leave alone (the batcher still expects nobody), but
    # those arriving while it is served are batched, full, as before.
    assert sum(r.rows for r in in_burst) == burst
    middle = in_burst[1:-1]
    assert len([r for r in in_burst if r.rows == MAX_BATCH]) >= 3
    assert all(r.rows == MAX_BATCH for r in middle)
