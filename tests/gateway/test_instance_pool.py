"""Parked instances: a reconfiguration keeps the sessions it takes out of service open for a
while, so that switching back to a recently used thread or concurrency configuration (the
tuner alternates a candidate with the incumbent window by window) builds nothing. Parking is
bounded by a count and an age; abandoned instances and a closing pool's never park.

Most tests run the pool over a fake runtime whose factory counts what it builds and closes;
the last one switches the threads of a real ONNX Runtime model served by the gateway."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from gateway.batching.instances import InstancePool
from gateway.types import InferenceRequest
from models.runtime import ModelMetadata, Runtime, TensorSpec, Threads
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

A = Threads(1, 1)
B = Threads(2, 1)
C = Threads(1, 2)
D = Threads(2, 2)
METADATA = ModelMetadata(
    name="fake",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec("x", "float32", (-1, 1)),),
    outputs=(TensorSpec("x", "float32", (-1, 1)),),
)


class FakeRuntime:
    def __init__(self, threads: Threads) -> None:
        self._threads = threads
        self.closes = 0
        self.closed = threading.Event()

    @property
    def metadata(self) -> ModelMetadata:
        return METADATA

    @property
    def threads(self) -> Threads:
        return self._threads

    @property
    def device(self) -> str:
        return "cpu"

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"x": inputs["x"]}

    def close(self) -> None:
        self.closes += 1
        self.closed.set()


class Factory:
    """Builds fake runtimes and keeps every one; ``fail_after`` builds, it raises."""

    def __init__(self) -> None:
        self.runtimes: list[FakeRuntime] = []
        self.fail_after: int | None = None

    def __call__(self, threads: Threads) -> Runtime:
        if self.fail_after is not None and len(self.runtimes) >= self.fail_after:
            raise RuntimeError("no memory for another session")
        runtime = FakeRuntime(threads)
        self.runtimes.append(runtime)
        return runtime

    def built(self, threads: Threads) -> int:
        return sum(1 for r in self.runtimes if r.threads == threads)

    @property
    def closed(self) -> list[FakeRuntime]:
        return [r for r in self.runtimes if r.closes]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


PoolMaker = Callable[..., InstancePool]


@pytest_asyncio.fixture
async def make_pool() -> AsyncIterator[PoolMaker]:
    """Pools over one executor; each is closed (and its runtimes checked closed) at the end."""
    executor = ThreadPoolExecutor(2, thread_name_prefix="test-pool")
    pools: list[InstancePool] = []

    def make(factory: Factory, **kwargs: Any) -> InstancePool:
        pool = InstancePool(factory=factory, executor=executor, **kwargs)
        pools.append(pool)
        return pool

    try:
        yield make
    finally:
        for pool in pools:
            await pool.close()
        executor.shutdown(wait=True)


async def _runtimes_in_service(pool: InstancePool) -> set[Runtime]:
    """The runtimes ``acquire`` hands out, each taken and given back."""
    taken = [await pool.acquire() for _ in range(pool.size)]
    for inst in taken:
        await pool.release(inst)
    return {inst.runtime for inst in taken}


async def test_switching_threads_back_reuses_the_parked_sessions(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(2, A)
    first_a = await _runtimes_in_service(pool)

    await pool.reconfigure(concurrency=2, threads=B)  # A -> B
    assert (pool.size, pool.parked) == (2, 2)
    first_b = await _runtimes_in_service(pool)
    await pool.reconfigure(concurrency=2, threads=A)  # B -> A: the A sessions again
    assert (factory.built(A), factory.built(B)) == (2, 2)
    assert await _runtimes_in_service(pool) == first_a
    await pool.reconfigure(concurrency=2, threads=B)  # A -> B: the B sessions again
    assert (factory.built(A), factory.built(B)) == (2, 2)
    assert await _runtimes_in_service(pool) == first_b
    assert (pool.size, pool.parked, pool.threads) == (2, 2, B)
    assert factory.closed == []


async def test_growing_back_after_a_shrink_builds_nothing(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(2, A)
    await pool.reconfigure(concurrency=1, threads=A)
    assert (pool.size, pool.parked) == (1, 1)
    await pool.reconfigure(concurrency=2, threads=A)
    assert (pool.size, pool.parked, len(factory.runtimes)) == (2, 0, 2)
    assert await _runtimes_in_service(pool) == set(factory.runtimes)
    assert factory.closed == []


async def test_a_shrink_by_none_takes_no_instance(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(2, A)
    await pool._shrink(0)  # a slice of the last 0 idle ones would have been all of them
    assert (pool.size, pool.parked) == (2, 0)


async def test_a_busy_instance_parks_when_its_batch_ends(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(1, A)
    busy = await pool.acquire()
    await pool.reconfigure(concurrency=1, threads=B)
    assert (pool.size, pool.busy, pool.parked) == (1, 0, 0)  # retired, still running
    await pool.release(busy)
    assert pool.parked == 1 and factory.closed == []

    await pool.reconfigure(concurrency=1, threads=A)
    assert factory.built(A) == 1
    again = await pool.acquire()
    assert again is busy and not again.retired
    await pool.release(again)
    assert (pool.size, pool.parked) == (1, 1)  # the B one now


async def test_a_busy_shrink_victim_parks_and_comes_back(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(2, A)
    first, second = await pool.acquire(), await pool.acquire()
    await pool.reconfigure(concurrency=1, threads=A)  # both busy: one is retired
    assert (pool.size, pool.busy, pool.parked) == (1, 1, 0)
    await pool.release(first)
    await pool.release(second)
    assert (pool.size, pool.parked) == (1, 1)
    await pool.reconfigure(concurrency=2, threads=A)
    assert (pool.size, pool.parked, len(factory.runtimes)) == (2, 0, 2)
    assert factory.closed == []


async def test_over_the_limit_the_oldest_parked_is_closed(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory, park_limit=2)
    await pool.start(1, A)
    for threads in (B, C, D):  # parks A, then B, then C: A is closed
        await pool.reconfigure(concurrency=1, threads=threads)
    assert pool.parked == 2
    assert [r.threads for r in factory.closed] == [A]

    await pool.reconfigure(concurrency=1, threads=B)
    assert factory.built(B) == 1
    await pool.reconfigure(concurrency=1, threads=A)
    assert factory.built(A) == 2
    assert all(r.closes <= 1 for r in factory.runtimes)


async def test_a_limit_of_zero_closes_as_before(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory, park_limit=0)
    await pool.start(2, A)
    busy = await pool.acquire()
    await pool.reconfigure(concurrency=2, threads=B)
    assert pool.parked == 0 and len(factory.closed) == 1  # the idle one
    await pool.release(busy)
    assert pool.parked == 0 and len(factory.closed) == 2
    await pool.reconfigure(concurrency=2, threads=A)
    assert factory.built(A) == 4


async def test_a_reconfiguration_closes_what_was_parked_too_long(make_pool: PoolMaker) -> None:
    factory = Factory()
    clock = Clock()
    pool = make_pool(factory, park_ttl_s=30.0, clock=clock)
    await pool.start(1, A)
    await pool.reconfigure(concurrency=1, threads=B)
    clock.now = 29.0
    await pool.reconfigure(concurrency=1, threads=B)  # nothing to change; A is young enough
    assert pool.parked == 1 and factory.closed == []
    clock.now = 31.0
    await pool.reconfigure(concurrency=1, threads=B)
    assert pool.parked == 0
    assert [r.threads for r in factory.closed] == [A]
    await pool.reconfigure(concurrency=1, threads=A)
    assert factory.built(A) == 2


async def test_the_timer_closes_what_was_parked_too_long(make_pool: PoolMaker) -> None:
    factory = Factory()
    clock = Clock()
    # A short TTL so that the timer looks often; the age it goes by is the injected clock's.
    pool = make_pool(factory, park_ttl_s=0.01, clock=clock)
    await pool.start(1, A)
    await pool.reconfigure(concurrency=1, threads=B)
    (parked_a,) = [r for r in factory.runtimes if r.threads == A]
    await asyncio.sleep(0.1)  # the timer wakes several times; the clock has not moved
    assert pool.parked == 1 and factory.closed == []

    clock.now = 1.0  # no call into the pool from here on
    assert await asyncio.to_thread(parked_a.closed.wait, EVENT_DEADLINE_S)
    assert pool.parked == 0 and factory.closed == [parked_a]


async def test_abandoned_instances_never_park(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(1, A)
    stuck = await pool.acquire()
    stuck_runtime = factory.runtimes[0]
    assert stuck.runtime is stuck_runtime
    call: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    pool.abandon(stuck, call)
    assert await pool.replenish() == 1
    assert (pool.size, pool.parked, pool.stuck) == (1, 0, 1)

    call.set_result(None)  # the hung call returns: its runtime is closed, not parked
    assert await asyncio.to_thread(stuck_runtime.closed.wait, EVENT_DEADLINE_S)
    assert (pool.parked, pool.stuck) == (0, 0)
    await pool.reconfigure(concurrency=1, threads=B)
    await pool.reconfigure(concurrency=1, threads=A)
    assert factory.built(A) == 2  # the replacement came back, not the abandoned one
    inst = await pool.acquire()
    assert inst is not stuck and stuck_runtime.closes == 1
    await pool.release(inst)


async def test_close_closes_the_parked_and_the_busy_once(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(2, A)
    busy = await pool.acquire()
    await pool.reconfigure(concurrency=2, threads=B)
    await pool.reconfigure(concurrency=1, threads=B)
    assert (pool.size, pool.parked) == (1, 2)  # the idle A and a B; the busy A still runs

    await pool.close()
    assert pool.parked == 0
    await pool.release(busy)  # its batch ends after the pool closed: closed, not parked
    assert pool.parked == 0
    assert [r.closes for r in factory.runtimes] == [1, 1, 1, 1]


async def test_a_failed_build_keeps_what_it_took_parked(make_pool: PoolMaker) -> None:
    factory = Factory()
    pool = make_pool(factory)
    await pool.start(1, A)
    await pool.reconfigure(concurrency=1, threads=B)
    factory.fail_after = len(factory.runtimes)
    with pytest.raises(RuntimeError):
        await pool.reconfigure(concurrency=2, threads=A)  # one A parked, the second fails
    assert (pool.size, pool.threads, pool.parked) == (1, B, 1)
    factory.fail_after = None
    await pool.reconfigure(concurrency=1, threads=A)
    assert factory.built(A) == 1 and factory.closed == []


async def test_real_sessions_switch_threads_back_without_a_build(
    source: Path, tmp_path: Path, reference: Runtime
) -> None:
    gate = Gate()
    repo = mlp_repo(
        tmp_path / "repo", source, concurrency=2, intra_op_threads=1, inter_op_threads=1
    )
    async with gated_service(repo, gate) as service:
        for intra in (2, 1, 2, 1):
            await service.change_knobs(MODEL, 1, {"intra_op_threads": intra})
            response = await service.infer(
                InferenceRequest(MODEL, features(3, intra), timeout_s=60.0), transport="test"
            )
            want = reference.infer(features(3, intra))["probabilities"]
            np.testing.assert_array_equal(response.outputs["probabilities"], want)
        assert len(gate.runtimes) == 4  # two sessions of each thread count, built once
        assert not any(r.closed.is_set() for r in gate.runtimes.values())
    assert all(r.closed.is_set() for r in gate.runtimes.values())
