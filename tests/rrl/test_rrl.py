"""RRL: the region update, the exploration order, convergence with the Lipschitz loss bound on
noiseless landscapes, convergence on a noisy one, per-state tables and the warm start."""

from __future__ import annotations

import numpy as np
import pytest

from rrl.tuners.adaptive import AdaptiveSettings, make_adaptive_rrl
from rrl.tuners.ask_tell import PerWorkload
from rrl.tuners.region_rl import RRL, RRLSettings, make_rrl
from rrl.tuners.workload import WorkloadState
from tests.rrl.helpers import SPACE, drive, problem
from tests.rrl.synthetic import Landscape, bowl, cone, random_lipschitz, rugged


def _rrl(radius: float = 2.0, seed: int = 0) -> RRL:
    return RRL(problem(seed), RRLSettings(radius=radius), np.random.default_rng(seed))


def test_one_measurement_sets_its_whole_region() -> None:
    rrl = _rrl(radius=2.0)
    centre = SPACE.flat(SPACE.at_coord([3, 2, 1, 0, 0]))
    rrl.observe(centre, 10.0, None)  # type: ignore[arg-type]
    q_hat = rrl.estimates()
    region = SPACE.ball(centre, 2.0)
    assert np.all(q_hat[region] == 10.0)
    outside = np.setdiff1d(np.arange(SPACE.size), region)
    assert np.isnan(q_hat[outside]).all()
    assert rrl.covered().sum() == region.size


def test_overlapping_regions_weigh_by_distance_and_measurements_override() -> None:
    rrl = _rrl(radius=2.0)
    a = SPACE.flat(SPACE.at_coord([2, 2, 1, 0, 0]))
    b = SPACE.flat(SPACE.at_coord([4, 2, 1, 0, 0]))
    rrl.observe(a, 10.0, None)  # type: ignore[arg-type]
    rrl.observe(b, 40.0, None)  # type: ignore[arg-type]
    q_hat = rrl.estimates()
    middle = SPACE.flat(SPACE.at_coord([3, 2, 1, 0, 0]))  # distance 1 from both
    assert q_hat[middle] == pytest.approx(25.0)
    near_a = SPACE.flat(SPACE.at_coord([2, 2, 1, 1, 0]))  # 1 from a, sqrt(5) from b: a only
    assert q_hat[near_a] == pytest.approx(10.0)
    skew = SPACE.flat(SPACE.at_coord([3, 2, 0, 0, 0]))  # sqrt(2) from both: equal weights
    assert q_hat[skew] == pytest.approx(25.0)
    lopsided = SPACE.flat(SPACE.at_coord([3, 2, 2, 0, 0]))  # sqrt(2) from a, sqrt(2) from b
    assert q_hat[lopsided] == pytest.approx(25.0)
    c = SPACE.flat(SPACE.at_coord([3, 3, 1, 0, 0]))
    rrl.observe(c, 70.0, None)  # type: ignore[arg-type]
    q_hat = rrl.estimates()
    lopsided = SPACE.flat(SPACE.at_coord([2, 2, 2, 0, 0]))  # 1 from a, sqrt(3) from c, 2.2 from b
    w_a, w_c = 1.0, 1.0 / np.sqrt(3)
    assert q_hat[lopsided] == pytest.approx((10 * w_a + 70 * w_c) / (w_a + w_c))
    rrl.observe(middle, 99.0, None)  # type: ignore[arg-type]
    assert rrl.estimates()[middle] == 99.0  # measured values override estimates
    rrl.observe(middle, 101.0, None)  # type: ignore[arg-type]
    assert rrl.estimates()[middle] == pytest.approx(100.0)  # Q <- running mean


def test_regions_first_then_exploitation() -> None:
    land = Landscape.from_function(
        SPACE, random_lipschitz(SPACE, lipschitz=2.0, floor=10.0, cones=5, seed=1)
    )
    tuner = make_rrl(problem(1), RRLSettings(radius=2.0, greedy_on_estimates=False))
    proposed, _ = drive(tuner, land, 60)
    flats = [SPACE.flat(c) for c in proposed]
    rrl = tuner.current
    assert isinstance(rrl, RRL)
    assert rrl.covered().all()
    # Region phase: every proposal is the centre of a new region (farther than delta from all
    # earlier centres) until the grid is covered.
    d = SPACE.distances
    regions = 0
    while regions < len(flats) and (regions == 0 or d[flats[regions], flats[:regions]].min() > 2.0):
        regions += 1
    covered_after = np.zeros(SPACE.size, dtype=bool)
    for f in flats[:regions]:
        covered_after |= d[f] <= 2.0
    assert covered_after.all(), "exploration stopped before the grid was covered"
    # A greedy covering of this grid needs 17 balls of radius 2; the slack allows a few more.
    assert regions <= 26
    # Exploitation on measured configurations only: nothing new is ever measured again, and
    # the best centre is run.
    assert set(flats[regions:]) <= set(flats[:regions])
    assert flats[-1] == min(flats[:regions], key=lambda f: land.values[f])


