"""Resting's parts on their own: the degradation rule, the prediction cache and the wake
detector. The whole agent resting and waking is decided in virtual time in
``tests/rrl/test_scripted_rest.py``."""

from __future__ import annotations

import pytest

from models.knobs import Knobs
from rrl.agent.queueing import Arrivals, QueueModel
from rrl.agent.resting import Rest
from rrl.agent.settings import RestSettings
from rrl.tuners.objective import make_objective


def test_a_rest_ends_when_two_windows_running_serve_the_same_load_twice_as_slowly() -> None:
    rest = Rest(RestSettings(), base_interval_s=0.5)
    for p95 in (3.4, 1.1, 3.0):  # the incumbent's windows: the rest's baseline is their median
        rest.note("key", p95)
    rest.note("other key", 0.5)
    rest.begin(0.0, 200.0, 1.0, key="key")
    assert rest.state is not None and rest.state.p95_ms == 3.0
    # Noise, and one slow window between ordinary ones: still resting.
    assert rest.degraded(5.5) is None and rest.degraded(3.2) is None
    assert rest.degraded(7.0) is None and rest.degraded(2.8) is None
    # Two windows running beyond twice the p95 it rested at.
    assert rest.degraded(7.0) is None
    why = rest.degraded(9.0)
    assert why is not None and "3.0ms it rested at" in why, why
    # A tiny p95 must also grow by a millisecond; the interval's doubling keeps the baseline.
    rest.wake()
    rest.note("fast", 0.3)
    rest.begin(0.0, 200.0, 1.0, key="fast")
    rest.note("fast", 40.0)
    rest.begin(1.0, 200.0, 1.0, key="fast")
    assert rest.state is not None and rest.state.p95_ms == 0.3
    assert rest.degraded(1.2) is None and rest.degraded(1.3) is None
    assert rest.degraded(1.4) is None and rest.degraded(1.5) is not None


def test_the_same_question_at_the_same_load_is_answered_from_the_cache() -> None:
    model = QueueModel(make_objective("latency", slo_ms=100.0, cores=2), cores=2)
    model.observe_service((2, 1), {1: [0.0004] * 10, 4: [0.0006] * 10, 32: [0.002] * 10})
    config = Knobs(32, 0.0, 2, 1, 1)
    first = model.predict_many([(config, Arrivals(300.0), None)])[0]
    simulated = model.simulations
    assert first is not None and simulated == model.settings.replicas
    # A rate within the same eighth of a level, and fresh service times that moved a little
    # (the gateway reports its latest batches every window): no simulation.
    model.observe_service((2, 1), {1: [0.00042] * 10, 4: [0.00061] * 10, 32: [0.0021] * 10})
    again = model.predict_many([(config, Arrivals(305.0), None)])[0]
    assert again is not None and model.simulations == simulated
    assert again.p95_ms == pytest.approx(first.p95_ms)
    assert model.cached(config, Arrivals(302.0)) is not None
    # A calibration offset applies to cached answers at once.
    model._residuals.extend([1.0, 1.0, 1.0])
    shifted = model.cached(config, Arrivals(300.0))
    assert shifted is not None and shifted.p95_ms == pytest.approx(first.p95_ms + 1.0)
    # Service times that moved beyond the threshold, or another rate: simulated again.
    model.observe_service((2, 1), {32: [0.004] * 10})
    model.predict_many([(config, Arrivals(300.0), None)])
    assert model.simulations == 2 * simulated
    model.predict_many([(config, Arrivals(600.0), None)])
    assert model.simulations == 3 * simulated


def test_the_wake_detector_ignores_poisson_noise_and_sees_a_step_in_one_tick() -> None:
    import numpy as np

    rest = Rest(RestSettings(), base_interval_s=0.5)
    rest.begin(0.0, 200.0, 1.0, key=None)
    rng = np.random.default_rng(0)
    # An hour of half-second ticks at the rested rate: never woken.
    for n in rng.poisson(100.0, size=7200):
        assert rest.surprised(int(n), float(n), 0.5) is None
    # Four times the rate: one tick.
    assert rest.surprised(400, 400.0, 0.5) is not None
    # A quarter of the rate: one tick at this rate.
    rest.wake()
    rest.begin(0.0, 200.0, 1.0, key=None)
    assert rest.surprised(25, 25.0, 0.5) is not None
    # Requests four times as large: one tick.
    rest.wake()
    rest.begin(0.0, 200.0, 1.0, key=None)
    assert rest.surprised(100, 400.0, 0.5) is not None
    # The interval doubles while resting, up to its limit.
    rest.wake()
    rest.begin(0.0, 200.0, 1.0, key=None)
    intervals = [rest.interval_s()]
    for _ in range(4):
        rest.begin(1.0, 200.0, 1.0, key=None)
        intervals.append(rest.interval_s())
    assert intervals == [1.0, 2.0, 4.0, 4.0, 4.0]
    # A rest ends by itself after 30 s, the gate asked again; the next lasts twice as long.
    assert not rest.due_for_recheck(29.0) and rest.resting
    assert rest.due_for_recheck(31.0) and not rest.resting
    rest.begin(100.0, 200.0, 1.0, key=None)
    assert not rest.due_for_recheck(159.0)
    assert rest.due_for_recheck(161.0)
