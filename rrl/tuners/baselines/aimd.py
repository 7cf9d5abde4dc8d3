"""AIMD on the batch size, after Clipper: grow the maximum batch additively while the SLO holds,
shrink it multiplicatively when it does not. The other knobs stay at the static default; the
batch size is held as a real number and run as the largest grid batch not above it. What it
recommends is its operating point, the last batch size that met the SLO (the additive probe above
it is exploration)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import TuningProblem
from rrl.tuners.measurement import Measurement


@dataclass(frozen=True)
class AIMDSettings:
    additive_step: float = 4.0
    """Rows added after an interval that met the SLO."""
    decrease_factor: float = 0.9
    """Multiplier after an interval that missed it (Clipper backs off by 10%)."""
    violation_tolerance: float = 0.05
    """An interval misses the SLO when more than this fraction of requests violated it (so
    p95 over the SLO, counting refused requests)."""


class AIMD:
    def __init__(
        self,
        problem: TuningProblem,
        rng: np.random.Generator,
        settings: AIMDSettings | None = None,
    ) -> None:
        self.settings = settings or AIMDSettings()
        self.space = problem.space
        self.base = problem.default
        self.batch = float(self.space.batch_sizes[0])
        self.last_good: int | None = None  # the last configuration that met the SLO

    def _current(self) -> int:
        fitting = [b for b in self.space.batch_sizes if b <= self.batch]
        size = fitting[-1] if fitting else self.space.batch_sizes[0]
        return self.space.flat(replace(self.base, max_batch_size=size))

    def propose(self) -> int:
        return self._current()

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        if flat != self._current():
            return  # it only reacts to its own batch size
        s = self.settings
        if measurement.violation_fraction > s.violation_tolerance:
            self.batch = max(float(self.space.batch_sizes[0]), self.batch * s.decrease_factor)
        else:
            self.last_good = flat
            self.batch = min(float(self.space.batch_sizes[-1]), self.batch + s.additive_step)

    def recommend(self) -> int:
        # Its operating point: the probe above it is exploration that gets backed off.
        return self._current() if self.last_good is None else self.last_good

    def describe(self) -> dict[str, Any]:
        return {"phase": "aimd", "batch": self.batch}
