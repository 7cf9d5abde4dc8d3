"""The testbed replays a profile table: measurements are recorded windows (the measured noise),
the truth is their mean objective, the oracle is its argmin, a partial table is refused."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rrl.offline.episodes import measurements_to_within, run_shifting, run_static
from rrl.offline.profiling import WINDOW_FIELDS
from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.ask_tell import TuningProblem
from rrl.tuners.objective import CostObjective, LatencyObjective
from rrl.tuners.registry import build_tuner
from rrl.tuners.space import ConfigSpace
from rrl.tuners.workload import WorkloadState

SPACE = ConfigSpace((1, 2, 4), (0.0, 1.0), (1, 2), (1,), (1,))
RATES = (16.0, 64.0, 256.0)


def _window(p95: float, offered: int = 50, violations: int = 0) -> list[float | None]:
    values: dict[str, float | None] = {
        "duration_s": 0.5,
        "offered": offered,
        "completed": offered - violations,
        "p50_ms": p95 / 2,
        "p95_ms": p95,
        "p99_ms": p95 * 1.2,
        "mean_ms": p95 / 2,
        "violations": violations,
        "rejected": violations,
        "cpu_cores": 0.5,
        "mean_batch_rows": 1.0,
    }
    return [values[f] for f in WINDOW_FIELDS]


def _doc(skip: int = 0) -> dict[str, Any]:
    """Configuration k at load l has windows with p95 = 10 + k + 5 l + (-1, 0, +1): known mean,
    known spread; at the highest load the first configuration also drops requests."""
    cells = []
    for (k, config), load in itertools.product(enumerate(SPACE.configs), range(len(RATES))):
        base = 10.0 + k + 5 * load
        windows = [_window(base + d) for d in (-1.0, 0.0, 1.0)]
        if k == 0 and load == 2:
            windows = [_window(base + d, violations=10) for d in (-1.0, 0.0, 1.0)]
        cells.append({"config": list(config.as_tuple()), "load": load, "windows": windows})
    return {
        "format": 1,
        "model": "toy",
        "slo_ms": 100.0,
        "cores": 1,
        "space": SPACE.describe(),
        "loads": [{"rate_per_s": r, "rows_per_request": 1} for r in RATES],
        "window_fields": list(WINDOW_FIELDS),
        "cells": cells[skip:],
    }


@pytest.fixture
def table(tmp_path: Path) -> ProfileTable:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(_doc()))
    return ProfileTable.load(path)


def test_measurements_are_recorded_windows(table: ProfileTable) -> None:
    testbed = Testbed(table, LatencyObjective(slo_ms=100.0), seed=0)
    config = SPACE.at(5)
    seen = {testbed.measure(config, 1).p95_ms for _ in range(200)}
    assert seen == {10.0 + 5 + 5 - 1, 10.0 + 5 + 5, 10.0 + 5 + 5 + 1}


def test_truth_oracle_and_gap(table: ProfileTable) -> None:
    objective = LatencyObjective(slo_ms=100.0)
    testbed = Testbed(table, objective, seed=0)
    truth = testbed.truth(0)
    assert truth == pytest.approx([10.0 + k for k in range(SPACE.size)])
    assert testbed.oracle(0) == (SPACE.at(0), 10.0)
    # At the highest load configuration 0 drops 10 of 50 requests: the penalty moves the oracle.
    assert testbed.truth(2)[0] == pytest.approx(20.0 + 2 * 100.0 * 0.2)
    assert testbed.oracle(2) == (SPACE.at(1), 21.0)
    assert testbed.gap(SPACE.at(3), 0) == pytest.approx(0.3)


def test_workload_states_count_levels_from_the_lowest_rate(table: ProfileTable) -> None:
    assert [table.workload_state(k) for k in range(3)] == [
        WorkloadState(0, 0),
        WorkloadState(2, 0),
        WorkloadState(4, 0),
    ]


def test_a_partial_profile_is_refused_unless_allowed(tmp_path: Path) -> None:
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(_doc(skip=3)))
    with pytest.raises(ValueError, match="lacks 3"):
        ProfileTable.load(path)
    assert ProfileTable.load(path, allow_partial=True).missing == 3


def test_measurements_to_within() -> None:
    assert measurements_to_within(np.array([0.5, 0.2, 0.04, 0.0])) == 3
    assert measurements_to_within(np.array([0.5, 0.01, 0.2, 0.0, 0.0])) == 4  # must stay
    assert measurements_to_within(np.array([0.0, 0.0])) == 1
    assert measurements_to_within(np.array([0.0, 0.3])) is None


def test_episodes_on_the_testbed(table: ProfileTable) -> None:
    objective = LatencyObjective(slo_ms=100.0)
    problem = TuningProblem(SPACE, objective, cores=1, seed=0)
    trace = run_static(
        build_tuner("exhaustive", problem),
        Testbed(table, objective, seed=1),
        0,
        20,
        interval_s=5.0,
    )
    assert trace.gaps()[SPACE.size - 1 :].max() == 0.0  # everything measured: the oracle
    # Shifting: the tuner's workload state follows the detector, one table per load level.
    tuner = build_tuner("rrl", problem)
    trace = run_shifting(
        tuner, Testbed(table, objective, seed=2), [0, 2, 0], 10, interval_s=5.0, seed=3
    )
    assert trace.load == [0] * 10 + [2] * 10 + [0] * 10
    assert tuner.snapshot()["known_states"] >= 2
    assert tuner.state == WorkloadState(0, 0)
    # Violations per interval: only configuration 0 at the highest load drops requests (10 of
    # 50), so an interval counts 0.2 of 256/s over its 5 s exactly when it measured that one.
    dropping = Testbed(table, objective, seed=2).truth(2)[0]
    for n, (violations, measured) in enumerate(zip(trace.violations, trace.measured, strict=True)):
        expected = 0.2 * 256.0 * 5.0 if 10 <= n < 20 and measured == dropping else 0.0
        assert violations == pytest.approx(expected), n


def test_a_decision_interval_merges_several_recorded_windows(table: ProfileTable) -> None:
    # Windows of 0.5 s, intervals of 5 s: ten windows drawn with replacement and merged. The
    # noise shrinks, the mean stays the truth.
    objective = LatencyObjective(slo_ms=100.0)
    config = SPACE.at(5)
    single = Testbed(table, objective, seed=0)
    merged = Testbed(table, objective, seed=0, interval_s=5.0)
    m = merged.measure(config, 1)
    assert (m.offered, m.duration_s) == (500, 5.0)
    raw = [objective(config, single.measure(config, 1)) for _ in range(400)]
    interval = [objective(config, merged.measure(config, 1)) for _ in range(400)]
    assert np.mean(interval) == pytest.approx(single.truth(1)[5], rel=0.01)
    assert np.std(interval) < 0.5 * np.std(raw)
    # Dropped requests add up across the merged windows.
    dropped = merged.measure(SPACE.at(0), 2)
    assert dropped.slo_violations == dropped.rejected == 100


def test_the_cost_objective_is_a_setting(table: ProfileTable) -> None:
    # Minimizing cores subject to the SLO: every configuration of the toy table meets the SLO
    # (except configuration 0 at the highest load) and uses the same measured CPU, so with the
    # cost objective the truths tie where the latency objective ranks them.
    cost = CostObjective(slo_ms=100.0, cores=1)
    testbed = Testbed(table, cost, seed=0)
    assert np.allclose(testbed.truth(0), 0.5)
    assert testbed.truth(2)[0] > testbed.truth(2)[1]
    problem = TuningProblem(SPACE, cost, cores=1, seed=0)
    trace = run_static(build_tuner("adaptive-rrl", problem), testbed, 2, 30, interval_s=5.0)
    assert trace.gaps()[-1] == 0.0


def test_recorded_latencies_are_pooled_not_averaged(tmp_path: Path) -> None:
    # A profile that recorded each window's latencies: a merged measurement's p95 is the p95 of
    # all the drawn windows' requests, and the truth is the objective of all windows pooled.
    doc = _doc()
    rng = np.random.default_rng(0)
    for cell in doc["cells"]:
        cell["samples"] = [
            np.sort(rng.exponential(10.0, size=int(w[WINDOW_FIELDS.index("completed")]))).tolist()
            for w in cell["windows"]
        ]
    path = tmp_path / "sampled.json"
    path.write_text(json.dumps(doc))
    table = ProfileTable.load(path)
    assert table.samples is not None
    objective = LatencyObjective(slo_ms=100.0)
    flat, load = 4, 1
    lat = table.samples[load, flat]
    merged = table.merged(load, flat, [0, 2, 2])
    pooled = np.concatenate([lat[0], lat[2], lat[2]])
    assert merged.p95_ms == pytest.approx(np.percentile(pooled, 95))
    assert merged.p50_ms == pytest.approx(np.percentile(pooled, 50))
    assert merged.mean_ms == pytest.approx(pooled.mean())
    assert merged.offered == 150
    every = np.concatenate(lat)
    testbed = Testbed(table, objective, seed=0, interval_s=1.5)
    assert testbed.truth(load)[flat] == pytest.approx(np.percentile(every, 95))
    # The pooled p95 is not the mean of the windows' p95s.
    per_window = np.mean([np.percentile(w, 95) for w in lat])
    assert testbed.truth(load)[flat] != pytest.approx(per_window)
    m = testbed.measure(SPACE.at(flat), load)
    assert m.offered == 150 and m.p95_ms > 0  # three 0.5 s windows per 1.5 s interval
    # Violations and refusals still add up from the windows' counts.
    dropped = table.merged(2, 0, [0, 1])
    assert dropped.slo_violations == dropped.rejected == 20


def test_a_long_window_keeps_evenly_spaced_quantiles_of_its_latencies() -> None:
    from rrl.offline.profiling import SAMPLES_PER_WINDOW, latency_record

    rng = np.random.default_rng(1)
    few = rng.exponential(1.0, size=100)
    assert latency_record(few) == [round(float(x), 3) for x in np.sort(few)]  # kept whole
    many = rng.exponential(1.0, size=8000)
    kept = latency_record(many)
    assert len(kept) == SAMPLES_PER_WINDOW and kept == sorted(kept)
    # The p95 of the record is the p95 of the requests to within a quantile step (1/256).
    lo, hi = np.percentile(many, [95 - 100 / 256, 95 + 100 / 256])
    assert lo <= np.percentile(kept, 95) <= hi
    # Two windows of one cell pooled: the p95 of the records is that of all the requests.
    other = rng.exponential(1.2, size=7900)
    pooled = np.percentile(kept + latency_record(other), 95)
    assert pooled == pytest.approx(np.percentile(np.concatenate([many, other]), 95), rel=0.02)
