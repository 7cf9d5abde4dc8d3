"""Virtual time for threads: ``rrl.offline.clock.Clock`` for a test of the profiling harness.

The clock moves only when every thread taking part waits on it (a sleep, or a channel's get)
and no item put into a channel is still untaken: then it jumps to the earliest time any of them
waits for. A runtime that "takes 50 ms" sleeps 50 ms on this clock and takes exactly that, so
the harness's decisions are the same on a busy machine as on a quiet one, and the test takes no
real time waiting.

Threads that take part: the one that made the clock, and each thread announced by
``thread_started`` before it starts, until its ``thread_ended``.
"""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from rrl.offline.clock import Channel

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Every thread waits, nothing is queued, and no wait has an end: time cannot move."""


class ThreadClock:
    def __init__(self, start: float = 100.0) -> None:
        self._cond = threading.Condition()
        self._now = start
        self._threads = 1  # the creating thread
        self._waiting: list[float] = []  # each waiting thread's deadline (inf: none)
        self._untaken = 0  # items put into a channel and not yet taken

    def now(self) -> float:
        with self._cond:
            return self._now

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.now() + seconds)

    def sleep_until(self, t: float) -> None:
        with self._cond:
            self._wait(lambda: self._now >= t, t)

    def channel(self) -> Channel[T]:
        return _VirtualChannel(self)

    def thread_started(self) -> None:
        with self._cond:
            self._threads += 1

    def thread_ended(self) -> None:
        with self._cond:
            self._threads -= 1
            self._advance()

    # -- under the lock ------------------------------------------------------------------------

    def _wait(self, ready: Callable[[], bool], deadline: float) -> None:
        """Wait until ``ready()``, counted as waiting for ``deadline`` meanwhile."""
        if ready():
            return
        self._waiting.append(deadline)
        try:
            while not ready():
                self._advance()
                if not ready():
                    self._cond.wait()
        finally:
            self._waiting.remove(deadline)

    def _advance(self) -> None:
        """Move time to the earliest deadline when every thread waits and nothing is queued."""
        if len(self._waiting) < self._threads or self._untaken:
            return
        earliest = min(self._waiting, default=math.inf)
        if earliest == math.inf:
            raise Deadlock(f"{self._threads} thread(s) wait with no deadline and nothing queued")
        if earliest > self._now:
            self._now = earliest
        self._cond.notify_all()


class _VirtualChannel(Generic[T]):
    def __init__(self, clock: ThreadClock) -> None:
        self._clock = clock
        self._items: deque[T] = deque()

    def put(self, item: T) -> None:
        with self._clock._cond:
            self._items.append(item)
            self._clock._untaken += 1
            self._clock._cond.notify_all()

    def get(self, until: float = math.inf) -> T:
        clock = self._clock
        with clock._cond:
            clock._wait(lambda: bool(self._items) or clock._now >= until, until)
            if not self._items:
                raise queue.Empty
            clock._untaken -= 1
            return self._items.popleft()