def test_greedy_exploitation_refines_inside_the_best_region() -> None:
    # A cone whose tip is no region centre: exploitation on measured configurations settles on
    # the best centre, up to L * delta away; greedy on the whole table measures what the best
    # centre's region estimates well, lets each measurement override its estimate and move its
    # neighbours', and walks down to the tip, measuring a small part of the grid.
    tip = np.array([5, 3, 2, 1, 0.0])
    land = Landscape.from_function(SPACE, cone(tip, lipschitz=3.0, floor=10.0))
    centres_only = make_rrl(problem(0), RRLSettings(radius=2.0, greedy_on_estimates=False))
    _, recommended = drive(centres_only, land, 120)
    assert land.value(recommended[-1]) > land.optimum_value
    greedy = make_rrl(problem(0), RRLSettings(radius=2.0))
    proposed, recommended = drive(greedy, land, 120)
    assert land.value(recommended[-1]) == land.optimum_value
    assert len({SPACE.flat(c) for c in proposed}) < SPACE.size / 5
    rrl = greedy.current
    assert isinstance(rrl, RRL)
    # Refinement stops: at the end only the optimum is run, and no estimate left is better.
    assert {SPACE.flat(c) for c in proposed[-10:]} == {SPACE.flat(recommended[-1])}
    q_hat = rrl.estimates()
    assert np.nanmin(q_hat[rrl.obs.n == 0]) > land.optimum_value


@pytest.mark.slow  # many seeds of a whole run on the full grid
def test_estimate_error_keeps_exploiting_a_rugged_landscape_until_the_optimum() -> None:
    # A bowl times a fixed log-normal factor per configuration (30% log sd), like a profile of
    # tail latencies: regions point at the right area but neighbours predict each other only
    # roughly. Trusting the estimates as much as a measurement, greedy exploitation stops on a
    # local optimum in some runs; widened by the estimates' proven error, it goes on measuring
    # what they leave in contention and ends on the optimum every time, short of the grid.
    missed, measured = [], []
    for seed in range(6):
        smooth = bowl(np.array([3, 2, 1, 1, 0.0]), scale=1.0, floor=20.0)
        land = Landscape.from_function(SPACE, rugged(SPACE, smooth, spread=0.3, seed=seed))
        trusting = make_rrl(problem(seed), RRLSettings(radius=2.0, estimate_error=False))
        _, recommended = drive(trusting, land, SPACE.size)
        missed.append(land.value(recommended[-1]) > land.optimum_value)
        tuner = make_rrl(problem(seed), RRLSettings(radius=2.0))
        proposed, recommended = drive(tuner, land, SPACE.size)
        assert land.value(recommended[-1]) == land.optimum_value
        measured.append(len({SPACE.flat(c) for c in proposed}))
        rrl = tuner.current
        assert isinstance(rrl, RRL)
        assert rrl.estimate_error() > 0.1  # it learned that estimates are rough here
    assert any(missed)
    assert max(measured) < SPACE.size


@pytest.mark.slow  # many seeds of a whole run on the full grid
def test_adaptive_rrl_exploits_a_rugged_landscape_as_rrl_does() -> None:
    # After its GP refinement, adaptive RRL exploits with RRL's greedy rule: on the rugged bowl
    # it ends on the optimum, where exploiting measured configurations only stops short.
    missed = []
    for seed in range(3):
        smooth = bowl(np.array([3, 2, 1, 1, 0.0]), scale=1.0, floor=20.0)
        land = Landscape.from_function(SPACE, rugged(SPACE, smooth, spread=0.3, seed=seed))
        settled = make_adaptive_rrl(problem(seed), AdaptiveSettings(greedy_exploitation=False))
        _, recommended = drive(settled, land, SPACE.size)
        missed.append(land.value(recommended[-1]) > land.optimum_value)
        _, recommended = drive(make_adaptive_rrl(problem(seed)), land, SPACE.size)
        assert land.value(recommended[-1]) == land.optimum_value
    assert any(missed)


