"""Change detection: a step in arrival rate is detected within the promised time; a steady noisy
rate (even one on a level boundary) and a rate flapping faster than the window are not."""

from __future__ import annotations

import numpy as np
import pytest

from rrl.tuners.workload import (
    MIN_COUNT_FOR_PROMISE,
    MonitorSettings,
    WorkloadMonitor,
    WorkloadState,
    index_of_dispersion,
)

TICK_S = 1.0


def _feed(
    monitor: WorkloadMonitor,
    rng: np.random.Generator,
    rate: float,
    seconds: int,
    start: float,
    rows: int = 1,
) -> float:
    t = start
    for _ in range(seconds):
        t += TICK_S
        n = int(rng.poisson(rate * TICK_S))
        monitor.update(t, n, n * rows)
    return t


@pytest.mark.parametrize("rate", [0.5, 2.0, 3.0, 8.0, 11.3, 16.0, 90.5, 1000.0, 1448.2])
def test_a_steady_noisy_rate_keeps_its_state(rate: float) -> None:
    # 11.3, 90.5 and 1448.2 sit on level boundaries (2**3.5, 2**6.5, 2**10.5), the hardest case.
    rng = np.random.default_rng(int(rate * 10))
    monitor = WorkloadMonitor()
    _feed(monitor, rng, rate, 3600, 0.0)  # an hour of one-second snapshots
    assert monitor.state is not None
    assert len(monitor.changes) <= 2  # the initial state, at most one settling move
    if len(monitor.changes) == 2:  # a settling move is by one level, and only early
        assert abs(monitor.changes[1].new.rate_level - monitor.changes[0].new.rate_level) == 1


@pytest.mark.parametrize("rate", [10.0, 16.0, 64.0, 300.0, 5000.0])
@pytest.mark.parametrize("factor", [4.0, 0.25, 16.0])
def test_a_step_is_detected_within_the_promised_time(rate: float, factor: float) -> None:
    rng = np.random.default_rng(int(rate) + int(factor * 100))
    for trial in range(40):
        monitor = WorkloadMonitor()
        t = _feed(monitor, rng, rate, 20, 0.0)
        before = monitor.state
        assert before is not None
        # The new rate is `factor` times the current state's level rate: a step of >= 2 levels.
        new_rate = 2.0**before.rate_level * factor
        if new_rate * monitor.settings.window_s < MIN_COUNT_FOR_PROMISE:
            continue  # too few arrivals for the promise to cover
        step_at = t
        while monitor.state == before:
            t = _feed(monitor, rng, new_rate, 1, t)
            assert t - step_at <= monitor.detection_bound_s(TICK_S), (trial, t - step_at)
        assert monitor.state is not None
        assert (monitor.state.rate_level - before.rate_level) * np.sign(np.log(factor)) >= 1
        # The change reports the rate the new state was judged from: the latest updates, not
        # the window that still straddles the step (which can be a level short of the new rate).
        # Within half a level of the new rate (detection picks the updates that departed, so
        # it leans high when they hold few arrivals).
        if new_rate * 2 * TICK_S >= 50:  # enough arrivals in the judging updates to tell
            assert abs(np.log2(monitor.changes[-1].rate_per_s / new_rate)) < 0.5


