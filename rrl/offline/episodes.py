"""One tuner on the testbed: a static workload, or a workload that shifts between loads.

An episode drives the tuner through its ask/tell interface exactly as an online loop would: set
the workload state, ``propose``, measure one decision interval on the testbed, ``observe``. In a
shifting episode the state comes from a ``WorkloadMonitor`` fed with Poisson arrival counts of
the true load, one tick per second, so the tuner learns of a shift only once it is detected.
Every step records what was measured and what the tuner recommends, as truths (mean objective
over the profile's windows) and as the oracle of the load in force.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rrl.offline.testbed import Testbed
from rrl.tuners.ask_tell import Tuner
from rrl.tuners.workload import MonitorSettings, WorkloadMonitor

WITHIN = 0.05  # "within 5% of the oracle's objective"


@dataclass
class Trace:
    """Per step: the load in force, the truth of the measured and of the recommended
    configuration, the oracle's value, and the measured window's p95 and violation count."""

    load: list[int] = field(default_factory=list)
    measured: list[float] = field(default_factory=list)
    recommended: list[float] = field(default_factory=list)
    oracle: list[float] = field(default_factory=list)
    tied: list[bool] = field(default_factory=list)
    """Whether the recommendation is indistinguishable from the oracle within the profile's
    own measurement error (``Testbed.indistinguishable``)."""
    p95_ms: list[float] = field(default_factory=list)
    violations: list[float] = field(default_factory=list)
    phase_of_tuner: list[str] = field(default_factory=list)

    def gaps(self) -> np.ndarray:
        return np.asarray(self.recommended) / np.asarray(self.oracle) - 1.0

    def gaps_or_tied(self) -> np.ndarray:
        """The gaps, with 0 where the recommendation is statistically tied with the oracle."""
        return np.where(np.asarray(self.tied), 0.0, self.gaps())


def run_static(
    tuner: Tuner, testbed: Testbed, load: int, budget: int, *, interval_s: float
) -> Trace:
    tuner.set_workload(testbed.table.workload_state(load))
    trace = Trace()
    for _ in range(budget):
        _step(tuner, testbed, load, trace, interval_s)
    return trace


def run_shifting(
    tuner: Tuner,
    testbed: Testbed,
    phases: list[int],
    phase_length: int,
    *,
    interval_s: float,
    seed: int,
) -> Trace:
    """``phases`` are load indices, each in force for ``phase_length`` decision intervals."""
    monitor = WorkloadMonitor(MonitorSettings(base_rate_per_s=testbed.table.base_rate_per_s))
    arrivals = np.random.default_rng(seed + 7919)
    trace = Trace()
    now = 0.0
    ticks = max(1, round(interval_s))
    for load in phases:
        rate = testbed.table.loads[load].rate_per_s
        for _ in range(phase_length):
            if monitor.state is not None:
                tuner.set_workload(monitor.state)
            _step(tuner, testbed, load, trace, interval_s)
            for _ in range(ticks):  # the interval's traffic, as the gateway's snapshots see it
                now += interval_s / ticks
                monitor.update(now, int(arrivals.poisson(rate * interval_s / ticks)))
    return trace


def _step(tuner: Tuner, testbed: Testbed, load: int, trace: Trace, interval_s: float) -> None:
    config = tuner.propose()
    measurement = testbed.measure(config, load)
    tuner.observe(config, measurement)
    truth = testbed.truth(load)
    space = testbed.space
    trace.load.append(load)
    trace.measured.append(float(truth[space.flat(config)]))
    recommended = space.flat(tuner.recommend())
    trace.recommended.append(float(truth[recommended]))
    trace.oracle.append(float(truth.min()))
    trace.tied.append(bool(testbed.indistinguishable(load)[recommended]))
    trace.p95_ms.append(measurement.p95_ms if measurement.completed else float("nan"))
    # Violations per decision interval at the offered rate (the window is shorter than that).
    trace.violations.append(
        measurement.violation_fraction * testbed.table.loads[load].rate_per_s * interval_s
    )
    # The algorithm's own phase (regions / refine / exploit), where it has one.
    trace.phase_of_tuner.append(str(getattr(getattr(tuner, "current", None), "phase", "")))


def measurements_to_within(gaps: np.ndarray, within: float = WITHIN) -> int | None:
    """Measurements after which the recommendation is within ``within`` of the oracle and stays
    there to the end of the run; None when it is not within at the end."""
    outside = np.flatnonzero(gaps > within + 1e-12)
    if outside.size == 0:
        return 1
    last = int(outside[-1])
    return None if last == len(gaps) - 1 else last + 2
