"""Per-state memory: the best configuration learned for each workload state, applied at once
when the state recurs.

A state is the monitor's rate level and size level (``rrl.tuners.workload``) plus the burstiness of
the arrivals: ``bursty`` when the counts per tick spread more than four times as much as Poisson
counts would (index of dispersion > 4). The configuration remembered for a state is its incumbent
whenever one was measured there: what the start, an accepted trial, or a recall left running,
with its last measured objective. A candidate that lost a trial in a state is remembered too,
so it is not tried there again. And every configuration's last windows in a state (``note``),
so that an incumbent that turned out to violate the SLO can go back to one measured within it
(``within``), whatever trial it lost to noise on the way.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from models.knobs import Knobs
from rrl.tuners.workload import WorkloadState

BURSTY_DISPERSION = 4.0
WINDOWS_NOTED = 6
"""Windows kept per configuration and state: the median of the last few, not one lucky one."""


@dataclass(frozen=True, slots=True, order=True)
class StateKey:
    rate_level: int
    size_level: int
    bursty: bool

    @classmethod
    def of(cls, state: WorkloadState, dispersion: float) -> StateKey:
        return cls(state.rate_level, state.size_level, dispersion > BURSTY_DISPERSION)

    def __str__(self) -> str:
        return f"r{self.rate_level}/s{self.size_level}/{'bursty' if self.bursty else 'smooth'}"


@dataclass(slots=True)
class Remembered:
    config: Knobs
    objective: float
    windows: int = 1


@dataclass
class StateMemory:
    best: dict[StateKey, Remembered] = field(default_factory=dict)
    rejected: dict[StateKey, set[Knobs]] = field(default_factory=dict)
    measured: dict[StateKey, dict[Knobs, deque[float]]] = field(default_factory=dict)

    def remember(self, key: StateKey, config: Knobs, objective: float) -> None:
        known = self.best.get(key)
        if known is not None and known.config == config:
            known.objective = objective
            known.windows += 1
        else:
            self.best[key] = Remembered(config, objective)

    def recall(self, key: StateKey) -> Remembered | None:
        """The configuration remembered for ``key``, else for the same rate and size with the
        other burstiness (burstiness is judged from few ticks right after a change)."""
        other = StateKey(key.rate_level, key.size_level, not key.bursty)
        return self.best.get(key) or self.best.get(other)

    def reject(self, key: StateKey, config: Knobs) -> None:
        self.rejected.setdefault(key, set()).add(config)

    def was_rejected(self, key: StateKey, config: Knobs) -> bool:
        return config in self.rejected.get(key, set())

    def forgive(self, key: StateKey, config: Knobs) -> None:
        self.rejected.get(key, set()).discard(config)

    def forget_measured(self, key: StateKey) -> None:
        """Drop the windows and the lost trials of ``key``'s state (another closed loop now runs
        at its rate level), keeping its best configuration as a start."""
        self.rejected.pop(key, None)
        self.measured.pop(key, None)

    def note(self, key: StateKey, config: Knobs, objective: float) -> None:
        """One measured window of ``config`` in ``key``'s state (a trial's or the incumbent's)."""
        windows = self.measured.setdefault(key, {})
        windows.setdefault(config, deque(maxlen=WINDOWS_NOTED)).append(objective)

    def within(
        self, key: StateKey, limit: float, besides: Knobs, least: int = 2
    ) -> tuple[Knobs, float] | None:
        """The configuration other than ``besides`` with the lowest median objective over its
        last windows in ``key``'s state, among those measured ``least`` times or more with that
        median within ``limit``, and the median; None when there is none."""
        medians = [
            (statistics.median(values), config)
            for config, values in self.measured.get(key, {}).items()
            if config != besides and len(values) >= least
        ]
        best = min((m for m in medians if m[0] <= limit), default=None)
        return None if best is None else (best[1], best[0])

    def as_dict(self) -> dict[str, object]:
        return {
            str(k): {
                "config": v.config.as_dict(),
                "objective": round(v.objective, 3),
                "windows": v.windows,
                "rejected": len(self.rejected.get(k, ())),
            }
            for k, v in sorted(self.best.items())
        }
