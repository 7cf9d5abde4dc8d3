"""The control protocol: all the online agent needs from a gateway, and nothing else.

``gateway.tuning.AgentControl`` implements ``ModelControl`` over the gateway's service, so
``rrl`` never imports the gateway. The knobs and window statistics are the ground floor's
(``models.knobs``, ``models.window_stats``); ``measure`` turns a window into a ``Measurement``.

One decision interval of an online loop, for one model::

    config = tuner.propose()
    await control.set_knobs(model, None, config)             # returns when in effect
    await asyncio.sleep(interval_s)
    measurement = measure(control, model, interval_s)        # the gateway's window snapshot
    tuner.observe(current_config(control, model, space), measurement)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from models.knobs import Knobs
from models.window_stats import WindowStats
from rrl.tuners.measurement import Measurement
from rrl.tuners.space import ConfigSpace


class ModelControl(ABC):
    """Setters plus a metrics snapshot, per model (``version`` None: the served default).
    ``gateway.tuning.AgentControl`` is the implementation."""

    @abstractmethod
    def knobs(self, model: str, version: int | str | None = None) -> Knobs: ...

    @abstractmethod
    async def set_knobs(self, model: str, version: int | str | None, knobs: Knobs) -> Knobs:
        """Set all five knobs; returns the knobs in effect once they are (a thread or
        concurrency change rebuilds runtime instances first, so this can take a while)."""

    @abstractmethod
    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStats: ...

    def service_samples(
        self, model: str, version: int | str | None = None
    ) -> Mapping[int, Sequence[float]]:
        """Recent batch service times (seconds per batch, by batch size bucket: the key is the
        bucket's largest batch), which the agent's queueing model needs. Without them (this
        default) the agent predicts nothing and keeps its incumbent."""
        return {}

    def front_end_s(self, per_batch_s: float = 0.0) -> float | None:
        """What the event loop spends per request (CPU seconds, over its recent requests of
        every model) besides ``per_batch_s`` per batch, which the queueing model charges on
        its one loop; None (this default) while unknown, and the model keeps its prior."""
        return None


def current_config(control: ModelControl, model: str, space: ConfigSpace) -> Knobs:
    """The model's knobs now, on the grid (snapped if they were set off it)."""
    return space.snap(control.knobs(model))


def measure(
    control: ModelControl, model: str, window_s: float, *, cpu_cores: float | None = None
) -> Measurement:
    """The last ``window_s`` seconds of the model's traffic as a measurement."""
    return Measurement.from_window_stats(
        control.stats(model, window_s=window_s), cpu_cores=cpu_cores
    )
