"""The runtime instances of one model version: one per batch in flight.

Operation-level threads are fixed when a backend session is created, so a thread change builds a
new generation of instances off the event loop, warms them, swaps them in, and closes the old
ones once the batches running on them are done. Batches never see a half-built or closed
instance, so a swap fails no request.

Instances a reconfiguration takes out of service (the old generation of a thread change, the
victims of a shrink) are parked rather than closed: the tuner alternates a candidate with the
incumbent window by window, and rebuilding and warming sessions at every switch costs the cores
that serve. A later build takes parked instances with the same threads first. Parking is bounded
by a count and an age, so sessions of a configuration left for good do not hold memory.

An instance whose call the watchdog (``gateway.batching.watchdog``) gave up on is abandoned: out
of the set for good, closed only if its call ever returns, and replaced through ``replenish``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.batching.watchdog import StuckCalls
from models.runtime import ModelMetadata, Runtime, Threads

log = logging.getLogger("gateway.instances")

RuntimeFactory = Callable[[Threads], Runtime]

DEFAULT_PARK_LIMIT = 4
"""Parked instances per pool: a switch back to either of two configurations of up to a few
instances each finds its sessions."""
DEFAULT_PARK_TTL_S = 30.0
"""How long an instance stays parked: far beyond a trial's windows (about a second each)."""


@dataclass(eq=False)
class Instance:
    runtime: Runtime
    threads: Threads
    generation: int
    id: int
    retired: bool = field(default=False)


