"""Hill climbing in index space, after Triton Model Analyzer's "quick" search.

From the minimal configuration (every index 0): measure enough of the neighbourhood (a Euclidean
ball of ``radius`` around home) that ``min_initialized`` points are known, choosing first the
points that cover index values not yet seen on some axis; then step from home along the vector
from the neighbourhood's plain centre to its goodness-weighted centre (goodness 1 / J, as Triton
weights by throughput), times ``magnitude``, rounded and clamped to the grid. It stops when the
step goes nowhere or lands on a configuration already visited twice, then keeps the best.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rrl.measurement import Measurement
from rrl.tuner import Observations, TuningProblem, exploit


@dataclass(frozen=True)
class HillClimbSettings:
    radius: float = 3.0
    magnitude: float = 3.0
    min_initialized: int = 3
    default_noise: float = 0.1


class HillClimb:
    def __init__(
        self,
        problem: TuningProblem,
        rng: np.random.Generator,
        settings: HillClimbSettings | None = None,
    ) -> None:
        self.settings = settings or HillClimbSettings()
        self.space = problem.space
        self.obs = Observations(problem.space.size)
        self.visits = np.zeros(problem.space.size, dtype=np.int64)
        self.home = 0  # every index at its minimum
        self.to_measure: int | None = self.home
        self.done = False

    def propose(self) -> int:
        if self.done or self.to_measure is None:
            return exploit(self.obs, 1.0, self.settings.default_noise)
        return self.to_measure

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.obs.add(flat, value)
        self.visits[flat] += 1
        if not self.done and flat == self.to_measure:
            self._step()

    def _step(self) -> None:
        neighbourhood = self.space.ball(self.home, self.settings.radius)
        known = neighbourhood[self.obs.n[neighbourhood] > 0]
        if known.size < self.settings.min_initialized:
            self.to_measure = self._to_initialize(neighbourhood, known)
            if self.to_measure is not None:
                return
        coords = self.space.coords
        goodness = 1.0 / np.maximum(self.obs.mean[known], 1e-12)
        centre = coords[known].mean(axis=0)
        weighted = (goodness[:, None] * coords[known]).sum(axis=0) / goodness.sum()
        step = np.round((weighted - centre) * self.settings.magnitude)
        new = self.space.flat(self.space.at_coord(coords[self.home] + step))
        if new == self.home or self.visits[new] >= 2:
            self.done = True
            return
        self.home = new
        self.to_measure = new

    def _to_initialize(self, neighbourhood: np.ndarray, known: np.ndarray) -> int | None:
        coords = self.space.coords.astype(int)
        seen = [set(coords[known, axis].tolist()) for axis in range(coords.shape[1])]
        best, best_new = None, -1
        for flat in neighbourhood:
            if self.obs.n[flat] > 0:
                continue
            new_values = sum(coords[flat, a] not in seen[a] for a in range(coords.shape[1]))
            if new_values > best_new:
                best, best_new = int(flat), new_values
        return best

    def recommend(self) -> int:
        best = self.obs.best()
        return self.home if best is None else best

    def describe(self) -> dict[str, Any]:
        return {
            "phase": "exploit" if self.done else "climb",
            "home": self.space.at(self.home).knob_changes(),
            "measurements": self.obs.count,
        }
