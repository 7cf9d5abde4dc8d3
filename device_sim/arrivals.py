"""Arrival processes: when requests are offered, as time offsets from the start of a phase.

Every process draws from a caller-supplied ``numpy.random.Generator`` so a seed reproduces a run's
schedule exactly. Each returns a sorted float64 array of offsets in ``[0, duration_s)``; the load is
open-loop (arrivals do not wait for replies), which is how independent devices behave.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class ArrivalProcess(Protocol):
    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        """Sorted arrival offsets (seconds) within ``[0, duration_s)``."""
        ...

    def mean_rate(self) -> float:
        """Long-run mean arrival rate (requests/s), for sizing and reports."""
        ...


def _check_rate(rate: float, what: str = "rate") -> None:
    if not (math.isfinite(rate) and rate >= 0):
        raise ValueError(f"{what} must be a finite number >= 0, got {rate!r}")


def _poisson_segment(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    # Given the count, the arrival times of a homogeneous Poisson process are independent and
    # uniform on the interval: one Poisson draw plus a sort, instead of a loop over gaps.
    if end <= start or rate == 0:
        return np.empty(0)
    n = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, n))


@dataclass(frozen=True, slots=True)
class Constant:
    """Evenly spaced arrivals, ``rate`` per second, the first at offset 0."""

    rate: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        if self.rate == 0:
            return np.empty(0)
        # ceil(d*r - tiny): 50/s for 4 s is exactly 200 arrivals, not 201 from float noise.
        n = max(0, math.ceil(duration_s * self.rate - 1e-9))
        return np.arange(n, dtype=np.float64) / self.rate

    def mean_rate(self) -> float:
        return self.rate


@dataclass(frozen=True, slots=True)
class Poisson:
    """Independent arrivals at mean ``rate`` per second (exponential gaps)."""

    rate: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        return _poisson_segment(rng, self.rate, 0.0, duration_s)

    def mean_rate(self) -> float:
        return self.rate


@dataclass(frozen=True, slots=True)
class OnOff:
    """Bursts: Poisson at ``rate`` for ``on_s`` seconds, then at ``off_rate`` (default silence)
    for ``off_s`` seconds, repeating from an on period."""

    rate: float
    on_s: float
    off_s: float
    off_rate: float = 0.0

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        _check_rate(self.off_rate, "off_rate")
        if not (self.on_s > 0 and self.off_s >= 0):
            raise ValueError(f"on_s must be > 0 and off_s >= 0, got {self.on_s}, {self.off_s}")

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        parts: list[np.ndarray] = []
        t = 0.0
        while t < duration_s:
            on_end = min(t + self.on_s, duration_s)
            parts.append(_poisson_segment(rng, self.rate, t, on_end))
            off_end = min(on_end + self.off_s, duration_s)
            parts.append(_poisson_segment(rng, self.off_rate, on_end, off_end))
            t = off_end
        return np.concatenate(parts) if parts else np.empty(0)

    def mean_rate(self) -> float:
        cycle = self.on_s + self.off_s
        return (self.rate * self.on_s + self.off_rate * self.off_s) / cycle


@dataclass(frozen=True, slots=True)
class Diurnal:
    """Poisson arrivals whose rate follows a sine: ``rate * (1 + amplitude*sin(2πt/period_s))``,
    a day compressed into ``period_s`` seconds. ``amplitude`` in [0, 1]."""

    rate: float
    amplitude: float
    period_s: float

    def __post_init__(self) -> None:
        _check_rate(self.rate)
        if not 0 <= self.amplitude <= 1:
            raise ValueError(f"amplitude must be in [0, 1], got {self.amplitude}")
        if not self.period_s > 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        return self.rate * (1 + self.amplitude * np.sin(2 * np.pi * t / self.period_s))

    def sample(self, rng: np.random.Generator, duration_s: float) -> np.ndarray:
        # Thinning (Lewis & Shedler): draw at the peak rate, keep each arrival with probability
        # rate(t)/peak. Exact for any bounded rate function.
        peak = self.rate * (1 + self.amplitude)
        candidates = _poisson_segment(rng, peak, 0.0, duration_s)
        if peak == 0:
            return candidates
        keep = rng.uniform(0, 1, candidates.size) < self.rate_at(candidates) / peak
        return candidates[keep]

    def mean_rate(self) -> float:
        return self.rate


_PROCESSES: dict[str, type] = {
    "constant": Constant,
    "poisson": Poisson,
    "onoff": OnOff,
    "diurnal": Diurnal,
}


def process_class(kind: str) -> type:
    try:
        return _PROCESSES[kind]
    except KeyError:
        raise ValueError(
            f"unknown arrival process {kind!r}; expected one of {sorted(_PROCESSES)}"
        ) from None


def process_parameters(kind: str) -> tuple[list[str], list[str]]:
    """(required, optional) parameter names of the process ``kind``."""
    fields = dataclasses.fields(process_class(kind))
    required = [f.name for f in fields if f.default is dataclasses.MISSING]
    return required, [f.name for f in fields if f.default is not dataclasses.MISSING]


def make_process(kind: str, params: dict[str, float]) -> ArrivalProcess:
    """Build a process from its name and parameters (the scenario file and CLI share this);
    an unknown or missing parameter is a ValueError naming it and the valid ones."""
    required, optional = process_parameters(kind)
    unknown = sorted(set(params) - set(required) - set(optional))
    if unknown:
        raise ValueError(
            f"unknown key {', '.join(map(repr, unknown))} for a {kind!r} process; "
            f"its parameters: {', '.join(required + optional)}"
        )
    missing = [name for name in required if name not in params]
    if missing:
        raise ValueError(f"a {kind!r} process needs {', '.join(map(repr, missing))}")
    process: ArrivalProcess = process_class(kind)(**params)
    return process


def describe_process(process: ArrivalProcess) -> tuple[str, dict[str, float]]:
    """(name, parameters) of a process, as a scenario file would write it."""
    names = {cls: name for name, cls in _PROCESSES.items()}
    kind = names.get(type(process), type(process).__name__)
    if dataclasses.is_dataclass(process) and not isinstance(process, type):
        return kind, {k: float(v) for k, v in dataclasses.asdict(process).items()}
    return kind, {}
