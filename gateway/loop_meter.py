"""What the gateway's event loop spends per request: the CPU of the loop's own thread over the
requests that reached the models meanwhile. The tuner's queueing model (``rrl.queueing``)
charges it on one serial server, so that more instances are not predicted to bring more front
ends.

Read on the loop's thread (``time.thread_time`` counts the calling thread only): the agents ask
from the loop between their windows. A reading from any other thread returns the last value.
Each stretch of at least ``min_requests`` requests gives one figure, and the estimate is the
lowest of the last ``STRETCHES``: the loop also has work that does not grow with requests (its
timers, the agents' own windows, metrics scrapes), which a slow stretch spreads over few
requests (1.8 ms a request at 50 requests/s on sensor_mlp, against about 0.3 ms in a burst),
and the busiest recent stretch is the one it inflates least.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

MIN_REQUESTS = 200
STRETCHES = 8


class LoopMeter:
    def __init__(
        self,
        requests: Callable[[], int],
        *,
        min_requests: int = MIN_REQUESTS,
        clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._requests = requests
        self._min_requests = min_requests
        self._clock = clock
        self._thread: int | None = None
        self._since: tuple[float, int] | None = None
        self._stretches: deque[float] = deque(maxlen=STRETCHES)

    def per_request_s(self) -> float | None:
        """CPU seconds the loop spent per request: the lowest over the recent stretches of at
        least ``min_requests`` requests; None until one has passed."""
        me = threading.get_ident()
        if self._thread is None:
            self._thread = me
        if me == self._thread:
            now = (self._clock(), self._requests())
            if self._since is None:
                self._since = now
            elif now[1] - self._since[1] >= self._min_requests:
                self._stretches.append((now[0] - self._since[0]) / (now[1] - self._since[1]))
                self._since = now
        return min(self._stretches) if self._stretches else None
