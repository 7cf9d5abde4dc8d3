"""Synthetic landscapes with a known optimum, for tests and sanity checks of the tuners.

A landscape is a function of index coordinates; ``measure`` turns its value (plus optional
Gaussian noise) into a ``Measurement`` whose latency objective is exactly that value (p95 = value,
no violations), so a tuner built with ``LatencyObjective`` optimizes the landscape itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from models.knobs import Knobs
from rrl.tuners.measurement import Measurement
from rrl.tuners.space import ConfigSpace


@dataclass
class Landscape:
    space: ConfigSpace
    values: np.ndarray
    """The noiseless objective of every configuration (flat order)."""
    noise_sd: float = 0.0
    rng: np.random.Generator | None = None

    @classmethod
    def from_function(
        cls,
        space: ConfigSpace,
        f: Callable[[np.ndarray], np.ndarray],
        *,
        noise_sd: float = 0.0,
        seed: int = 0,
    ) -> Landscape:
        """``f`` maps (n, 5) index coordinates to n positive values."""
        return cls(space, np.asarray(f(space.coords), dtype=np.float64), noise_sd, _rng(seed))

    @property
    def optimum(self) -> int:
        return int(np.argmin(self.values))

    @property
    def optimum_value(self) -> float:
        return float(self.values.min())

    def value(self, config: Knobs) -> float:
        return float(self.values[self.space.flat(config)])

    def measure(self, config: Knobs) -> Measurement:
        value = self.value(config)
        if self.noise_sd > 0:
            assert self.rng is not None
            value = max(1e-6, value + float(self.rng.normal(0.0, self.noise_sd)))
        return Measurement(
            duration_s=1.0,
            offered=100,
            completed=100,
            p50_ms=value,
            p95_ms=value,
            p99_ms=value,
            slo_violations=0,
            rejected=0,
            mean_ms=value,
        )


def cone(
    optimum: np.ndarray, *, lipschitz: float, floor: float
) -> Callable[[np.ndarray], np.ndarray]:
    """floor + L * |x - optimum|: exactly L-Lipschitz (Euclidean) with its minimum at optimum."""

    def f(x: np.ndarray) -> np.ndarray:
        return floor + lipschitz * np.sqrt(((x - optimum) ** 2).sum(axis=1))

    return f


def random_lipschitz(
    space: ConfigSpace, *, lipschitz: float, floor: float, cones: int, seed: int
) -> Callable[[np.ndarray], np.ndarray]:
    """The lower envelope of ``cones`` L-Lipschitz cones at random points with random offsets:
    L-Lipschitz, several local minima, a known global one."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, np.array(space.shape) - 1, size=(cones, len(space.shape)))
    offsets = rng.uniform(0, 3 * lipschitz, size=cones)
    offsets[0] = 0.0

    def f(x: np.ndarray) -> np.ndarray:
        d = np.sqrt(((x[:, None, :] - centres[None, :, :]) ** 2).sum(axis=2))
        return floor + (offsets[None, :] + lipschitz * d).min(axis=1)

    return f


def bowl(optimum: np.ndarray, *, scale: float, floor: float) -> Callable[[np.ndarray], np.ndarray]:
    """A smooth quadratic bowl: every hill climber and model-based search finds its bottom."""

    def f(x: np.ndarray) -> np.ndarray:
        return floor + scale * ((x - optimum) ** 2).sum(axis=1)

    return f


def rugged(
    space: ConfigSpace, smooth: Callable[[np.ndarray], np.ndarray], *, spread: float, seed: int
) -> Callable[[np.ndarray], np.ndarray]:
    """``smooth`` times a fixed log-normal factor per configuration (``spread`` its log sd): what
    a profile of tail latencies looks like, where configurations that behave alike differ by
    which few requests stalled while each was measured. Neighbours predict each other only
    roughly, and the optimum is wherever the smooth trend and a lucky factor meet."""
    factors = np.exp(np.random.default_rng(seed).normal(0.0, spread, size=space.size))

    def f(x: np.ndarray) -> np.ndarray:
        return smooth(x) * factors

    return f


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)
