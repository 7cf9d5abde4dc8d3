"""The ask/tell interface every tuner has, and what they share.

An online loop (or the offline testbed) drives a ``Tuner`` like this::

    tuner = build_tuner("rrl", problem)
    tuner.set_workload(monitor.update(now, arrivals))   # whenever the state may have changed
    config = tuner.propose()                            # run this for one decision interval
    ... apply config, wait, take a measurement ...
    tuner.observe(config, measurement)                  # what actually ran and what it gave
    best = tuner.recommend()                            # what to run when not exploring

``observe`` accepts any configuration, not only the last proposal: a safety layer may run
something else, and the tuner learns from whatever ran. Off-grid configurations are snapped to
the grid. Each tuner keeps one table per workload state (``PerWorkload``); the algorithms
themselves (``StateTuner``) see flat configuration indices and objective values only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from models.knobs import Knobs
from rrl.tuners.measurement import Measurement
from rrl.tuners.objective import Objective
from rrl.tuners.space import ConfigSpace, tf_serving_default
from rrl.tuners.workload import WorkloadState


class Tuner(Protocol):
    """The interface an online agent drives (see the module docstring)."""

    name: str

    def set_workload(self, state: WorkloadState) -> None: ...

    def propose(self) -> Knobs: ...

    def observe(self, config: Knobs, measurement: Measurement) -> None: ...

    def recommend(self) -> Knobs: ...

    def snapshot(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class TuningProblem:
    """What every tuner is built with: the grid, the objective, the machine, a seed."""

    space: ConfigSpace
    objective: Objective
    cores: int
    seed: int = 0
    default: Knobs = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", tf_serving_default(self.space, self.cores))


class StateTuner(Protocol):
    """One tuning algorithm inside one workload state, on flat configuration indices."""

    def propose(self) -> int: ...

    def observe(self, flat: int, value: float, measurement: Measurement) -> None: ...

    def recommend(self) -> int: ...

    def describe(self) -> dict[str, Any]: ...


StateTunerFactory = Callable[[TuningProblem, np.random.Generator], StateTuner]


class PerWorkload:
    """A ``Tuner`` made of one ``StateTuner`` per workload state. A state seen for the first
    time gets a fresh one, warm-started from the nearest known state when the algorithm supports
    it (``warm_start_from``) and ``warm_start`` is on; a state seen before resumes its own."""

    def __init__(
        self,
        name: str,
        problem: TuningProblem,
        factory: StateTunerFactory,
        *,
        warm_start: bool = True,
    ) -> None:
        self.name = name
        self.problem = problem
        self._factory = factory
        self._warm_start = warm_start
        self._rng = np.random.default_rng(problem.seed)
        self._tables: dict[WorkloadState, StateTuner] = {}
        self._priors: dict[WorkloadState, np.ndarray] = {}
        self.state = WorkloadState(0, 0)
        self.current: StateTuner = self._new_table(self.state)

    def set_workload(self, state: WorkloadState) -> None:
        if state == self.state:
            return
        self.state = state
        table = self._tables.get(state)
        self.current = table if table is not None else self._new_table(state)

    def propose(self) -> Knobs:
        return self.problem.space.at(self.current.propose())

    def observe(self, config: Knobs, measurement: Measurement) -> None:
        space = self.problem.space
        config = config if config in space else space.snap(config)
        value = self.problem.objective(config, measurement)
        self.current.observe(space.flat(config), value, measurement)

    def recommend(self) -> Knobs:
        return self.problem.space.at(self.current.recommend())

    def predict(self, config: Knobs) -> float | None:
        """What the current state's table expects ``config`` to score, when the algorithm
        keeps such estimates (None otherwise, or when it knows nothing of it yet)."""
        predicted = getattr(self.current, "predicted", None)
        if predicted is None:
            return None
        value = predicted(self.problem.space.flat(self._on_grid(config)))
        return None if math.isnan(value) else float(value)

    def exclude(self, config: Knobs) -> bool:
        """Ask the current state's table never to explore ``config``; False when the
        algorithm cannot (it may then propose it again)."""
        exclude = getattr(self.current, "exclude", None)
        if exclude is None:
            return False
        exclude(self.problem.space.flat(self._on_grid(config)))
        return True

    def estimates(self, limit: int | None = None) -> list[tuple[Knobs, float, int]]:
        """(configuration, expected objective, times measured) for every configuration the
        current table has a value for (the best ``limit`` of them), best first (empty when it
        keeps no estimates). Only the listed ones are built as ``Knobs``: the agent lists the
        best few after every decision, on the gateway's event loop, and building all of a
        640-configuration grid took ~2 ms there."""
        known, values, counts = self._known()
        order = known[np.argsort(values[known], kind="stable")][:limit]
        space = self.problem.space
        return [(space.at(int(i)), float(values[i]), int(counts[i])) for i in order]

    def estimate_counts(self) -> tuple[int, int]:
        """(measured, estimated): how many configurations the current table has measured, and
        has a value for at all; what ``estimates`` would list, without listing it."""
        known, _, counts = self._known()
        return int(np.count_nonzero(counts[known])), int(known.size)

    def _known(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        table = self.current
        estimates = getattr(table, "estimates", None)
        obs = getattr(table, "obs", None)
        if estimates is None or obs is None:
            empty = np.zeros(0, dtype=int)
            return empty, np.zeros(0), empty
        values = estimates()
        return np.flatnonzero(np.isfinite(values)), values, obs.n

    def _on_grid(self, config: Knobs) -> Knobs:
        space = self.problem.space
        return config if config in space else space.snap(config)

    def snapshot(self) -> dict[str, Any]:
        return {
            "tuner": self.name,
            "workload_state": {
                "rate_level": self.state.rate_level,
                "size_level": self.state.size_level,
            },
            "known_states": len(self._tables),
            "recommended": self.recommend().as_dict(),
            **self.current.describe(),
        }

    def set_priors(self, priors: dict[WorkloadState, np.ndarray]) -> int:
        """Prior estimates per workload state (e.g. ``rrl.offline.priors.profile_priors``: what an
        offline profile measured), one value per flat configuration, NaN where unknown. A state
        first seen after this starts from its own prior when there is one. Returns how many
        states the algorithm can use them for (0 when it keeps no estimates)."""
        if not hasattr(self.current, "warm_start_prior"):  # every table is of one algorithm
            return 0
        self._priors = {s: np.asarray(v, dtype=float) for s, v in priors.items()}
        return len(self._priors)

    def _new_table(self, state: WorkloadState) -> StateTuner:
        table = self._factory(self.problem, self._rng)
        prior = self._priors.get(state)
        if prior is not None and hasattr(table, "warm_start_prior"):
            # Measured offline for this very state: a better start than a neighbour's table.
            table.warm_start_prior(prior)
        else:
            known = [s for s in self._tables if s != state]
            if self._warm_start and known and hasattr(table, "warm_start_from"):
                nearest = min(known, key=lambda s: (s.distance(state), s))
                table.warm_start_from(self._tables[nearest])
        self._tables[state] = table
        return table


class Observations:
    """Per-configuration running statistics: count, mean, sum of squared deviations (Welford)."""

    def __init__(self, size: int) -> None:
        self.n = np.zeros(size, dtype=np.int64)
        self.mean = np.full(size, np.nan)
        self._m2 = np.zeros(size)
        self.history: list[tuple[int, float]] = []

    def add(self, flat: int, value: float) -> None:
        self.history.append((flat, value))
        n = self.n[flat] + 1
        old = 0.0 if n == 1 else self.mean[flat]
        delta = value - old
        new = old + delta / n
        self._m2[flat] += delta * (value - new)
        self.n[flat] = n
        self.mean[flat] = new

    @property
    def measured(self) -> np.ndarray:
        return np.flatnonzero(self.n > 0)

    @property
    def count(self) -> int:
        return len(self.history)

    def best(self) -> int | None:
        measured = self.measured
        if measured.size == 0:
            return None
        return int(measured[np.argmin(self.mean[measured])])

    def relative_noise(self, default: float) -> float:
        """Pooled coefficient of variation of one measurement, from configurations measured
        more than once (``default`` until there are some)."""
        repeated = np.flatnonzero(self.n > 1)
        if repeated.size == 0:
            return default
        variances = self._m2[repeated] / (self.n[repeated] - 1)
        dof = (self.n[repeated] - 1).sum()
        means = np.maximum(np.abs(self.mean[repeated]), 1e-12)
        pooled = float(((variances / means**2) * (self.n[repeated] - 1)).sum() / dof)
        # Few replicates underestimate the noise; never go below a tenth of the default.
        return max(math.sqrt(pooled), default / 10)

    def lower_confidence(self, kappa: float, default_noise: float) -> np.ndarray:
        """mean - kappa * standard error for measured configurations (NaN elsewhere)."""
        cv = self.relative_noise(default_noise)
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.mean - kappa * cv * np.abs(self.mean) / np.sqrt(self.n)


def exploit(obs: Observations, kappa: float, default_noise: float) -> int:
    """The exploitation step every searching tuner ends in: run the measured configuration with
    the lowest lower confidence bound, which re-measures close contenders until the noise no
    longer hides which one is best, then keeps running (and re-measuring) the best."""
    lcb = obs.lower_confidence(kappa, default_noise)
    measured = obs.measured
    return int(measured[np.nanargmin(lcb[measured])])
