"""The per-batch service time admission control plans with: per size bucket, robust to one
slow batch, extrapolated upwards for sizes not seen yet."""

from __future__ import annotations

import pytest

from gateway.service_time import ServiceTimeEstimate


def test_nothing_known_predicts_nothing() -> None:
    assert ServiceTimeEstimate().predict(4) is None


def test_one_slow_batch_does_not_move_the_estimate() -> None:
    est = ServiceTimeEstimate(window=15)
    for _ in range(10):
        est.observe(1, 0.001)
    est.observe(1, 0.150)  # e.g. next to a session rebuild
    assert est.predict(1) == pytest.approx(0.001)
    # A lasting change does move it, once it is most of the window.
    for _ in range(10):
        est.observe(1, 0.004)
    assert est.predict(1) == pytest.approx(0.004)


def test_sizes_share_power_of_two_buckets_and_unseen_sizes_are_over_estimated() -> None:
    est = ServiceTimeEstimate()
    est.observe(3, 0.002)  # bucket of 3..4 rows
    est.observe(4, 0.004)
    assert est.predict(4) == pytest.approx(0.003)  # the median of the bucket
    assert est.predict(16) == pytest.approx(0.003 * 4)  # two buckets up: scaled linearly
    assert est.predict(1) == pytest.approx(0.003)  # below: the smallest measured