def test_a_flapping_rate_does_not_thrash() -> None:
    rng = np.random.default_rng(3)
    for period in (1, 2):
        monitor = WorkloadMonitor()
        t = 0.0
        for k in range(1800 // period):
            t = _feed(monitor, rng, 64.0 if k % 2 else 256.0, period, t)
        assert len(monitor.changes) <= 2, monitor.changes


def test_request_size_is_part_of_the_state() -> None:
    rng = np.random.default_rng(4)
    monitor = WorkloadMonitor(MonitorSettings(base_rate_per_s=16.0))
    t = _feed(monitor, rng, 64.0, 10, 0.0, rows=1)
    assert monitor.state == WorkloadState(2, 0)
    t = _feed(monitor, rng, 64.0, 10, t, rows=8)
    assert monitor.state == WorkloadState(2, 3)
    assert monitor.rows_per_request == pytest.approx(8.0)
    assert monitor.rate_per_s == pytest.approx(64.0, rel=0.3)


def test_no_traffic_is_the_lowest_level_not_an_error() -> None:
    monitor = WorkloadMonitor(MonitorSettings(base_rate_per_s=1.0, min_rate_per_s=0.25))
    for t in range(1, 20):
        monitor.update(float(t), 0)
    assert monitor.state == WorkloadState(-2, 0)


def test_a_step_inside_an_update_lands_on_the_new_level_at_once() -> None:
    # Half-second updates, the step from 16/s to 256/s falls inside one: that update mixes both
    # rates, and a level estimated with it would fall short (7, then a second change to 8).
    rng = np.random.default_rng(11)
    for trial in range(40):
        monitor = WorkloadMonitor()
        t = 0.0
        for _ in range(40):
            t += 0.5
            monitor.update(t, int(rng.poisson(16 * 0.5)))
        assert monitor.state is not None and monitor.state.rate_level <= 4  # (3: hysteresis)
        settled = len(monitor.changes)
        part = float(rng.uniform(0.05, 0.95))  # of the straddling update spent at the old rate
        t += 0.5
        monitor.update(t, int(rng.poisson(16 * 0.5 * part + 256 * 0.5 * (1 - part))))
        for _ in range(6):
            t += 0.5
            monitor.update(t, int(rng.poisson(256 * 0.5)))
        levels = [c.new.rate_level for c in monitor.changes[settled:]]
        assert levels == [8], (trial, part, levels)


def test_burstiness_is_read_from_successive_ticks_so_a_ramp_is_not_a_burst() -> None:
    rng = np.random.default_rng(0)
    # Poisson arrivals whose rate doubles twice inside the 16 ticks (half a second each).
    ramp = [float(c) for r, n in ((200, 6), (400, 5), (800, 5)) for c in rng.poisson(r / 2, n)]
    plain = float(np.var(ramp, ddof=1) / np.mean(ramp))
    assert plain > 20  # what the deviations from the mean read: a burst
    assert 0.5 < index_of_dispersion(ramp) < 2.0
    # Burstiness inside the ticks (negative binomial counts, 8x Poisson's variance) stays.
    mean, var = 100.0, 800.0
    bursty = rng.negative_binomial(mean * mean / (var - mean), mean / var, 16).astype(float)
    assert index_of_dispersion(list(bursty)) > 4  # memory.BURSTY_DISPERSION: a bursty state
    steady = [float(c) for c in rng.poisson(50, 16)]
    assert index_of_dispersion(steady) < 4
    assert index_of_dispersion(steady[:7]) == 1.0  # too few ticks to tell
    assert index_of_dispersion([0.0] * 16) == 1.0


def test_a_window_at_the_previous_load_is_out_of_the_new_states_band() -> None:
    # What the agent's per-state memory relies on: the first window after a drop from 300/s to
    # 30/s still carries the busy state's label, and must not be remembered for it.
    rng = np.random.default_rng(3)
    monitor = WorkloadMonitor()
    t = _feed(monitor, rng, 300.0, 10, 0.0)
    assert monitor.state is not None and monitor.state.rate_level == 8
    assert monitor.in_band(300.0) and monitor.in_band(160.0) and monitor.in_band(420.0)
    assert not monitor.in_band(30.0) and not monitor.in_band(140.0)
    assert not monitor.in_band(0.0) and not monitor.in_band(450.0)
    _feed(monitor, rng, 30.0, 10, t)
    assert monitor.state.rate_level == 5 and monitor.in_band(30.0) and not monitor.in_band(300.0)
    assert not WorkloadMonitor().in_band(1.0)  # no state yet: nothing is remembered
