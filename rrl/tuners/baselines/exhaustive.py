"""Exhaustive search, the oracle: measure every configuration once, in grid order, then keep the
best (re-measuring close contenders, as every searching tuner does once it exploits)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rrl.tuners.ask_tell import Observations, TuningProblem, exploit
from rrl.tuners.measurement import Measurement


class Exhaustive:
    def __init__(
        self, problem: TuningProblem, rng: np.random.Generator, *, default_noise: float = 0.1
    ) -> None:
        self.size = problem.space.size
        self.obs = Observations(self.size)
        self.default_noise = default_noise

    def propose(self) -> int:
        unmeasured = np.flatnonzero(self.obs.n == 0)
        if unmeasured.size:
            return int(unmeasured[0])
        return exploit(self.obs, 1.0, self.default_noise)

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.obs.add(flat, value)

    def recommend(self) -> int:
        best = self.obs.best()
        return 0 if best is None else best

    def describe(self) -> dict[str, Any]:
        done = bool((self.obs.n > 0).all())
        return {"phase": "exploit" if done else "sweep", "measurements": self.obs.count}
