"""Hill climbing in index space, after Triton Model Analyzer's "quick" search.

From the minimal configuration (every index 0): measure enough of the neighbourhood (a Euclidean
ball of ``radius`` around home) that ``min_initialized`` points are known, choosing first the
points that cover index values not yet seen on some axis; then step from home along the vector
from the neighbourhood's plain centre to its goodness-weighted centre (goodness: the objective
rescaled to [0, 1] over the neighbourhood, where Triton weighs by throughput; see ``_step``),
times ``magnitude``, rounded and clamped to the grid. It stops when the step goes nowhere or
lands on a configuration already visited twice; there Triton stops, and this one finishes with a
plain hill climb over radius-1 neighbours of the best point (``_polish``), so that it ends on a
local optimum of the grid. Radius 2, magnitude 2 and 3 initialised points are the values Model
Analyzer's quick search builds its search with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import Observations, TuningProblem, exploit
from rrl.tuners.measurement import Measurement


@dataclass(frozen=True)
class HillClimbSettings:
    radius: float = 2.0
    magnitude: float = 2.0
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
        self.polishing = False
        self.rng = rng

    def propose(self) -> int:
        if self.done or self.to_measure is None:
            return exploit(self.obs, 1.0, self.settings.default_noise)
        return self.to_measure

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.obs.add(flat, value)
        self.visits[flat] += 1
        if not self.done and flat == self.to_measure:
            if self.polishing:
                self._polish()
            else:
                self._step()

    def _step(self) -> None:
        neighbourhood = self.space.ball(self.home, self.settings.radius)
        known = neighbourhood[self.obs.n[neighbourhood] > 0]
        if known.size < self.settings.min_initialized:
            self.to_measure = self._to_initialize(neighbourhood, known)
            if self.to_measure is not None:
                return
        coords = self.space.coords
        # Triton weighs by throughput, which differs by large factors between neighbours; a
        # latency objective differs by percents, so goodness is rescaled to [0, 1] over the
        # neighbourhood (best 1, worst 0) to lean as strongly toward the better points.
        values = self.obs.mean[known]
        spread = values.max() - values.min()
        goodness = (values.max() - values) / spread if spread > 0 else np.ones_like(values)
        centre = coords[known].mean(axis=0)
        weighted = (goodness[:, None] * coords[known]).sum(axis=0) / goodness.sum()
        step = np.round((weighted - centre) * self.settings.magnitude)
        new = self.space.flat(self.space.at_coord(coords[self.home] + step))
        if new == self.home or self.visits[new] >= 2:
            self.polishing = True
            self._polish()
            return
        self.home = new
        self.to_measure = new

    def _polish(self) -> None:
        """Where Triton would stop, finish as a plain hill climb: measure the best point's direct
        neighbours (radius 1) until it is better than all of them, so the search ends on a local
        optimum of the grid instead of wherever a rounded step stalled."""
        best = self.obs.best()
        assert best is not None
        neighbours = self.space.ball(best, 1.0)
        unknown = neighbours[self.obs.n[neighbours] == 0]
        if unknown.size == 0:
            self.done = True
            return
        self.home = best
        self.to_measure = int(unknown[0])

    def _to_initialize(self, neighbourhood: np.ndarray, known: np.ndarray) -> int | None:
        coords = self.space.coords.astype(int)
        seen = [set(coords[known, axis].tolist()) for axis in range(coords.shape[1])]
        unknown = neighbourhood[self.obs.n[neighbourhood] == 0]
        if unknown.size == 0:
            return None
        new_values = np.array(
            [sum(coords[f, a] not in seen[a] for a in range(coords.shape[1])) for f in unknown]
        )
        # The point covering the most unseen values; ties at random (Triton takes the first in
        # its iteration order, which on five axes would never leave the first axis's minimum).
        return int(self.rng.choice(unknown[new_values == new_values.max()]))

    def recommend(self) -> int:
        best = self.obs.best()
        return self.home if best is None else best

    def describe(self) -> dict[str, Any]:
        return {
            "phase": "exploit" if self.done else ("polish" if self.polishing else "climb"),
            "home": self.space.at(self.home).as_dict(),
            "measurements": self.obs.count,
        }
