"""Random search: configurations in a random order without repetition, then the best."""

from __future__ import annotations

from typing import Any

import numpy as np

from rrl.tuners.ask_tell import Observations, TuningProblem, exploit
from rrl.tuners.measurement import Measurement


class RandomSearch:
    def __init__(
        self, problem: TuningProblem, rng: np.random.Generator, *, default_noise: float = 0.1
    ) -> None:
        self.order = rng.permutation(problem.space.size)
        self.obs = Observations(problem.space.size)
        self.default_noise = default_noise
        self.default = problem.space.flat(problem.default)

    def propose(self) -> int:
        for flat in self.order:
            if self.obs.n[flat] == 0:
                return int(flat)
        return exploit(self.obs, 1.0, self.default_noise)

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.obs.add(flat, value)

    def recommend(self) -> int:
        best = self.obs.best()
        return self.default if best is None else best

    def describe(self) -> dict[str, Any]:
        return {"phase": "random", "measurements": self.obs.count}
