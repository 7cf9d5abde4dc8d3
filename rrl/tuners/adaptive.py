"""Adaptive RRL: coarse regions for speed, then Bayesian optimization inside the best regions for
optimality, in one file.

The design choice (``rrl/README.md``, "Adaptive RRL"): RRL with a large radius covers the grid in
a handful of measurements but may end up to L * delta away from the optimum. Instead of fixing a
smaller delta everywhere (slow everywhere), adaptive RRL refines only where it pays:

1. regions: plain RRL with ``coarse_radius`` until every configuration is covered;
2. refinement: a Gaussian process (``rrl.tuners.gp.LogGP``) fitted to every measurement predicts the
   unmeasured configurations inside the balls of radius ``coarse_radius`` around the
   ``top_regions`` best measured configurations, and the one with the largest expected
   improvement is measured next. As better configurations are found the balls move with them,
   so the search zooms in around the incumbent: the effective radius shrinks to the spacing of
   the refined points there and stays coarse everywhere else;
3. the balance: once no candidate's expected improvement reaches ``min_improvement`` (a
   fraction of the incumbent's objective, since the GP models log J) for ``patience`` proposals
   in a row, the radius shrinks to 1 around the incumbent: its direct neighbours are measured
   (in EI order) and then refinement stops (or after ``max_refinements``); exploitation as in
   RRL follows, and whenever its re-measurements make another configuration the incumbent, that
   one's direct neighbours are measured too (within the same budget). The final loss bound
   drops from L * coarse_radius to L * 1 around the basin the coarse pass found;
4. exploitation is RRL's own (``RRL.greedy``; ``greedy_exploitation``): greedy on the whole
   table, an unmeasured configuration's bound widened by how wrong estimates have proven, so
   where the landscape is rugged (tail latencies measured on a busy machine are) it goes on
   measuring the configurations still in contention instead of settling on the best measured
   one.

So BO decides where the remaining loss is worth a measurement and when it no longer is:
``min_improvement`` trades convergence speed against the final gap, and the radius-1 zoom
guarantees the result is at least a local optimum of the grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import PerWorkload, TuningProblem, exploit
from rrl.tuners.gp import LogGP, expected_improvement
from rrl.tuners.measurement import Measurement
from rrl.tuners.region_rl import RRL, RRLSettings


@dataclass(frozen=True)
class AdaptiveSettings:
    coarse_radius: float = 2.0
    """delta of the first, coarse pass (RRL's default: adaptive RRL is RRL plus refinement)."""
    top_regions: int = 3
    """Refinement looks inside the regions of this many best measured configurations (0: the
    whole grid)."""
    min_improvement: float = 0.002
    """Refinement stops when no candidate is expected to improve the best by this fraction ..."""
    patience: int = 3
    """... for this many proposals in a row."""
    max_refinements: int = 100
    """At most this many refinement measurements per workload state."""
    confidence: float = 1.0
    default_noise: float = 0.1
    warm_start: bool = True
    greedy_exploitation: bool = True


class AdaptiveRRL:
    """Adaptive RRL inside one workload state (a ``StateTuner``)."""

    def __init__(
        self, problem: TuningProblem, settings: AdaptiveSettings, rng: np.random.Generator
    ) -> None:
        self.problem = problem
        self.settings = settings
        self.regions = RRL(
            problem,
            RRLSettings(
                radius=settings.coarse_radius,
                confidence=settings.confidence,
                default_noise=settings.default_noise,
            ),
            rng,
        )
        self.obs = self.regions.obs  # one table: region and refinement measurements alike
        self.coords = problem.space.coords
        self.gp = LogGP(self.coords.shape[1], seed=int(rng.integers(2**31)))
        self.refining = True
        self.refinements = 0
        self.last_expected_improvement: float | None = None
        self.quiet = 0

    @property
    def phase(self) -> str:
        if self.regions.phase == "regions":
            return "regions"
        return "refine" if self.refining else "exploit"

    def propose(self) -> int:
        if self.regions.phase == "regions":
            return self.regions.propose()
        if self.refining or self._incumbent_not_yet_local():
            candidate = self._refine()
            if candidate is not None:
                return candidate
        if self.settings.greedy_exploitation:
            return self.regions.greedy()
        return exploit(self.obs, self.settings.confidence, self.settings.default_noise)

    def _incumbent_not_yet_local(self) -> bool:
        """Exploitation re-measures contenders, so the incumbent can change to one whose direct
        neighbours were never measured: zoom in around it again (within the refinement budget),
        so that what adaptive RRL ends on is a local optimum of the grid."""
        incumbent = self.obs.best()
        if incumbent is None or self.refinements >= self.settings.max_refinements:
            return False
        neighbours = (self.regions.distances[incumbent] <= 1.0 + 1e-9) & ~self.regions.excluded
        if not (self.obs.n[neighbours] == 0).any():
            return False
        self.refining = True
        self.quiet = self.settings.patience  # straight to the radius-1 zoom
        return True

    def _refine(self) -> int | None:
        s = self.settings
        measured = self.obs.measured
        if self.refinements >= s.max_refinements:
            self.refining = False
            return None
        if self.quiet < s.patience:
            if s.top_regions > 0:
                # Inside the best regions, wherever the GP expects the most improvement.
                top = measured[np.argsort(self.obs.mean[measured])[: s.top_regions]]
                pool = np.asarray(
                    (self.regions.distances[:, top] <= s.coarse_radius + 1e-9).any(axis=1)
                )
            else:
                pool = np.ones(self.coords.shape[0], dtype=bool)
        else:
            # The GP expects little more: zoom in, the radius shrinks to 1 around the incumbent,
            # whose direct neighbours must all be measured before refinement may stop.
            incumbent = self.obs.best()
            assert incumbent is not None
            pool = np.asarray(self.regions.distances[incumbent] <= 1.0 + 1e-9)
        pool[measured] = False
        pool[self.regions.excluded] = False
        candidates = np.flatnonzero(pool)
        if candidates.size == 0:
            self.refining = False
            return None
        self.gp.fit(self.coords[measured], self.obs.mean[measured])
        mu, sd = self.gp.predict(self.coords[candidates])
        best = float(np.log(np.nanmin(self.obs.mean[measured])))
        ei = expected_improvement(mu, sd, best)
        self.last_expected_improvement = float(ei.max())
        # Only several quiet steps in a row count: with few points the GP can be confidently
        # wrong for a step or two.
        self.quiet = self.quiet + 1 if ei.max() < s.min_improvement else 0
        self.refinements += 1
        return int(candidates[np.argmax(ei)])

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        self.regions.observe(flat, value, measurement)

    def recommend(self) -> int:
        return self.regions.recommend()

    def estimates(self) -> np.ndarray:
        """RRL's region estimates (measured values where measured), for a safety layer."""
        return self.regions.estimates()

    def predicted(self, flat: int) -> float:
        return self.regions.predicted(flat)

    def exclude(self, flat: int) -> None:
        self.regions.exclude(flat)

    def warm_start_from(self, other: AdaptiveRRL) -> None:
        self.regions.warm_start_from(other.regions)

    def warm_start_prior(self, values: np.ndarray) -> None:
        self.regions.warm_start_prior(values)

    def describe(self) -> dict[str, Any]:
        return {
            **self.regions.describe(),
            "phase": self.phase,
            "refinements": self.refinements,
            "last_expected_improvement": self.last_expected_improvement,
        }


def make_adaptive_rrl(
    problem: TuningProblem, settings: AdaptiveSettings | None = None
) -> PerWorkload:
    settings = settings or AdaptiveSettings()
    return PerWorkload(
        "adaptive-rrl",
        problem,
        lambda p, rng: AdaptiveRRL(p, settings, rng),
        warm_start=settings.warm_start,
    )
