"""Bayesian optimization over the whole grid: a GP on log J (``rrl.tuners.gp``) and expected
improvement, after a few random configurations; it explores until ``max_points`` measurements
(or, if ``min_improvement`` is set, once no configuration is expected to improve the best by that
fraction for ``patience`` proposals) and then exploits like the other tuners."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import Observations, TuningProblem, exploit
from rrl.tuners.gp import LogGP, expected_improvement
from rrl.tuners.measurement import Measurement


@dataclass(frozen=True)
class BOSettings:
    initial: int = 5
    """Random configurations measured before the GP chooses."""
    min_improvement: float = 0.0
    """Stop exploring when the largest expected improvement is below this fraction ... (0:
    explore until ``max_points``, the most favourable setting for BO's speed to 5%)"""
    patience: int = 3
    """... for this many proposals in a row."""
    max_points: int = 120
    """Stop exploring after this many measurements (the GP's cost grows with them)."""
    default_noise: float = 0.1


class BayesOpt:
    def __init__(
        self,
        problem: TuningProblem,
        rng: np.random.Generator,
        settings: BOSettings | None = None,
    ) -> None:
        self.settings = settings or BOSettings()
        self.coords = problem.space.coords
        self.obs = Observations(problem.space.size)
        self.initial = rng.choice(problem.space.size, self.settings.initial, replace=False)
        self.gp = LogGP(self.coords.shape[1], seed=int(rng.integers(2**31)))
        self.exploring = True
        self.default = problem.space.flat(problem.default)
        self.last_expected_improvement: float | None = None
        self.quiet = 0
        self.excluded = np.zeros(problem.space.size, dtype=bool)  # vetoed by a safety layer

    def propose(self) -> int:
        for flat in self.initial:
            if self.obs.n[flat] == 0 and not self.excluded[flat]:
                return int(flat)
        if self.exploring:
            candidate = self._next()
            if candidate is not None:
                return candidate
        return exploit(self.obs, 1.0, self.settings.default_noise)

    def _next(self) -> int | None:
        measured = self.obs.measured
        unmeasured = np.flatnonzero((self.obs.n == 0) & ~self.excluded)
        if unmeasured.size == 0 or self.obs.count >= self.settings.max_points:
            self.exploring = False
            return None
        self.gp.fit(self.coords[measured], self.obs.mean[measured])
        mu, sd = self.gp.predict(self.coords[unmeasured])
        best = float(np.log(np.nanmin(self.obs.mean[measured])))
        ei = expected_improvement(mu, sd, best)
        self.last_expected_improvement = float(ei.max())
        # Stop only after several quiet steps in a row: with few points the GP can be
        # confidently wrong for a step or two.
        self.quiet = self.quiet + 1 if ei.max() < self.settings.min_improvement else 0
        if self.quiet >= self.settings.patience:
            self.exploring = False
            return None
        return int(unmeasured[np.argmax(ei)])

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.obs.add(flat, value)

    def recommend(self) -> int:
        best = self.obs.best()
        return self.default if best is None else best

    def predicted(self, flat: int) -> float:
        """The measured mean, else the GP's optimistic guess (exp of mean - 2 sd: a veto on
        a prediction must not rest on the GP's uncertainty), else NaN before any fit."""
        if self.obs.n[flat] > 0:
            return float(self.obs.mean[flat])
        if self.gp.model is None:
            return float("nan")
        mu, sd = self.gp.predict(self.coords[flat : flat + 1])
        return float(np.exp(mu[0] - 2.0 * sd[0]))

    def exclude(self, flat: int) -> None:
        self.excluded[flat] = True

    def estimates(self) -> np.ndarray:
        """Measured means (NaN where unmeasured): BO's own values, for a safety layer."""
        return self.obs.mean.copy()

    def describe(self) -> dict[str, Any]:
        return {
            "phase": "explore" if self.exploring else "exploit",
            "measurements": self.obs.count,
            "last_expected_improvement": self.last_expected_improvement,
        }
