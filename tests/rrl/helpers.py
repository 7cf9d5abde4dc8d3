"""Shared pieces of the rrl tests: a problem on the full 2-core grid and a driver loop."""

from __future__ import annotations

import numpy as np

from models.knobs import Knobs
from rrl.tuners.ask_tell import Tuner, TuningProblem
from rrl.tuners.objective import LatencyObjective
from rrl.tuners.space import ConfigSpace
from tests.rrl.synthetic import Landscape

SPACE = ConfigSpace.for_machine(2)


def problem(seed: int = 0, space: ConfigSpace = SPACE) -> TuningProblem:
    # The synthetic landscapes report p95 = value and no violations: J is the landscape itself.
    return TuningProblem(space, LatencyObjective(slo_ms=1e6), cores=2, seed=seed)


def drive(tuner: Tuner, land: Landscape, steps: int) -> tuple[list[Knobs], list[Knobs]]:
    """Run ``steps`` ask/tell rounds; returns (proposed, recommended) per step."""
    proposed, recommended = [], []
    for _ in range(steps):
        config = tuner.propose()
        tuner.observe(config, land.measure(config))
        proposed.append(config)
        recommended.append(tuner.recommend())
    return proposed, recommended


def coord(config: Knobs, space: ConfigSpace = SPACE) -> np.ndarray:
    return space.coord(config)
