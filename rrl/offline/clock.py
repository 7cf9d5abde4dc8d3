"""The profiling harness's clock and the queues its threads wait on, as one seam.

The harness (``rrl.offline.harness``) decides on the wall clock: its dispatcher waits for the
next arrival or timer or for an instance to return a batch, whichever comes first, and its
instances' threads time their runtime calls. Every read of the time and every wait goes through
a ``Clock`` so that a test can run the same threads on virtual time
(``tests/rrl/thread_clock.py``), where a decision cannot move with how busy the machine is.
Profiling uses ``WallClock``.
"""

from __future__ import annotations

import math
import queue
import time
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Channel(Protocol[T]):
    """A queue between the harness's threads whose waits its clock can see."""

    def put(self, item: T) -> None: ...

    def get(self, until: float = math.inf) -> T:
        """The next item; waits until the clock reads ``until`` at most, then raises
        ``queue.Empty`` (``math.inf``: waits as long as it takes)."""
        ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def sleep_until(self, t: float) -> None: ...

    def channel(self) -> Channel[T]: ...

    def thread_started(self) -> None:
        """Called by a thread before it starts another that reads this clock: the new thread
        takes part from that moment, before it first runs."""
        ...

    def thread_ended(self) -> None:
        """Called by a thread that took part, as its last act."""
        ...


class _WallChannel(Generic[T]):
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()

    def put(self, item: T) -> None:
        self._queue.put(item)

    def get(self, until: float = math.inf) -> T:
        if until == math.inf:
            return self._queue.get()
        wait = until - time.perf_counter()
        return self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()


class WallClock:
    """``time.perf_counter``, real sleeps and ``queue.SimpleQueue``."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, t: float) -> None:
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)

    def channel(self) -> Channel[T]:
        return _WallChannel()

    def thread_started(self) -> None:
        pass  # real threads need no bookkeeping

    def thread_ended(self) -> None:
        pass