@pytest.mark.parametrize("radius", [1.0, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lipschitz_loss_bound_holds(radius: float, seed: int) -> None:
    lipschitz = 2.0
    rng = np.random.default_rng(seed)
    optimum = rng.uniform(0, np.array(SPACE.shape) - 1)
    for f in (
        cone(optimum, lipschitz=lipschitz, floor=10.0),
        random_lipschitz(SPACE, lipschitz=lipschitz, floor=10.0, cones=6, seed=seed),
    ):
        land = Landscape.from_function(SPACE, f)
        tuner = make_rrl(problem(seed), RRLSettings(radius=radius))
        _, recommended = drive(tuner, land, 160)
        loss = land.value(recommended[-1]) - land.optimum_value
        assert loss <= lipschitz * radius + 1e-9, (loss, lipschitz * radius)


def test_fewer_measurements_with_a_larger_radius() -> None:
    land = Landscape.from_function(
        SPACE, cone(np.array([3, 2, 1, 1, 0.0]), lipschitz=1.0, floor=5.0)
    )
    covered_at = {}
    for radius in (1.0, 2.0, 3.0):
        tuner = make_rrl(problem(0), RRLSettings(radius=radius))
        for step in range(1, 400):
            config = tuner.propose()
            tuner.observe(config, land.measure(config))
            rrl = tuner.current
            assert isinstance(rrl, RRL)
            if rrl.covered().all():
                covered_at[radius] = step
                break
    assert covered_at[1.0] > covered_at[2.0] > covered_at[3.0]
    assert covered_at[1.0] < SPACE.size / 3  # far fewer than measuring every configuration
    assert covered_at[2.0] <= 26  # a greedy covering needs 17 balls of radius 2


def test_converges_on_a_noisy_landscape() -> None:
    # A smooth bowl (floor 20) with noise of 5% of the optimum per measurement: RRL must end on
    # a configuration within its loss bound plus the noise margin, despite lucky measurements.
    f = bowl(np.array([4, 2, 2, 1, 0.0]), scale=1.0, floor=20.0)
    for seed in range(3):
        land = Landscape.from_function(SPACE, f, noise_sd=1.0, seed=seed)
        tuner = make_rrl(problem(seed), RRLSettings(radius=1.0))
        _, recommended = drive(tuner, land, 250)
        # Lipschitz constant of the bowl near its bottom (within 2 notches): 2 * scale * 2 + 1.
        assert land.value(recommended[-1]) - land.optimum_value <= 5.0 + 2 * 1.0


def _early_regret(tuner: PerWorkload, land: Landscape, steps: int = 10) -> float:
    """Mean excess of the recommendation over the optimum during the first ``steps``."""
    total = 0.0
    for _ in range(steps):
        config = tuner.propose()
        tuner.observe(config, land.measure(config))
        total += land.value(tuner.recommend()) - land.optimum_value
    return total / steps


def test_each_workload_state_has_its_table_and_a_new_one_starts_warm() -> None:
    warm, cold = [], []
    for seed in range(6):
        f = random_lipschitz(SPACE, lipschitz=2.0, floor=10.0, cones=6, seed=seed)
        low = Landscape.from_function(SPACE, f)
        # The next load level: everything slower, the same shape.
        high = Landscape(SPACE, 1.6 * low.values + 3.0)
        tuner = make_rrl(problem(seed), RRLSettings(radius=2.0))
        drive(tuner, low, 40)
        best_low = tuner.recommend()
        tuner.set_workload(WorkloadState(2, 0))
        assert tuner.propose() == best_low  # the nearest state's best is tried first
        warm.append(_early_regret(tuner, high))
        cold.append(_early_regret(make_rrl(problem(seed), RRLSettings(radius=2.0)), high))
        # Going back resumes the first state's table: its best is recommended at once.
        tuner.set_workload(WorkloadState(0, 0))
        assert tuner.recommend() == best_low
        assert tuner.snapshot()["known_states"] == 2
    assert np.mean(warm) < 0.75 * np.mean(cold), (warm, cold)


def test_the_listed_estimates_are_the_best_first_and_their_counts_match() -> None:
    f = random_lipschitz(SPACE, lipschitz=2.0, floor=10.0, cones=6, seed=3)
    tuner = make_rrl(problem(3), RRLSettings(radius=2.0))
    assert tuner.estimates() == [] and tuner.estimate_counts() == (0, 0)
    drive(tuner, Landscape.from_function(SPACE, f), 12)
    listed = tuner.estimates()
    values = [v for _, v, _ in listed]
    assert values == sorted(values) and 12 < len(listed) < SPACE.size
    assert tuner.estimates(limit=5) == listed[:5]
    measured = sum(1 for _, _, n in listed if n > 0)
    assert tuner.estimate_counts() == (measured, len(listed))
    assert sum(n for _, _, n in listed) == 12
