"""The configuration space: index coordinates, machine limits, snapping, and that its vocabulary
is the gateway's (knob names, knob objects, window snapshots)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from models.knobs import InvalidKnobs, KnobLimits, Knobs
from models.window_stats import WindowStats
from rrl.tuners.measurement import Measurement
from rrl.tuners.objective import CostObjective, LatencyObjective, make_objective
from rrl.tuners.space import ConfigSpace, core_share, expert_default, tf_serving_default


def test_full_grid_on_two_cores() -> None:
    space = ConfigSpace.for_machine(2)
    assert space.batch_sizes == (1, 2, 4, 8, 16, 32, 64, 128)
    assert space.timeouts_ms == (0.0, 1.0, 2.0, 4.0, 8.0)
    assert space.concurrency == (1, 2, 3, 4)  # up to twice the cores
    assert space.intra_op_threads == (1, 2) and space.inter_op_threads == (1, 2)  # the cores
    assert space.size == 640 == len(set(space.configs))
    assert ConfigSpace.for_machine(4).intra_op_threads == (1, 2, 3, 4)


def test_index_coordinates_are_notches() -> None:
    space = ConfigSpace.for_machine(2)
    base = Knobs(1, 0.0, 1, 1, 1)
    assert np.array_equal(space.coord(base), np.zeros(5))
    assert np.array_equal(space.coord(Knobs(8, 0.0, 1, 1, 1)), [3, 0, 0, 0, 0])  # log2
    assert np.array_equal(space.coord(Knobs(1, 1.0, 1, 1, 1)), [0, 1, 0, 0, 0])  # 0 then 1 ms
    assert np.array_equal(space.coord(Knobs(1, 8.0, 1, 1, 1)), [0, 4, 0, 0, 0])
    assert np.array_equal(space.coord(Knobs(1, 0.0, 3, 2, 2)), [0, 0, 2, 1, 1])  # linear
    a, b = space.flat(base), space.flat(Knobs(2, 1.0, 1, 1, 1))
    assert space.distances[a, b] == pytest.approx(np.sqrt(2))
    assert set(space.ball(a, 1.0)) == {
        space.flat(c)
        for c in (
            base,
            Knobs(2, 0.0, 1, 1, 1),
            Knobs(1, 1.0, 1, 1, 1),
            Knobs(1, 0.0, 2, 1, 1),
            Knobs(1, 0.0, 1, 2, 1),
            Knobs(1, 0.0, 1, 1, 2),
        )
    }


def test_coarse_grid_keeps_distances_in_notches() -> None:
    coarse = ConfigSpace((1, 4, 16), (0.0, 2.0, 8.0), (1, 2, 4), (1, 2), (1,))
    assert np.array_equal(coarse.coord(Knobs(4, 8.0, 4, 2, 1)), [2, 3, 3, 1, 0])
    assert coarse.at_coord([2.2, 2.6, 2.4, 1, 0]) == Knobs(4, 8.0, 4, 2, 1)


@pytest.mark.parametrize(
    "axes",
    [
        ((1, 3), (0.0, 1.0), (1,), (1,), (1,)),  # batch not a power of two
        ((1, 2), (1.0, 2.0), (1,), (1,), (1,)),  # timeout without 0
        ((1, 2), (0.0, 1.0, 3.0), (1,), (1,), (1,)),  # timeout not doubling
        ((1, 2), (0.0, 1.0), (0, 1), (1,), (1,)),  # concurrency from 0
    ],
)
def test_invalid_axes_are_refused(axes: tuple[tuple[float, ...], ...]) -> None:
    with pytest.raises(ValueError):
        ConfigSpace(*axes)  # type: ignore[arg-type]


def test_snap_moves_off_grid_knobs_to_the_nearest_notch() -> None:
    space = ConfigSpace.for_machine(2)
    assert space.snap(Knobs(100, 0.3, 9, 1, 1)) == Knobs(128, 0.0, 4, 1, 1)
    assert space.snap(Knobs(3, 0.8, 2, 2, 1)) == Knobs(4, 1.0, 2, 2, 1)
    assert space.snap(Knobs(24, 3.0, 0, 5, 1)) in space


def test_tf_serving_default() -> None:
    space = ConfigSpace.for_machine(2)
    assert tf_serving_default(space, 2) == Knobs(128, 0.0, 2, 2, 2)


def test_several_models_start_from_an_equal_share_of_the_cores() -> None:
    assert [core_share(8, n) for n in (0, 1, 2, 3, 4, 9)] == [8, 8, 4, 2, 2, 1]
    # Two models on 2 cores: one instance of one thread each, together within the cores.
    assert expert_default(core_share(2, 2), 128) == Knobs(32, 0.0, 1, 1, 1)


def test_a_knob_change_by_wire_names_is_the_same_knobs_again() -> None:
    knobs = Knobs(max_batch_size=32, batch_timeout_ms=2.0)
    config = Knobs(8, 4.0, 3, 2, 1)
    changed = KnobLimits(max_batch_size=128).check(knobs.with_changes(config.as_dict()))
    assert changed == config
    assert knobs == Knobs(32, 2.0, 1, 1, 1) and knobs.batch_timeout_s == 0.002
    assert knobs.with_changes({"concurrency": 2}) == Knobs(32, 2.0, 2, 1, 1)


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"max_batch": 4}, "unknown knob(s) ['max_batch']"),
        ({"concurrency": 1.5}, "concurrency must be an integer"),
        ({"intra_op_threads": True}, "intra_op_threads must be an integer"),
        ({"batch_timeout_ms": "2"}, "batch_timeout_ms must be a number"),
    ],
)
def test_a_malformed_knob_change_is_refused_with_its_name(
    changes: dict[str, object], names: str
) -> None:
    with pytest.raises(InvalidKnobs, match=re.escape(names)):
        Knobs().with_changes(changes)


@pytest.mark.parametrize(
    ("knobs", "names"),
    [
        (Knobs(max_batch_size=129), "max_batch_size must be an integer in [1, 128]"),
        (Knobs(batch_timeout_ms=1000.5), "batch_timeout_ms must be in [0, 1000]"),
        (Knobs(concurrency=17), "concurrency must be an integer in [1, 16]"),
        (Knobs(inter_op_threads=0), "inter_op_threads must be an integer in [1, 8]"),
    ],
)
def test_knobs_outside_the_machines_limits_are_refused_with_the_limit(
    knobs: Knobs, names: str
) -> None:
    with pytest.raises(InvalidKnobs, match=re.escape(names)):
        KnobLimits(max_batch_size=128, max_threads=8).check(knobs)


def test_measurement_from_gateway_window_stats() -> None:
    stats = WindowStats(
        window_s=5.0,
        completed=95,
        rate_per_s=19.0,
        rows_per_request=2.0,
        p50_ms=3.0,
        p95_ms=9.0,
        p99_ms=12.0,
        slo_violations=4,
        rejected=5,
        queue_depth=0,
    )
    m = Measurement.from_window_stats(stats)
    assert (m.offered, m.completed, m.slo_violations, m.rejected) == (100, 95, 9, 5)
    assert m.rate_per_s == pytest.approx(20.0) and m.violation_fraction == pytest.approx(0.09)
    assert m.rows_per_request == 2.0


def test_objectives() -> None:
    config = Knobs(8, 0.0, 2, 2, 1)
    good = Measurement(5.0, 100, 100, 2.0, 8.0, 9.0, 0, 0, cpu_cores=0.5)
    bad = dataclasses.replace(good, completed=60, slo_violations=40, rejected=40, p95_ms=90.0)
    latency = make_objective("latency", slo_ms=100.0, cores=2)
    assert isinstance(latency, LatencyObjective)
    assert latency(config, good) == 8.0
    assert latency(config, bad) == pytest.approx(90.0 + 2 * 100.0 * 0.4)
    cost = make_objective("cost", slo_ms=100.0, cores=2)
    assert isinstance(cost, CostObjective)
    assert cost(config, good) == pytest.approx(0.5)  # SLO met: only the cores count
    no_cpu = dataclasses.replace(good, cpu_cores=None)
    assert cost(config, no_cpu) == 2.0  # the threads it holds, capped at the cores
    assert cost(config, bad) > cost(config, good) + 1.0
    with pytest.raises(ValueError):
        make_objective("throughput", slo_ms=1.0, cores=1)
