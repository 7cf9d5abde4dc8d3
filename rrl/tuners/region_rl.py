"""Region-based reinforcement learning (RRL) over serving configurations, in one file.

The MDP, per workload state s (see ``rrl/README.md`` for the full statement):

- actions: the configurations c of the grid (flat indices); the state is exogenous (the chosen
  configuration does not change what devices send), so the discount is 0 and the value of an
  action is its expected objective J(s, c) over one decision interval: a contextual bandit;
- update rule: Q(s, c) <- Q(s, c) + (1 / n(s, c)) * (J_measured - Q(s, c)) for the measured c
  (a running mean), and for every *unmeasured* c' within distance ``radius`` (delta) of at least
  one measured configuration, the region estimate
  Q^(s, c') = sum_m w(c', m) Q(s, m) / sum_m w(c', m), w = 1 / d(c', m) over measured m with
  d(c', m) <= delta. Measured values always override estimates;
- exploration over regions first: while some configuration is covered by no region, measure the
  centre of a new region: among uncovered configurations whose ball covers at least
  ``coverage_slack`` times the most uncovered configurations any one ball would, the most
  promising one (the warm-start prior when there is one, else the Lipschitz lower bound
  max_m Q(s, m) - L d(c, m));
- then exploitation, greedy on the whole table Q^: run the configuration with the lowest lower
  confidence bound, Q - kappa * (standard error) for a measured one, and for an unmeasured one
  Q^ * (1 - kappa * max(cv, e)), where a direct neighbour (distance <= 1) of measured
  configurations is estimated by the best of them, cv is the pooled relative noise of one
  measurement and e the robust spread of the estimates' own errors (log measured / estimated
  at each first measurement). So the incumbent's unmeasured neighbours are measured next (a
  measurement says more than an estimate), each value overrides its estimate, and
  exploitation climbs down from the best region centre to a local optimum of the grid instead
  of settling on the centre; where estimates have proven poor (a rugged landscape) it goes on
  to measure the configurations they leave in contention; it then re-measures close
  contenders until noise no longer hides the best, and keeps running it.

The loss bound: if J(s, .) is L-Lipschitz in index space, the optimum c* lies in some region
whose centre m has J(m) <= J(c*) + L delta, and the best measured centre is at least as good, so
the configuration RRL ends on costs at most L * delta more than the optimum (plus twice the noise
margin of the comparison when measurements are noisy). Coverage needs about |C| / |B(delta)|
measurements instead of |C|: that is the speed / optimality trade-off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from rrl.tuners.ask_tell import Observations, PerWorkload, TuningProblem, exploit
from rrl.tuners.measurement import Measurement


@dataclass(frozen=True)
class RRLSettings:
    radius: float = 2.0
    """delta: the region of a measured configuration is the ball of this radius around it."""
    lipschitz: float | None = None
    """L for the exploration order; None estimates it from measured pairs (the largest slope)."""
    confidence: float = 1.0
    """kappa: width of the lower confidence bound in exploitation, in standard errors."""
    default_noise: float = 0.1
    """Relative noise of one measurement assumed until replicates measure it."""
    coverage_slack: float = 0.5
    """A new region centre must cover at least this fraction of the best possible new coverage,
    so the number of regions stays close to a greedy covering of the grid."""
    warm_start: bool = True
    """A new workload state starts from the nearest known state's table."""
    greedy_on_estimates: bool = True
    estimate_error: bool = True
    """Widen the bound of an unmeasured configuration by how wrong estimates have proven: the
    robust spread of log(measured / estimated) over configurations measured for the first
    time. False: by the measurement noise only."""
    min_estimate_errors: int = 3
    """First measurements of estimated configurations needed before their spread counts."""
    """Exploit on the whole table (measured and region-estimated configurations); False
    exploits measured configurations only, i.e. settles on the best region centre."""