class InstancePool:
    """Hands idle instances to the batcher; resizes and re-threads the set without failing any
    batch. All methods run on the event loop; blocking backend work goes to ``executor``.

    At most ``park_limit`` instances stay parked (0: none), each for at most ``park_ttl_s``
    seconds of ``clock``, which the expiry timer also sleeps by."""

    def __init__(
        self,
        *,
        factory: RuntimeFactory,
        executor: Executor,
        warmup_batch_sizes: tuple[int, ...] = (1,),
        stuck_calls: StuckCalls | None = None,
        park_limit: int = DEFAULT_PARK_LIMIT,
        park_ttl_s: float = DEFAULT_PARK_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = factory
        self._executor = executor
        self._warmup_batch_sizes = warmup_batch_sizes
        self._idle: deque[Instance] = deque()
        self._busy: set[Instance] = set()
        self._active: list[Instance] = []
        self._stuck: set[Instance] = set()  # abandoned, their calls still running
        self._stuck_calls = stuck_calls if stuck_calls is not None else StuckCalls(limit=1 << 30)
        self._closing: set[asyncio.Task[None]] = set()
        # (parked at, instance), oldest first: open, idle, never handed out.
        self._parked: deque[tuple[float, Instance]] = deque()
        self._park_limit = park_limit
        self._park_ttl_s = park_ttl_s
        self._clock = clock
        self._park_timer: asyncio.Task[None] | None = None
        self._target = 0  # the concurrency asked for: what ``replenish`` rebuilds to
        self._available = asyncio.Condition()
        self._reconfigure_lock = asyncio.Lock()
        self._generation = 0
        self._ids = itertools.count(1)
        self._threads: Threads | None = None
        self._closed = False
        self.metadata: ModelMetadata | None = None

    @property
    def size(self) -> int:
        return len(self._active)

    @property
    def threads(self) -> Threads | None:
        return self._threads

    @property
    def busy(self) -> int:
        return sum(1 for inst in self._busy if not inst.retired)

    @property
    def parked(self) -> int:
        """Instances kept open for a switch back; not part of ``size``."""
        return len(self._parked)

    @property
    def stuck(self) -> int:
        """This model's abandoned instances whose calls have not returned yet."""
        return len(self._stuck)

    async def start(self, concurrency: int, threads: Threads) -> None:
        await self.reconfigure(concurrency=concurrency, threads=threads)

    async def acquire(self) -> Instance:
        """Wait for an idle instance of the current generation."""
        async with self._available:
            await self._available.wait_for(lambda: bool(self._idle) or self._closed)
            if self._closed:
                raise asyncio.CancelledError("instance pool closed")
            inst = self._idle.popleft()
            self._busy.add(inst)
            return inst

    async def release(self, inst: Instance) -> None:
        self._busy.discard(inst)
        if inst.retired:
            # A reconfiguration took it out of service while it ran a batch: now that the batch
            # is done nothing references it, and a switch back may want it.
            await self._park([inst])
            return
        async with self._available:
            self._idle.append(inst)
            self._available.notify()

    async def reconfigure(self, *, concurrency: int, threads: Threads) -> None:
        """Make the active set ``concurrency`` instances with ``threads``; returns once the new
        instances serve. Concurrent calls are applied one after the other."""
        async with self._reconfigure_lock:
            await self._expire()
            self._target = concurrency
            if threads != self._threads:
                await self._replace_all(concurrency, threads)
            elif concurrency > len(self._active):
                await self._grow(concurrency - len(self._active))
            elif concurrency < len(self._active):
                await self._shrink(len(self._active) - concurrency)

    def abandon(self, inst: Instance, call: asyncio.Future[Any]) -> None:
        """Take a busy instance whose ``call`` is stuck out of service for good: it is never
        handed out again. The call cannot be stopped (a Python thread cannot be killed), so it
        keeps its executor thread; if it ever returns, the runtime is closed then."""
        self._busy.discard(inst)
        inst.retired = True
        if inst in self._active:
            self._active.remove(inst)
        self._stuck.add(inst)
        self._stuck_calls.held += 1
        call.add_done_callback(lambda done: self._stuck_call_returned(inst, done))

    async def replenish(self) -> int:
        """Build instances (off the loop, warmed) until the set is back at the concurrency asked
        for, e.g. after ``abandon``; returns how many were built."""
        async with self._reconfigure_lock:
            await self._expire()
            missing = self._target - len(self._active)
            if missing <= 0 or self._closed or self._threads is None:
                return 0
            await self._grow(missing)
            return missing

    async def close(self) -> None:
        async with self._reconfigure_lock:
            self._closed = True
            if self._park_timer is not None:
                self._park_timer.cancel()
                await asyncio.gather(self._park_timer, return_exceptions=True)
            idle = list(self._idle)
            self._idle.clear()
            parked = [inst for _, inst in self._parked]
            self._parked.clear()
            for inst in self._active:
                inst.retired = True
            self._active = []
            async with self._available:
                self._available.notify_all()
            await self._close(idle + parked)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def _replace_all(self, concurrency: int, threads: Threads) -> None:
        self._generation += 1
        fresh, reused = await self._build(concurrency, threads, self._generation)
        old = self._active
        async with self._available:
            for inst in old:
                inst.retired = True
            idle_old = [inst for inst in self._idle if inst.retired]
            self._idle = deque(inst for inst in self._idle if not inst.retired)
            self._idle.extend(fresh)
            self._active = list(fresh)
            self._threads = threads
            self._available.notify_all()
        await self._park(idle_old)
        log.info(
            "model %s: %d instance(s) with intra=%d inter=%d threads now serving "
            "(generation %d; %d reused, %d built)",
            self._name,
            concurrency,
            threads.intra_op,
            threads.inter_op,
            self._generation,
            reused,
            concurrency - reused,
        )

    async def _grow(self, n: int) -> None:
        assert self._threads is not None
        fresh, reused = await self._build(n, self._threads, self._generation)
        async with self._available:
            self._active.extend(fresh)
            self._idle.extend(fresh)
            self._available.notify_all()
        log.info(
            "model %s: %d instance(s) now serving (%d reused, %d built)",
            self._name,
            len(self._active),
            reused,
            n - reused,
        )

    async def _shrink(self, n: int) -> None:
        # Prefer idle instances so that running batches keep theirs; busy ones are retired and
        # parked by ``release`` when their batch ends.
        async with self._available:
            victims: list[Instance] = []
            # The newest ``n`` idle ones (none for n <= 0: a [-0:] slice would take them all).
            for inst in list(self._idle)[-n:] if n > 0 else []:
                victims.append(inst)
            for inst in reversed(self._active):
                if len(victims) == n:
                    break
                if inst not in victims:
                    victims.append(inst)
            for inst in victims:
                inst.retired = True
            self._active = [inst for inst in self._active if not inst.retired]
            idle_victims = [inst for inst in self._idle if inst.retired]
            self._idle = deque(inst for inst in self._idle if not inst.retired)
        await self._park(idle_victims)

    async def _build(self, n: int, threads: Threads, generation: int) -> tuple[list[Instance], int]:
        """``n`` instances with ``threads``: parked ones first (warmed when they were built),
        then new ones; returns them and how many were parked."""
        reused = self._unpark(n, threads)
        for inst in reused:
            inst.generation = generation
            inst.retired = False
        loop = asyncio.get_running_loop()
        built: list[Instance] = []
        try:
            for _ in range(n - len(reused)):
                # Session creation and warm-up block for milliseconds to seconds: executor.
                runtime = await loop.run_in_executor(self._executor, self._create_warm, threads)
                built.append(Instance(runtime, threads, generation, next(self._ids)))
        except BaseException:
            await self._close(built)
            await self._park(reused)  # still sound: the configuration may yet come back
            raise
        return reused + built, len(reused)

    def _unpark(self, n: int, threads: Threads) -> list[Instance]:
        taken = [inst for _, inst in self._parked if inst.threads == threads][:n]
        if taken:
            self._parked = deque(entry for entry in self._parked if entry[1] not in taken)
        return taken

    async def _park(self, instances: list[Instance]) -> None:
        """Keep instances a reconfiguration took out of service; close what the bounds drop."""
        if self._closed or self._park_limit <= 0:
            await self._close(instances)
            return
        now = self._clock()
        for inst in instances:
            inst.retired = True
            self._parked.append((now, inst))
        dropped = self._take_expired(now)
        while len(self._parked) > self._park_limit:
            dropped.append(self._parked.popleft()[1])
        if self._parked and (self._park_timer is None or self._park_timer.done()):
            self._park_timer = asyncio.create_task(self._expire_on_time(), name="parked-ttl")
        await self._close(dropped)

    def _expires_in(self, parked_at: float, now: float) -> float:
        # The one test of age, so that the timer and ``_take_expired`` never disagree.
        return parked_at + self._park_ttl_s - now

    def _take_expired(self, now: float) -> list[Instance]:
        expired: list[Instance] = []
        while self._parked and self._expires_in(self._parked[0][0], now) <= 0:
            expired.append(self._parked.popleft()[1])
        return expired

    async def _expire(self) -> None:
        await self._close(self._take_expired(self._clock()))

    async def _expire_on_time(self) -> None:
        """Close parked instances as they age out even when the pool is left alone. Owned by
        ``close``, which cancels it; the closing itself runs in tasks ``close`` awaits, so a
        cancel never leaves an expired instance open."""
        while self._parked:
            now = self._clock()
            wait = self._expires_in(self._parked[0][0], now)
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                self._close_in_background(self._take_expired(now), "expired parked")

    def _create_warm(self, threads: Threads) -> Runtime:
        runtime = self._factory(threads)
        if self.metadata is None:
            self.metadata = runtime.metadata
        try:
            for rows in self._warmup_batch_sizes:
                sample = warmup_inputs(runtime.metadata, rows)
                if sample is not None:
                    runtime.infer(sample)
        except Exception:
            runtime.close()
            raise
        return runtime

    def _stuck_call_returned(self, inst: Instance, call: asyncio.Future[Any]) -> None:
        self._stuck.discard(inst)
        self._stuck_calls.held -= 1
        if not call.cancelled() and call.exception() is not None:
            log.info("an abandoned runtime call returned with: %r", call.exception())
        self._close_in_background([inst], "abandoned")

    def _close_in_background(self, instances: list[Instance], what: str) -> None:
        # The closing task is owned here and awaited by ``close``.
        task = asyncio.create_task(self._close_quietly(instances, what), name=f"close {what}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, instances: list[Instance], what: str) -> None:
        try:
            await self._close(instances)
        except Exception:  # the executor may be shut down already: nothing else to release
            log.warning("could not close %s runtime instance(s)", what, exc_info=True)

    @property
    def _name(self) -> str:
        return self.metadata.name if self.metadata else "?"

    async def _close(self, instances: list[Instance]) -> None:
        if not instances:
            return
        loop = asyncio.get_running_loop()
        for inst in instances:
            # Closing a TF session joins its thread pools: keep it off the loop.
            await loop.run_in_executor(self._executor, inst.runtime.close)


def warmup_inputs(metadata: ModelMetadata, rows: int) -> dict[str, np.ndarray] | None:
    """Zeros of every input with ``rows`` rows (variable dims as 1); None when an input is not
    numeric (strings have no neutral value a model is sure to accept)."""
    sample: dict[str, np.ndarray] = {}
    for spec in metadata.inputs:
        dtype = np.dtype(spec.dtype)
        if dtype.kind not in "biuf":
            return None
        shape = (rows, *(d if d > 0 else 1 for d in spec.shape[1:]))
        sample[spec.name] = np.zeros(shape, dtype=dtype)
    return sample
