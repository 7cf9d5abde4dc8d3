"""The control protocol: all the online agent needs from a gateway, and nothing else.

``gateway.service.InferenceService`` satisfies ``ModelControl`` structurally (its ``knobs``,
``set_knobs`` and ``stats`` methods), so ``rrl`` never imports the gateway. The helpers below
translate between that surface and the tuner's vocabulary (``Config``, ``Measurement``).

One decision interval of an online loop, for one model::

    config = tuner.propose()
    await apply_config(service, model, config)               # knob changes; returns when in effect
    await asyncio.sleep(interval_s)
    measurement = measure(service, model, interval_s)        # the gateway's window snapshot
    tuner.observe(current_config(service, model, space), measurement)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from rrl.measurement import Measurement, WindowStatsView
from rrl.space import Config, ConfigSpace, KnobsView


class ModelControl(Protocol):
    """Setters plus a metrics snapshot, per model (``version`` None: the served default)."""

    def knobs(self, model: str, version: int | str | None = None) -> KnobsView: ...

    async def set_knobs(
        self, model: str, version: int | str | None, changes: dict[str, object]
    ) -> KnobsView: ...

    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStatsView: ...


@runtime_checkable
class ServiceTimesSource(Protocol):
    """A gateway that also reports its recent batch service times (seconds per batch, by batch
    size bucket: the key is the bucket's largest batch), which the agent's queueing model needs.
    Optional: without it the agent predicts nothing and keeps its incumbent."""

    def service_samples(
        self, model: str, version: int | str | None = None
    ) -> Mapping[int, Sequence[float]]: ...


def service_samples(control: ModelControl, model: str) -> Mapping[int, Sequence[float]]:
    """The model's recent batch service times, or nothing when the gateway does not say."""
    if isinstance(control, ServiceTimesSource):
        return control.service_samples(model)
    return {}


@runtime_checkable
class FrontEndSource(Protocol):
    """A gateway that also reports what its event loop spends per request (CPU seconds, over
    its recent requests of every model), which the queueing model charges on its one loop.
    Optional: without it the model keeps its prior."""

    def front_end_s(self) -> float | None: ...


def front_end_s(control: ModelControl) -> float | None:
    """The event loop's CPU per request lately, or None when the gateway does not say (yet)."""
    if isinstance(control, FrontEndSource):
        return control.front_end_s()
    return None


def current_config(control: ModelControl, model: str, space: ConfigSpace) -> Config:
    """The model's knobs now, on the grid (snapped if they were set off it)."""
    return space.snap(Config.from_knobs(control.knobs(model)))


async def apply_config(control: ModelControl, model: str, config: Config) -> Config:
    """Set all five knobs; returns once the gateway has them in effect (a thread or concurrency
    change rebuilds runtime instances first, so this can take a while)."""
    changes: dict[str, object] = {**config.knob_changes()}
    knobs = await control.set_knobs(model, None, changes)
    return Config.from_knobs(knobs)


def measure(
    control: ModelControl, model: str, window_s: float, *, cpu_cores: float | None = None
) -> Measurement:
    """The last ``window_s`` seconds of the model's traffic as a measurement."""
    return Measurement.from_window_stats(
        control.stats(model, window_s=window_s), cpu_cores=cpu_cores
    )
