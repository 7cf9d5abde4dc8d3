"""The per-batch service time admission control plans with: per size bucket, robust to one
slow batch, extrapolated upwards for sizes not seen yet."""

from __future__ import annotations

import pytest

from models.batching_rule import ServiceTimeEstimate


def test_nothing_known_predicts_nothing() -> None:
    assert ServiceTimeEstimate().predict(4) is None


def test_slow_batches_do_not_move_the_estimate_until_they_last() -> None:
    est = ServiceTimeEstimate(window=15)
    for slow in (0.035, 0.034, 0.025):  # e.g. a fresh session's first calls
        est.observe(1, slow)
    est.observe(1, 0.001)
    est.observe(1, 0.150)  # e.g. next to a session rebuild
    assert est.predict(1) == pytest.approx(0.001)
    # A lasting slowdown does move it, once it fills the window.
    for _ in range(13):
        est.observe(1, 0.004)
    assert est.predict(1) == pytest.approx(0.001)  # still in the window of 15
    est.observe(1, 0.004)
    assert est.predict(1) == pytest.approx(0.004)


def test_sizes_share_power_of_two_buckets_and_unseen_sizes_are_over_estimated() -> None:
    est = ServiceTimeEstimate()
    est.observe(3, 0.002)  # bucket of 3..4 rows
    est.observe(4, 0.004)
    assert est.predict(4) == pytest.approx(0.002)  # the fastest of the bucket
    assert est.predict(16) == pytest.approx(0.002 * 4)  # two buckets up: scaled linearly
    assert est.predict(1) == pytest.approx(0.002)  # below: the smallest measured


def test_the_high_pace_is_the_90th_percentile_of_its_bucket() -> None:
    est = ServiceTimeEstimate(window=11)
    assert est.high(4) is None
    for seconds in (0.001, 0.010, 0.003, 0.150, 0.004, 0.002, 0.005, 0.006, 0.007, 0.008, 0.009):
        est.observe(4, seconds)
    assert est.high(4) == pytest.approx(0.010)  # the one slowest batch does not set it
    assert est.predict(4) == pytest.approx(0.001)  # while admission plans with the fastest
    assert est.high(16) == est.predict(16)  # not measured: as predicted