class RRL:
    """RRL inside one workload state (a ``StateTuner``)."""

    def __init__(
        self, problem: TuningProblem, settings: RRLSettings, rng: np.random.Generator
    ) -> None:
        self.problem = problem
        self.settings = settings
        self.rng = rng
        self.distances = problem.space.distances
        self.obs = Observations(problem.space.size)
        self._covered = np.zeros(problem.space.size, dtype=bool)  # kept up to date by observe
        self.excluded = np.zeros(problem.space.size, dtype=bool)  # vetoed by a safety layer
        self.prior: np.ndarray | None = None  # warm start: the nearest state's estimates
        self.prior_best: int | None = None  # ... and its best measured configuration
        self.prior_exact = False  # the prior was measured in this very state (a profile)
        self._errors: list[float] = []  # log(measured / estimated) at first measurements

    # -- the region update -----------------------------------------------------------------

    def estimates(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Q^(s, .) for every configuration (or those of ``rows``): measured means where
        measured, the distance-weighted mean of the covering measured configurations elsewhere,
        NaN where uncovered. ``rows`` keeps one configuration's estimate O(measured)."""
        rows = np.arange(self.problem.space.size) if rows is None else rows
        measured = self.obs.measured
        q_hat = np.full(rows.size, np.nan)
        if measured.size == 0:
            return q_hat
        d = self.distances[np.ix_(rows, measured)]
        in_region = d <= self.settings.radius + 1e-9
        with np.errstate(divide="ignore"):
            w = np.where(in_region, 1.0 / np.maximum(d, 1e-9), 0.0)
        covered = in_region.any(axis=1)
        q_hat[covered] = (w[covered] @ self.obs.mean[measured]) / w[covered].sum(axis=1)
        known = self.obs.n[rows] > 0
        q_hat[known] = self.obs.mean[rows][known]  # measured values override estimates
        return q_hat

    def covered(self) -> np.ndarray:
        """Configurations within delta of a measured one (a copy)."""
        return self._covered.copy()

    def lipschitz(self) -> float:
        """L: the given constant, else the steepest slope between two measured configurations."""
        if self.settings.lipschitz is not None:
            return self.settings.lipschitz
        measured = self.obs.measured
        if measured.size < 2:
            return 0.0
        values = self.obs.mean[measured]
        d = self.distances[np.ix_(measured, measured)]
        slopes = np.abs(values[:, None] - values[None, :]) / np.where(d > 0, d, np.inf)
        return float(slopes.max())

    # -- the policy ------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return "regions" if not self._covered.all() else "exploit"

    def propose(self) -> int:
        if self.prior_best is not None and self.obs.n[self.prior_best] == 0:
            # Warm start: the prior's best first (whatever else ran meanwhile, e.g. while a
            # safety layer held it back).
            return self.prior_best
        uncovered = ~self._covered
        if uncovered.any():
            return self._next_region(uncovered)
        if self.settings.greedy_on_estimates:
            return self.greedy()
        return exploit(self.obs, self.settings.confidence, self.settings.default_noise)

    def greedy(self) -> int:
        """The configuration with the lowest lower confidence bound over the whole table: a
        measured one's from its replicates, an unmeasured one's from its estimate
        (``_greedy_estimates``) as if it were one measurement, with the larger of two relative
        spreads: the pooled noise of a measurement, and the spread of the estimates' own
        errors so far (``estimate_error``). The second is what keeps exploitation honest on a
        rugged landscape: when neighbours predict each other poorly, an unmeasured
        configuration estimated near the incumbent may well beat it, so it is measured; on a
        smooth one the errors are small and exploitation settles fast. So greedy exploitation
        measures the neighbours of the incumbent (and of any contender within the noise of
        it), climbs down from the best region centre one notch at a time, goes on measuring
        the configurations that the estimates' proven error leaves in contention, and ends
        re-measuring close contenders. Ties go to the unmeasured configuration."""
        kappa = self.settings.confidence
        lcb = self.obs.lower_confidence(kappa, self.settings.default_noise)
        unmeasured = (self.obs.n == 0) & ~self.excluded
        if unmeasured.any():
            q_hat = self._greedy_estimates()
            noise = self.obs.relative_noise(self.settings.default_noise)
            spread = max(noise, self.estimate_error())
            lcb = np.where(unmeasured, q_hat - kappa * spread * np.abs(q_hat), lcb)
        lcb = np.where(self.excluded & (self.obs.n == 0), np.nan, lcb)
        best = float(np.nanmin(lcb))
        ties = np.flatnonzero(lcb <= best + 1e-12)
        fresh = ties[self.obs.n[ties] == 0]
        return int(fresh[0] if fresh.size else ties[0])

    def _greedy_estimates(self, rows: np.ndarray | None = None) -> np.ndarray:
        """``expected``, except that an unmeasured direct neighbour (distance <= 1) of measured
        configurations is estimated by the best of them: a distance-weighted mean of the region
        also averages in configurations on the far side, so it never points downhill, while the
        nearest evidence says "as good as my neighbour until measured". With a profile prior of
        this state the calibrated prior says more than the neighbours, and what the profile
        left out was left out for a reason: no neighbour rule then."""
        rows = np.arange(self.problem.space.size) if rows is None else rows
        q_hat = self.expected(rows)
        measured = self.obs.measured
        if measured.size and not self.prior_exact:
            adjacent = self.distances[np.ix_(rows, measured)] <= 1.0 + 1e-9
            nearest = np.where(adjacent, self.obs.mean[measured][None, :], np.inf).min(axis=1)
            use = (self.obs.n[rows] == 0) & np.isfinite(nearest)
            q_hat[use] = nearest[use]
        return q_hat

    def estimate_error(self) -> float:
        """How far first measurements have fallen from their estimates, as a relative spread:
        1.4826 x the median of |log(measured / estimated)| (the normal-consistent median
        absolute deviation, so a few wild misses do not force measuring everything); 0 until
        ``min_estimate_errors`` such pairs exist or when the setting is off."""
        enough = len(self._errors) >= self.settings.min_estimate_errors
        if not (self.settings.estimate_error and enough):
            return 0.0
        return float(1.4826 * np.median(np.abs(self._errors)))

    def _next_region(self, uncovered: np.ndarray) -> int:
        in_ball = self.distances[:, uncovered] <= self.settings.radius + 1e-9
        gain = np.where(uncovered, in_ball.sum(axis=1), 0)
        eligible = np.flatnonzero(gain >= self.settings.coverage_slack * gain.max())
        promise = self._promise(eligible)
        # Most promising first; among equals, the larger coverage; then at random.
        tiebreak = self.rng.random(eligible.size)
        order = np.lexsort((tiebreak, -gain[eligible], promise))
        return int(eligible[order[0]])

    def _promise(self, candidates: np.ndarray) -> np.ndarray:
        """Lower is more promising: the prior estimate when warm-started, else the Lipschitz
        lower bound max_m (Q(m) - L d(c, m)) (0 before any measurement)."""
        if self.prior is not None:
            prior = self.prior[candidates]
            return np.where(np.isnan(prior), np.nanmax(self.prior), prior)
        measured = self.obs.measured
        if measured.size == 0:
            return np.zeros(candidates.size)
        lower = (
            self.obs.mean[measured][None, :]
            - self.lipschitz() * self.distances[np.ix_(candidates, measured)]
        )
        return lower.max(axis=1)

    def observe(self, flat: int, value: float, measurement: Measurement) -> None:
        if self.settings.estimate_error and self.obs.n[flat] == 0 and self.obs.measured.size:
            # What the table expected of it before its first measurement: the estimates' error.
            guess = self._greedy_estimates(np.array([flat]))[0]
            if np.isfinite(guess) and guess > 0 and value > 0:
                self._errors.append(float(np.log(value / guess)))
        self.obs.add(flat, value)  # Q <- Q + (1/n)(J - Q); the region follows in estimates()
        self._covered |= self.distances[flat] <= self.settings.radius + 1e-9

    def predicted(self, flat: int) -> float:
        """What this table expects of ``flat`` before running it (``expected``)."""
        return float(self.expected(np.array([flat]))[0])

    def expected(self, rows: np.ndarray | None = None) -> np.ndarray:
        """What this table expects of every configuration (or those of ``rows``): the measured
        mean; else the region
        estimate and then the warm-start prior, or, when the prior was measured in this very
        state (a profile), the prior first, scaled by ``prior_scale``: a direct measurement of
        a configuration says more than an estimate from its neighbours; NaN when nothing is
        known."""
        rows = np.arange(self.problem.space.size) if rows is None else rows
        q = self.estimates(rows)
        if self.prior is None:
            return q
        unmeasured = self.obs.n[rows] == 0
        if self.prior_exact:
            prior = self.prior[rows] * self.prior_scale()
            use = unmeasured & np.isfinite(prior)
        else:
            prior = self.prior[rows]
            use = unmeasured & np.isnan(q) & np.isfinite(prior)
        return np.where(use, prior, q)

    def prior_scale(self) -> float:
        """How a profile prior compares with what is measured now, as one factor: the geometric
        mean of measured / prior over the configurations measured in this state (1 before any).
        The profile's order of configurations carries over to the serving process; its level
        may not (transport and decoding add to every request online), so an unmeasured
        configuration is expected to be as much slower or faster as the measured ones were."""
        if self.prior is None:
            return 1.0
        measured = self.obs.measured
        prior = self.prior[measured]
        mean = self.obs.mean[measured]
        usable = np.isfinite(prior) & (prior > 0) & (mean > 0)
        if not usable.any():
            return 1.0
        return float(np.exp(np.mean(np.log(mean[usable] / prior[usable]))))

    def exclude(self, flat: int) -> None:
        """Never propose ``flat`` for exploration (a safety layer judged it too risky, or it
        cannot run). It counts as covered, so region exploration moves on; it is never
        exploited either, since exploitation only runs measured configurations."""
        self.excluded[flat] = True
        self._covered[flat] = True

    def recommend(self) -> int:
        best = self.obs.best()
        if best is not None:
            return best
        if self.prior_best is not None:
            return self.prior_best
        return self.problem.space.flat(self.problem.default)

    def warm_start_from(self, other: RRL) -> None:
        estimates = other.estimates()
        if not np.isnan(estimates).all():
            self.prior = estimates
            self.prior_best = other.recommend()

    def warm_start_prior(self, values: np.ndarray) -> None:
        """Start from prior estimates of this state (one per configuration, NaN where
        unknown), e.g. an offline profile's: its best is measured first, the regions are
        explored in its order and a safety layer reads it through ``predicted``."""
        if np.isfinite(values).any():
            self.prior = np.asarray(values, dtype=float).copy()
            self.prior_best = int(np.nanargmin(self.prior))
            self.prior_exact = True

    def describe(self) -> dict[str, Any]:
        q_hat = self.estimates()
        return {
            "phase": self.phase,
            "radius": self.settings.radius,
            "measurements": self.obs.count,
            "configurations_measured": int(self.obs.measured.size),
            "configurations_estimated": int(np.isfinite(q_hat).sum()),
            "lipschitz": self.lipschitz(),
            "warm_started": self.prior is not None,
            "excluded": int(self.excluded.sum()),
        }


def make_rrl(problem: TuningProblem, settings: RRLSettings | None = None) -> PerWorkload:
    settings = settings or RRLSettings()
    return PerWorkload(
        "rrl" if settings.radius > 0 else "rrl-radius0",
        problem,
        lambda p, rng: RRL(p, settings, rng),
        warm_start=settings.warm_start,
    )
