"""Arrival processes: counts and spacing have the statistics the processes promise, and a seed
reproduces a schedule exactly. Tolerances are a few standard errors, not tuned to a seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from device_sim.arrivals import Constant, Diurnal, OnOff, Poisson, make_process


def window_counts(times: np.ndarray, duration_s: float, window_s: float = 1.0) -> np.ndarray:
    edges = np.arange(0.0, duration_s + window_s / 2, window_s)
    return np.histogram(times, bins=edges)[0]


def test_constant_is_evenly_spaced_with_the_exact_count() -> None:
    times = Constant(50).sample(np.random.default_rng(0), 4.0)
    assert times.size == 200
    assert times[0] == 0.0
    np.testing.assert_allclose(np.diff(times), 0.02)
    assert window_counts(times, 4.0).tolist() == [50, 50, 50, 50]


def test_poisson_counts_have_mean_and_variance_equal_to_the_rate() -> None:
    rate, duration = 50.0, 1000.0
    times = Poisson(rate).sample(np.random.default_rng(1), duration)
    counts = window_counts(times, duration)
    n = counts.size
    # Mean of n Poisson(rate) counts: standard error sqrt(rate/n).
    assert abs(counts.mean() - rate) < 4 * math.sqrt(rate / n)
    # Index of dispersion (variance/mean) of Poisson counts is 1, standard error ~sqrt(2/(n-1)).
    assert abs(counts.var(ddof=1) / counts.mean() - 1) < 4 * math.sqrt(2 / (n - 1))
    gaps = np.diff(times)
    # Exponential gaps: mean 1/rate, coefficient of variation 1.
    assert abs(gaps.mean() * rate - 1) < 4 / math.sqrt(gaps.size)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.05
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < duration


@pytest.mark.parametrize(
    "process",
    [Poisson(20), OnOff(40, 1.0, 2.0, off_rate=5), Diurnal(20, 0.8, 10.0), Constant(7)],
    ids=["poisson", "onoff", "diurnal", "constant"],
)
def test_a_seed_reproduces_the_schedule(process: object) -> None:
    a = process.sample(np.random.default_rng(42), 30.0)  # type: ignore[attr-defined]
    b = process.sample(np.random.default_rng(42), 30.0)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(a, b)
    if not isinstance(process, Constant):
        c = process.sample(np.random.default_rng(43), 30.0)  # type: ignore[attr-defined]
        assert a.size != c.size or not np.array_equal(a, c)


def test_onoff_is_silent_between_bursts_and_poisson_within_them() -> None:
    process = OnOff(rate=100, on_s=1.0, off_s=3.0)
    duration = 400.0
    times = process.sample(np.random.default_rng(2), duration)
    phase_in_cycle = times % 4.0
    assert np.all(phase_in_cycle < 1.0)  # nothing in the off periods
    counts = window_counts(times, duration)[::4]  # the on seconds
    assert abs(counts.mean() - 100) < 4 * math.sqrt(100 / counts.size)
    assert abs(times.size / duration - process.mean_rate()) < 4 * math.sqrt(25 / duration)


def test_onoff_off_rate_fills_the_pauses() -> None:
    times = OnOff(rate=50, on_s=1.0, off_s=1.0, off_rate=10).sample(np.random.default_rng(3), 400.0)
    off = (times % 2.0) >= 1.0
    # 200 off seconds at 10/s: 2000 expected, standard deviation ~45.
    assert abs(off.sum() - 2000) < 4 * math.sqrt(2000)


def test_diurnal_rate_follows_the_sine() -> None:
    rate, amplitude, period = 100.0, 0.5, 10.0
    duration = 1000.0
    times = Diurnal(rate, amplitude, period).sample(np.random.default_rng(4), duration)
    rising = (times % period) < period / 2  # where sin > 0
    # Integral of the rate over the half periods: rate*P/2*(1 ± 2a/π) per period.
    cycles = duration / period
    high = rate * period / 2 * (1 + 2 * amplitude / math.pi) * cycles
    low = rate * period / 2 * (1 - 2 * amplitude / math.pi) * cycles
    assert abs(rising.sum() - high) < 4 * math.sqrt(high)
    assert abs((~rising).sum() - low) < 4 * math.sqrt(low)
    assert abs(times.size - rate * duration) < 4 * math.sqrt(rate * duration)


def test_invalid_parameters_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="rate"):
        Poisson(-1)
    with pytest.raises(ValueError, match="amplitude"):
        Diurnal(10, 1.5, 5)
    with pytest.raises(ValueError, match="on_s"):
        OnOff(10, 0, 1)
    with pytest.raises(ValueError, match="unknown arrival process 'gauss'"):
        make_process("gauss", {"rate": 1})
    with pytest.raises(ValueError, match="poisson"):
        make_process("poisson", {"rate": 1, "burst": 3})
    assert make_process("onoff", {"rate": 5, "on_s": 1, "off_s": 1}) == OnOff(5, 1, 1)
