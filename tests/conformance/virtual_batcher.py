"""The gateway's own ``Batcher`` run in virtual time: the reference the simulators of the
batching rule are held to (``tests/conformance/test_batching_rule.py``).

The batcher runs unchanged on an event loop whose clock moves only when every task waits
(``looptime``), with the loop's clock as its own. Each batch's runtime call is scripted: it
starts at once and its result arrives ``service_s(rows)`` later on that clock, reported as the
call's duration, as a real call's ``perf_counter`` span would be. So a trace of arrivals gives
the same batches, refusals and latencies on every machine, and a batch timeout, a deadline or
a wave of instances are the batcher's own code deciding, not a copy of it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import looptime
import numpy as np

from gateway.batching.batcher import Batcher, BatchRecord
from gateway.batching.instances import InstancePool
from gateway.batching.watchdog import CallWatchdog, timed_call
from gateway.errors import GatewayError
from models.knobs import Knobs
from models.runtime import ModelMetadata, TensorSpec, Threads

CLOCK_RESOLUTION_S = 1e-9
"""The virtual loop's clock counts whole nanoseconds: two events closer than that are one."""
NOOP_CYCLES = 1
"""Idle loop passes before the clock jumps to the next timer: nothing here runs in a thread
(the scripted executor completes calls on the loop), so one pass is enough."""
INPUT = "x"
METADATA = ModelMetadata(
    name="scripted",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec(INPUT, "float32", (-1, 1)),),
    outputs=(TensorSpec(INPUT, "float32", (-1, 1)),),
)


class ScriptedRuntime:
    """A runtime that answers each row with itself (the batch's time is the executor's)."""

    def __init__(self, threads: Threads) -> None:
        self._threads = threads

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
        return {INPUT: inputs[INPUT]}

    def close(self) -> None:
        pass


