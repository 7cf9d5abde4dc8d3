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

Either way it is at most that lowest figure. Without the fit, a quiet start charged every
request with the loop's fixed work, and the agent's model then predicted a p95 many times what
the gateway measured at a higher rate (rrl/README, "Measurements behind the rules").

The loop also works per batch (forming it, the executor's crossing and wake-up, the fan-out),
which the model charges apart (its ``per_batch_s``): asked with that cost, the meter nets it
out of each stretch's CPU by the batches the stretch dispatched, so that the same work is not
charged twice, once per batch and again spread over the requests of the batch sizes that ran
while it measured.
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
    batches: int = 0


def per_request_cost(stretches: Sequence[Stretch], per_batch_s: float = 0.0) -> float | None:
    """The loop's CPU per request net of its fixed work per second and of ``per_batch_s`` per
    batch dispatched (see the module); never below zero."""
    if not stretches:
        return None
    per_request = np.array(
        [max(s.cpu_s - per_batch_s * s.batches, 0.0) / s.requests for s in stretches]
    )
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
    """``requests`` and ``batches``: counters of the requests that reached the models and the
    batches they ran in, since the start."""

    def __init__(
        self,
        requests: Callable[[], int],
        batches: Callable[[], int] = lambda: 0,
        *,
        min_requests: int = MIN_REQUESTS,
        clock: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self._requests = requests
        self._batches = batches
        self._min_requests = min_requests
        self._clock = clock
        self._wall = wall
        self._thread: int | None = None
        self._since: tuple[float, float, int, int] | None = None
        self._stretches: deque[Stretch] = deque(maxlen=STRETCHES)
        self._estimate: tuple[float, float | None] | None = None  # (per batch, per request)

    def per_request_s(self, per_batch_s: float = 0.0) -> float | None:
        """CPU seconds the loop spent per request, net of ``per_batch_s`` per batch (see the
        module); None until a stretch of at least ``min_requests`` requests has passed."""
        me = threading.get_ident()
        if self._thread is None:
            self._thread = me
        if me == self._thread:
            now = (self._clock(), self._wall(), self._requests(), self._batches())
            if self._since is None:
                self._since = now
            elif now[2] - self._since[2] >= self._min_requests:
                cpu, wall, n, batches = (a - b for a, b in zip(now, self._since, strict=True))
                self._stretches.append(Stretch(cpu, wall, int(n), int(batches)))
                self._since = now
                self._estimate = None
        if self._stretches and (self._estimate is None or self._estimate[0] != per_batch_s):
            self._estimate = (per_batch_s, per_request_cost(self._stretches, per_batch_s))
        return None if self._estimate is None else self._estimate[1]
