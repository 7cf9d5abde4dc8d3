"""Static default: TF Serving's CPU guidance (threads = cores, batch threads = cores, a large
maximum batch, timeout 0), never changed."""

from __future__ import annotations

from typing import Any

import numpy as np

from rrl.tuners.ask_tell import TuningProblem
from rrl.tuners.measurement import Measurement


class StaticDefault:
    def __init__(self, problem: TuningProblem, rng: np.random.Generator) -> None:
        self.flat = problem.space.flat(problem.default)

    def propose(self) -> int:
        return self.flat

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        pass  # it never learns

    def recommend(self) -> int:
        return self.flat

    def describe(self) -> dict[str, Any]:
        return {"phase": "static"}
