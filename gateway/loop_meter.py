"""What the gateway's event loop spends per request: the CPU of the loop's own thread over the
requests that reached the models meanwhile. The tuner's queueing model (``rrl.agent.queueing``)
charges it on one serial server, so that more instances are not predicted to bring more front
ends.

Read on the loop's thread (``time.thread_time`` counts the calling thread only): the agents ask
from the loop between their windows. A reading from any other thread returns the last value.
Each stretch of at least ``min_requests`` requests gives its CPU, its wall time and its
requests. The loop also has work that does not grow with requests (its timers, the agents' own
windows, metrics scrapes): a stretch's CPU per request is ``per_request + fixed / rate``, 1.8 ms
at 50 requests/s on sensor_mlp against about 0.3 ms in a burst. So over the recent stretches:

- when their rates differ by ``MIN_RATE_SPREAD`` or more, the cost per request is the intercept
  of that line: the CPU per request fitted by least squares on the seconds per request
  (``1 / rate``), when both the intercept and the slope (the fixed work) come out positive;
- otherwise (rates too alike, or a fit the noise bent) the fixed work cannot be told apart from
  the requests', and the estimate is the lowest CPU per request of the stretches: an upper
  bound, since the fixed work is never negative.

Either way it is at most that lowest figure. Without the fit, a quiet start (a diurnal night at
60-160 requests/s) read 0.6 ms a request, and the agent's model then predicted 38 ms of p95 at
650 requests/s where the gateway measured 1.5 ms.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_REQUESTS = 200
STRETCHES = 16
MIN_RATE_SPREAD = 2.0
MIN_FIT_STRETCHES = 4


@dataclass(frozen=True, slots=True)
class Stretch:
    cpu_s: float
    wall_s: float
    requests: int


def per_request_cost(stretches: Sequence[Stretch]) -> float | None:
    """The loop's CPU per request net of its fixed work per second (see the module)."""
    if not stretches:
        return None
    per_request = np.array([s.cpu_s / s.requests for s in stretches])
    seconds_per_request = np.array([max(s.wall_s, 1e-9) / s.requests for s in stretches])
    upper = float(per_request.min())
    spread = seconds_per_request.max() / seconds_per_request.min()
    if len(stretches) < MIN_FIT_STRETCHES or spread < MIN_RATE_SPREAD:
        return upper
    slope, intercept = np.polyfit(seconds_per_request, per_request, 1)
    if slope <= 0 or intercept <= 0:
        return upper
    return min(float(intercept), upper)


class LoopMeter:
    def __init__(
        self,
        requests: Callable[[], int],
        *,
        min_requests: int = MIN_REQUESTS,
        clock: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self._requests = requests
        self._min_requests = min_requests
        self._clock = clock
        self._wall = wall
        self._thread: int | None = None
        self._since: tuple[float, float, int] | None = None
        self._stretches: deque[Stretch] = deque(maxlen=STRETCHES)
        self._estimate: float | None = None

    def per_request_s(self) -> float | None:
        """CPU seconds the loop spent per request (see the module); None until a stretch of at
        least ``min_requests`` requests has passed."""
        me = threading.get_ident()
        if self._thread is None:
            self._thread = me
        if me == self._thread:
            now = (self._clock(), self._wall(), self._requests())
            if self._since is None:
                self._since = now
            elif now[2] - self._since[2] >= self._min_requests:
                cpu, wall, n = (a - b for a, b in zip(now, self._since, strict=True))
                self._stretches.append(Stretch(cpu, wall, int(n)))
                self._since = now
                self._estimate = per_request_cost(self._stretches)
        return self._estimate
