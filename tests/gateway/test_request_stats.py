"""A model version's request statistics by time (gateway/request_stats.py): right at any rate,
exact where the tuner reads them, bounded. Times are passed in (an injected clock): nothing
here depends on how fast the test runs."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.request_stats import EXACT_RECORDS, MAX_WINDOW_S, RequestStats

SLO_S = 0.050


def _run(
    stats: RequestStats, rate: float, seconds: float, rng: np.random.Generator
) -> list[tuple[float, float]]:
    """``rate`` requests a second for ``seconds`` from t = 1000, each arriving and answered
    (latency drawn from 1-80 ms), every 50th refused, recorded in time order as the gateway
    records them; returns (time, latency s) of those answered."""
    events: list[tuple[float, int, float]] = []  # (time, kind, latency): 0 arrive, 1 done
    for i, latency in enumerate(rng.uniform(0.001, 0.080, int(rate * seconds))):
        t = 1000.0 + i / rate
        events.append((t, 0, 0.0))
        events.append((t, 2, 0.0) if i % 50 == 49 else (t + latency, 1, float(latency)))
    answered: list[tuple[float, float]] = []
    for t, kind, latency in sorted(events):
        if kind == 0:
            stats.arrive(t, 2)
        elif kind == 2:
            stats.reject(t)
        else:
            stats.complete(t, latency, 2)
            answered.append((t, latency))
    return answered


@pytest.mark.parametrize("rate", [3_166.0, 6_000.0])
def test_a_ten_second_window_reads_the_rate_above_2000_per_second(rate: float) -> None:
    # 20,000 requests over a 10 s window once read 2,000 req/s at any higher rate.
    stats = RequestStats(slo_s=SLO_S)
    answered = _run(stats, rate, 12.0, np.random.default_rng(1))
    now = answered[-1][0]
    w = stats.window(now, 10.0, queue_depth=0, in_system=0)
    truth = [lat for t, lat in answered if t >= now - 10.0]
    assert w.rate_per_s == pytest.approx(len(truth) / 10.0, rel=0.002)
    assert w.completed == pytest.approx(len(truth), rel=0.002)
    arrivals = sum(1000.0 + i / rate >= now - 10.0 for i in range(int(rate * 12.0)))
    assert w.arrived == pytest.approx(arrivals, rel=0.002)
    assert w.arrived_rows == pytest.approx(2 * arrivals, rel=0.002)
    assert w.rejected == pytest.approx(arrivals / 50, rel=0.01)
    assert w.rows_per_request == pytest.approx(2.0)
    assert w.slo_violations == pytest.approx(sum(lat > SLO_S for lat in truth), rel=0.01)
    # The percentiles cover the whole window, within a histogram bin (2^(1/8), about 9%).
    want = np.percentile(np.array(truth) * 1000.0, [50, 95, 99])
    assert [w.p50_ms, w.p95_ms, w.p99_ms] == pytest.approx(want.tolist(), rel=0.05)


def test_an_hour_window_counts_every_request() -> None:
    stats = RequestStats(slo_s=SLO_S)
    answered = _run(stats, 2_500.0, 16.0, np.random.default_rng(2))
    w = stats.window(answered[-1][0], float(MAX_WINDOW_S), queue_depth=0, in_system=0)
    assert w.completed == len(answered)
    assert w.arrived == 40_000


def test_windows_inside_the_exact_records_are_exact_as_the_tuner_reads_them() -> None:
    # The tuner's ticks (half a second) and trials (edges a fraction of a second after a knob
    # change): exactly the records inside, at a rate that overflows the exact store.
    stats = RequestStats(slo_s=SLO_S)
    answered = _run(stats, 8_000.0, 4.0, np.random.default_rng(3))
    now = answered[-1][0]
    for window_s in (0.5, 1.3, 2.0):
        w = stats.window(now, window_s, queue_depth=3, in_system=4)
        inside = [lat for t, lat in answered if t >= now - window_s]
        assert w.completed == len(inside)
        want = np.percentile(np.array(inside) * 1000.0, [50, 95, 99]).tolist()
        assert [w.p50_ms, w.p95_ms, w.p99_ms] == want
        assert w.slo_violations == sum(lat > SLO_S for lat in inside)
        assert (w.queue_depth, w.in_system) == (3, 4)


def test_below_the_exact_store_every_window_is_exact() -> None:
    stats = RequestStats(slo_s=SLO_S)
    answered = _run(stats, 500.0, 30.0, np.random.default_rng(4))  # 15,000 < 20,000
    now = answered[-1][0]
    w = stats.window(now, 10.0, queue_depth=0, in_system=0)
    inside = [lat for t, lat in answered if t >= now - 10.0]
    assert w.completed == len(inside)
    assert w.p99_ms == np.percentile(np.array(inside) * 1000.0, 99)


def test_memory_is_bounded_by_the_longest_window() -> None:
    stats = RequestStats(slo_s=SLO_S, exact=100, max_window_s=60)
    for i in range(30_000):  # 300 s at 100 req/s
        t = i / 100.0
        stats.arrive(t, 1)
        stats.complete(t + 0.001, 0.001, 1)
    assert stats.seconds_kept <= 62
    w = stats.window(300.0, 60.0, queue_depth=0, in_system=0)
    assert w.completed == pytest.approx(6_000, abs=100)


def test_completions_per_second_spans_both_stores() -> None:
    stats = RequestStats(slo_s=SLO_S, exact=EXACT_RECORDS // 100)
    for second in range(10):
        for i in range(100 * (second + 1)):  # 100, 200, ... 1,000 in second 0 .. 9
            stats.complete(second + i / (100 * (second + 1)), 0.002, 1)
    assert stats.completions_per_second(9.5, 12) == [0, 0] + [100 * (s + 1) for s in range(10)]


def test_an_idle_model_reads_zero() -> None:
    w = RequestStats(slo_s=SLO_S).window(5.0, 10.0, queue_depth=0, in_system=0)
    assert (w.completed, w.rate_per_s, w.p95_ms, w.arrived, w.rows_per_request) == (0, 0, 0, 0, 0)


def test_the_peak_inside_is_read_at_arrivals_whatever_is_inside_now() -> None:
    # A closed loop of 4 whose one batch holds all of them: the model empties at once after
    # each batch, so the count now reads 0, yet every window held all 4 at once.
    stats = RequestStats(slo_s=SLO_S)
    t = 0.0
    for _ in range(50):
        for inside in range(1, 5):
            stats.arrive(t, 1, inside)
            t += 0.001
        for _ in range(4):
            stats.complete(t + 0.002, 0.004, 1)
        t += 0.003
    w = stats.window(t, 0.1, queue_depth=0, in_system=0)
    assert (w.in_system, w.in_system_peak) == (0, 4)
    # Nothing arrived in the window: the peak is what is inside now.
    idle = stats.window(t + 5.0, 1.0, queue_depth=0, in_system=2)
    assert idle.in_system_peak == 2


def test_a_window_reaching_past_the_exact_records_keeps_the_peak_of_each_second() -> None:
    stats = RequestStats(slo_s=SLO_S, exact=100)
    stats.arrive(10.2, 1, 9)  # the busiest moment, in second 10
    for i in range(1, 400):  # then three seconds at 3 inside at most
        stats.arrive(10.5 + i / 133.0, 1, 1 + i % 3)
    assert stats.window(13.5, 3.5, queue_depth=0, in_system=0).in_system_peak == 9
    assert stats.window(13.5, 1.0, queue_depth=0, in_system=0).in_system_peak == 3