class ScriptedExecutor(concurrent.futures.Executor):
    """Runs every call at once on the loop's thread; a batch's runtime call
    (``gateway.batching.watchdog.timed_call``) completes ``service_s(rows)`` later on the
    loop's clock, the rest (building runtimes, closing them) at once. The loop hands it its
    calls directly (``on_virtual_loop``): an executor's futures would make the virtual loop
    wait for them in real time, as it must for a real thread."""

    def __init__(self, service_s: Callable[[int], float]) -> None:
        self.service_s = service_s
        self.calls: list[tuple[float, int]] = []  # (started at, rows) of every batch

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the scripted executor runs on the virtual loop only")

    def run(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> Any:
        future = loop.create_future()
        if fn is not timed_call:
            future.set_result(fn(*args))
            return future
        infer, inputs, on_start = args
        on_start()
        outputs = infer(inputs)
        rows = len(inputs[INPUT])
        seconds = self.service_s(rows)
        self.calls.append((loop.time(), rows))
        loop.call_later(seconds, future.set_result, (outputs, seconds))
        return future


def on_virtual_loop() -> asyncio.AbstractEventLoop:
    """A loop on virtual time (``looptime``) that runs a ``ScriptedExecutor``'s calls itself."""
    loop = looptime.new_event_loop(resolution=CLOCK_RESOLUTION_S, noop_cycles=NOOP_CYCLES)
    in_threads = loop.run_in_executor

    def run_in_executor(executor: Any, func: Callable[..., Any], *args: Any) -> Any:
        if isinstance(executor, ScriptedExecutor):
            return executor.run(loop, func, *args)
        return in_threads(executor, func, *args)

    loop.run_in_executor = run_in_executor  # type: ignore[method-assign]
    return loop


@dataclass
class BatcherRun:
    """What the batcher did with a trace: each request's latency (``inf``: refused), the
    refusal's message for a refused one, and every batch as it started."""

    latencies_s: list[float]
    refusals: dict[int, str] = field(default_factory=dict)
    batches: list[BatchRecord] = field(default_factory=list)
    starts: list[tuple[float, int]] = field(default_factory=list)  # (started at, rows)

    @property
    def batch_rows(self) -> list[int]:
        return [rows for _, rows in self.starts]


def run_batcher(
    arrivals_s: Sequence[float],
    knobs: Knobs,
    service_s: Callable[[int], float],
    *,
    deadline_s: float,
    max_queue_size: int = 4096,
) -> BatcherRun:
    """Every request of ``arrivals_s`` (seconds from the start, sorted) submitted to a real
    ``Batcher`` at its time, one row each, with ``deadline_s`` to be answered."""
    loop = on_virtual_loop()
    try:
        return loop.run_until_complete(
            _run(arrivals_s, knobs, service_s, deadline_s, max_queue_size)
        )
    finally:
        loop.close()


async def _run(
    arrivals_s: Sequence[float],
    knobs: Knobs,
    service_s: Callable[[int], float],
    deadline_s: float,
    max_queue_size: int,
) -> BatcherRun:
    loop = asyncio.get_running_loop()
    run = BatcherRun([math.inf] * len(arrivals_s))
    batcher, pool, executor = await _started(knobs, service_s, max_queue_size, run)
    origin = loop.time()

    async def one(i: int, arrived: float) -> None:
        row = {INPUT: np.full((1, 1), float(i), dtype=np.float32)}
        try:
            outputs, _, _ = await batcher.submit(row, rows=1, deadline=arrived + deadline_s)
        except GatewayError as refused:
            run.refusals[i] = str(refused)
            return
        assert int(outputs[INPUT][0, 0]) == i  # its own row came back
        run.latencies_s[i] = loop.time() - arrived

    tasks = []
    for i, at in enumerate(arrivals_s):
        await asyncio.sleep(max(0.0, origin + at - loop.time()))
        tasks.append(asyncio.create_task(one(i, origin + at)))
    await asyncio.gather(*tasks)
    await batcher.stop()
    await pool.close()
    run.starts = [(at - origin, rows) for at, rows in executor.calls]
    return run


async def _started(
    knobs: Knobs, service_s: Callable[[int], float], max_queue_size: int, run: BatcherRun
) -> tuple[Batcher, InstancePool, ScriptedExecutor]:
    """A real ``Batcher`` over scripted instances, started, its batches recorded in ``run``."""
    executor = ScriptedExecutor(service_s)
    pool = InstancePool(factory=ScriptedRuntime, executor=executor, warmup_batch_sizes=())
    await pool.start(knobs.concurrency, Threads(knobs.intra_op_threads, knobs.inter_op_threads))
    clock = asyncio.get_running_loop().time
    batcher = Batcher(
        name="scripted",
        pool=pool,
        watchdog=CallWatchdog(name="scripted", executor=executor, clock=clock),
        knobs=lambda: knobs,
        max_queue_size=max_queue_size,
        on_batch=run.batches.append,
        clock=clock,
    )
    batcher.start()
    return batcher, pool, executor


def run_closed_loop(
    clients: int, knobs: Knobs, service_s: Callable[[int], float], *, seconds: float
) -> BatcherRun:
    """``clients`` that each send their next request the moment the last is answered, through
    a real ``Batcher`` for ``seconds`` of virtual time (a deadline none of them reaches)."""
    loop = on_virtual_loop()
    try:
        return loop.run_until_complete(_closed(clients, knobs, service_s, seconds))
    finally:
        loop.close()


async def _closed(
    clients: int, knobs: Knobs, service_s: Callable[[int], float], seconds: float
) -> BatcherRun:
    loop = asyncio.get_running_loop()
    run = BatcherRun([])
    batcher, pool, executor = await _started(knobs, service_s, clients, run)
    origin = loop.time()
    end = origin + seconds

    async def client() -> None:
        row = {INPUT: np.zeros((1, 1), dtype=np.float32)}
        while loop.time() < end:
            sent = loop.time()
            await batcher.submit(row, rows=1, deadline=sent + 3600.0)
            run.latencies_s.append(loop.time() - sent)

    await asyncio.gather(*(client() for _ in range(clients)))
    await batcher.stop()
    await pool.close()
    run.starts = [(at - origin, rows) for at, rows in executor.calls]
    return run
