"""Every baseline finds the optimum of a landscape that is easy for it; the oracle is exact; the
static default is TF Serving's guidance; adaptive RRL closes the gap plain RRL leaves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.knobs import Knobs
from rrl.tuners.adaptive import AdaptiveSettings, make_adaptive_rrl
from rrl.tuners.measurement import Measurement
from rrl.tuners.region_rl import RRLSettings, make_rrl
from rrl.tuners.registry import TUNERS, build_tuner
from tests.rrl.helpers import SPACE, drive, problem
from tests.rrl.synthetic import Landscape, bowl, random_lipschitz

EASY = bowl(np.array([4, 2, 2, 1, 0.0]), scale=1.0, floor=20.0)


@pytest.mark.parametrize(
    ("name", "budget"),
    [("exhaustive", 640), ("random", 640), ("qlearning", 700), ("bo", 80), ("hill-climb", 60)],
)
def test_searching_baselines_find_the_optimum_of_a_bowl(name: str, budget: int) -> None:
    land = Landscape.from_function(SPACE, EASY)
    for seed in range(2):
        tuner = build_tuner(name, problem(seed))
        _, recommended = drive(tuner, land, budget)
        assert SPACE.flat(recommended[-1]) == land.optimum, (name, seed)


def test_the_oracle_is_exact() -> None:
    # A rugged landscape with many local minima: exhaustive search recommends its exact argmin
    # once it has measured every configuration, and never anything else afterwards.
    f = random_lipschitz(SPACE, lipschitz=5.0, floor=1.0, cones=40, seed=9)
    land = Landscape.from_function(SPACE, f)
    tuner = build_tuner("exhaustive", problem(0))
    proposed, recommended = drive(tuner, land, SPACE.size + 20)
    assert sorted(SPACE.flat(c) for c in proposed[: SPACE.size]) == list(range(SPACE.size))
    assert all(SPACE.flat(c) == land.optimum for c in recommended[SPACE.size - 1 :])


def test_static_default_is_tf_serving_guidance_and_never_moves() -> None:
    land = Landscape.from_function(SPACE, EASY)
    proposed, recommended = drive(build_tuner("static", problem(0)), land, 10)
    expected = Knobs(128, 0.0, 2, 2, 2)  # threads = cores, batch threads = cores, large batch
    assert set(proposed) == set(recommended) == {expected}


class _BatchSLO:
    """Latency falls with the batch size until batches of more than 16 rows miss the SLO."""

    def measure(self, config: Knobs) -> Measurement:
        late = config.max_batch_size > 16
        return Measurement(
            duration_s=1.0,
            offered=100,
            completed=100,
            p50_ms=50.0,
            p95_ms=200.0 if late else 100.0 / config.max_batch_size,
            p99_ms=250.0,
            slo_violations=30 if late else 0,
            rejected=0,
        )


def test_aimd_settles_at_the_largest_batch_that_meets_the_slo() -> None:
    tuner = build_tuner("aimd", problem(0))
    env = _BatchSLO()
    batches = []
    for _ in range(200):
        config = tuner.propose()
        tuner.observe(config, env.measure(config))
        batches.append(config.max_batch_size)
        # Only the batch size moves; the rest is the static default.
        assert dataclasses.replace(config, max_batch_size=128) == Knobs(128, 0.0, 2, 2, 2)
    tail = batches[100:]
    assert set(tail) == {16, 32}  # it probes one notch above, then backs off
    assert tuner.recommend().max_batch_size == 16


def test_inflight_climbs_to_the_best_concurrency() -> None:
    # Only concurrency matters here, with its best at 3; the other knobs are the default's.
    land = Landscape.from_function(SPACE, lambda x: 10.0 + 4.0 * np.abs(x[:, 2] - 2.0))
    tuner = build_tuner("inflight", problem(0))
    proposed, recommended = drive(tuner, land, 30)
    assert {c.concurrency for c in proposed} >= {2, 3, 4}
    assert recommended[-1].concurrency == 3


def test_adaptive_rrl_refines_inside_the_best_regions() -> None:
    # A bowl whose bottom a radius-2.5 covering misses: RRL exploiting its measured centres
    # ends on the best centre, adaptive RRL keeps measuring (few configurations) until it
    # reaches the bottom.
    gaps_rrl, gaps_adaptive, measured = [], [], []
    for seed in range(3):
        land = Landscape.from_function(SPACE, EASY)
        rrl = make_rrl(problem(seed), RRLSettings(radius=2.5, greedy_on_estimates=False))
        _, rec = drive(rrl, land, 80)
        gaps_rrl.append(land.value(rec[-1]) / land.optimum_value - 1)
        adaptive = make_adaptive_rrl(problem(seed), AdaptiveSettings(coarse_radius=2.5))
        proposed, rec = drive(adaptive, land, 80)
        gaps_adaptive.append(land.value(rec[-1]) / land.optimum_value - 1)
        measured.append(len({SPACE.flat(c) for c in proposed}))
    assert max(gaps_adaptive) <= 0.02
    assert max(gaps_adaptive) < max(gaps_rrl)
    assert max(measured) < SPACE.size / 8


def test_every_tuner_learns_from_configurations_it_did_not_propose() -> None:
    # An online safety layer may run something else: every tuner must take that observation,
    # including off-grid knobs (snapped), and keep proposing configurations on the grid.
    land = Landscape.from_function(SPACE, EASY)
    for name in TUNERS:
        tuner = build_tuner(name, problem(0))
        tuner.observe(Knobs(24, 3.0, 1, 1, 1), land.measure(Knobs(32, 4.0, 1, 1, 1)))
        for _ in range(5):
            other = SPACE.at(int(np.random.default_rng(1).integers(SPACE.size)))
            tuner.observe(other, land.measure(other))
            assert tuner.propose() in SPACE
            assert tuner.recommend() in SPACE
        assert isinstance(tuner.snapshot(), dict)
