"""The watchdog on runtime calls: a batch's backend call that does not return in time.

A batch's runtime call blocks an executor thread for as long as the backend takes, and Python
cannot stop a thread from outside. The watchdog times each call from the moment a thread starts
it (a busy executor is no fault of the instance) and gives up on it past ``limit_s``: the batch
fails with 504 (``BatchTimeout``), the batcher has the pool abandon the instance, and the model
host replaces it. Each abandoned call keeps its thread until the backend returns, if it ever
does, so replacements stop at ``max_stuck`` stuck calls of one model, or when stuck calls of all
models hold ``StuckCalls.limit`` threads: the model is marked unavailable instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from gateway.errors import BatchTimeout

log = logging.getLogger("gateway.batcher")

Inputs = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]


class StuckCalls:
    """Executor threads held by runtime calls the watchdog gave up on, across every model of the
    process; ``limit`` bounds how many may be held before models stop getting replacement
    instances, so that stuck calls cannot take the whole executor."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    @property
    def full(self) -> bool:
        return self.held >= self.limit


@dataclass(frozen=True, slots=True)
class WatchdogLimits:
    """How long a runtime call may run, and how many stuck calls a model may leave behind."""

    limit_s: float = 30.0
    max_stuck: int = 2
    stuck_calls: StuckCalls | None = None  # shared by every model of the process

    def why_not_replace(self, model_stuck: int, process: StuckCalls) -> str | None:
        """Why a model with ``model_stuck`` stuck calls gets no replacement instance (and is
        marked unavailable), or None when it may have one."""
        if model_stuck < self.max_stuck and not process.full:
            return None
        held = max(model_stuck, process.held)
        return (
            f"{held} runtime call(s) stuck past the {self.limit_s:g} s watchdog limit still "
            "hold executor threads; restart the gateway once the backend is fixed"
        )


@dataclass(slots=True)
class RuntimeCall:
    """A batch's runtime call, handed to the executor."""

    done: asyncio.Future[tuple[Outputs, float]] = field(init=False)
    began_at: float | None = None  # set on the watchdog's clock when a thread starts the call


class CallWatchdog:
    """Runs one model version's batch calls on ``executor`` and watches each one: ``wait``
    returns the call's outputs and duration, or None once it ran ``limit_s`` from its start;
    ``give_up`` then says so (log line, ``on_stuck``) and builds the batch's error."""

    def __init__(
        self,
        *,
        name: str,
        executor: Executor,
        limit_s: float = 30.0,
        on_stuck: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._executor = executor
        self.limit_s = limit_s
        self._on_stuck = on_stuck
        self._clock = clock

    def start(self, infer: Callable[[Inputs], Outputs], inputs: Inputs) -> RuntimeCall:
        loop = asyncio.get_running_loop()
        call = RuntimeCall()
        clock = self._clock

        def mark_start() -> None:
            # Runs on the executor thread as the call starts. A plain store, read only when the
            # watchdog's timer fires: waking the loop for it cost every batch a pass of the
            # loop, most of a trickle's.
            call.began_at = clock()

        call.done = loop.run_in_executor(self._executor, timed_call, infer, inputs, mark_start)
        return call

    async def wait(self, call: RuntimeCall) -> tuple[Outputs, float] | None:
        """The call's result, or None when it runs past the limit counted from its start (it
        keeps running: a thread cannot be stopped from outside)."""
        wait = self.limit_s
        while True:
            finished, _ = await asyncio.wait((call.done,), timeout=wait)
            if finished:
                return call.done.result()
            began = call.began_at
            if began is None:  # still waiting for an executor thread: not the instance's fault
                wait = self.limit_s
                continue
            wait = began + self.limit_s - self._clock()
            if wait <= 0:
                return None

    def give_up(self, rows: int) -> BatchTimeout:
        """Report a call ``wait`` gave up on, once the pool abandoned its instance; the error
        to fail its batch with."""
        log.error(
            "model %s: a batch of %d rows ran past the %g s watchdog limit; its runtime "
            "instance is abandoned (its thread cannot be stopped) and replaced",
            self.name,
            rows,
            self.limit_s,
        )
        if self._on_stuck is not None:
            self._on_stuck()
        return BatchTimeout(
            f"model {self.name}: the backend did not finish the batch within the "
            f"{self.limit_s:g} s watchdog limit (serving.batch_watchdog_s)"
        )


def timed_call(
    fn: Callable[[Inputs], Outputs], inputs: Inputs, on_start: Callable[[], None]
) -> tuple[Outputs, float]:
    """What an executor thread runs for a batch: ``fn(inputs)`` and how long it took."""
    on_start()
    started = time.perf_counter()
    outputs = fn(inputs)
    return outputs, time.perf_counter() - started
