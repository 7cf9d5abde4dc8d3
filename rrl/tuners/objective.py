"""Objectives: what a tuner minimizes. The objective is a setting (``make_objective``).

- ``latency``: J = p95 + w * SLO * v, with p95 in ms over answered requests and v the fraction
  of offered requests that violated the SLO (late, refused or dropped). A configuration that
  cannot keep up is pushed above every one that can: its answered p95 is near the SLO (the rest
  is dropped at the deadline) and its v is large.
- ``cost``: J = cores + w * (max(0, p95 / SLO - 1) + v): the CPU the serving process used (cores
  busy on average; the threads the configuration holds when no CPU figure was measured), plus a
  penalty that is zero exactly when the SLO is met, so that among configurations meeting the SLO
  the cheapest wins.

Both are positive, so a gap to the oracle is a fraction of the oracle's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from models.knobs import Knobs
from rrl.tuners.measurement import Measurement


class Objective(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def slo_ms(self) -> float: ...

    def __call__(self, config: Knobs, measurement: Measurement) -> float: ...


@dataclass(frozen=True, slots=True)
class LatencyObjective:
    slo_ms: float
    violation_weight: float = 2.0
    name: str = "latency"

    def __call__(self, config: Knobs, measurement: Measurement) -> float:
        if measurement.offered == 0:
            return 0.0  # no traffic: every configuration is equally good
        # Nothing answered: as bad as the SLO itself, plus the penalty.
        p95 = measurement.p95_ms if measurement.completed else self.slo_ms
        return p95 + self.violation_weight * self.slo_ms * measurement.violation_fraction


@dataclass(frozen=True, slots=True)
class CostObjective:
    slo_ms: float
    cores: int
    penalty_weight: float = 4.0
    name: str = "cost"

    def __call__(self, config: Knobs, measurement: Measurement) -> float:
        if measurement.cpu_cores is not None:
            used = measurement.cpu_cores
        else:
            used = float(min(self.cores, config.concurrency * config.intra_op_threads))
        excess = max(0.0, measurement.p95_ms / self.slo_ms - 1.0) if measurement.completed else 1.0
        return max(used, 1e-3) + self.penalty_weight * (excess + measurement.violation_fraction)


OBJECTIVES = ("latency", "cost")


def at_slo(objective: Objective, config: Knobs, violating: float) -> float:
    """The objective of "p95 at the SLO with a fraction ``violating`` of the requests late": the
    value beyond which ``config`` counts as violating."""
    slo = objective.slo_ms
    probe = Measurement(1.0, 1000, 1000, slo, slo, slo, round(1000 * violating), 0)
    return objective(config, probe)


def make_objective(name: str, *, slo_ms: float, cores: int) -> LatencyObjective | CostObjective:
    if name == "latency":
        return LatencyObjective(slo_ms=slo_ms)
    if name == "cost":
        return CostObjective(slo_ms=slo_ms, cores=cores)
    raise ValueError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVES)}")
