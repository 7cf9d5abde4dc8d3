"""Hill climbing of the batches in flight, after TF's AdaptiveSharedBatchScheduler: one axis
(concurrency), keep moving while the objective improves, reverse and halve the step when it gets
worse. The other knobs stay at the static default."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import Observations, TuningProblem
from rrl.tuners.measurement import Measurement


@dataclass(frozen=True)
class InFlightSettings:
    initial_step: float = 1.0
    min_step: float = 0.25


class InFlightHillClimb:
    def __init__(
        self,
        problem: TuningProblem,
        rng: np.random.Generator,
        settings: InFlightSettings | None = None,
    ) -> None:
        self.settings = settings or InFlightSettings()
        self.space = problem.space
        self.base = problem.default
        self.limit = float(self.base.concurrency)
        self.direction = 1.0
        self.step = self.settings.initial_step
        self.last: float | None = None
        self.obs = Observations(problem.space.size)

    def _current(self) -> int:
        axis = self.space.concurrency
        conc = int(min(max(round(self.limit), axis[0]), axis[-1]))
        return self.space.flat(replace(self.base, concurrency=conc))

    def propose(self) -> int:
        return self._current()

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.obs.add(flat, value)
        if flat != self._current():
            return
        if self.last is not None and value > self.last:
            self.direction = -self.direction
            self.step = max(self.settings.min_step, self.step / 2)
        self.last = value
        axis = self.space.concurrency
        self.limit = min(max(self.limit + self.direction * self.step, axis[0]), axis[-1])

    def recommend(self) -> int:
        best = self.obs.best()
        return self._current() if best is None else best

    def describe(self) -> dict[str, Any]:
        return {"phase": "climb", "limit": self.limit, "step": self.step}
