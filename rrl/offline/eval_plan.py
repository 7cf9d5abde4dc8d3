"""What an offline evaluation runs (``iotgw tune --evaluate``): the models, tuners, seeds and
budgets of a plan, and the full and quick plans. The evaluation with its figures
(``rrl/offline/evaluate.py``) and its report (``report.py``) both read a plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rrl.tuners.registry import TUNERS

if TYPE_CHECKING:
    from rrl.offline.testbed import ProfileTable


@dataclass(frozen=True)
class EvalPlan:
    models: tuple[str, ...]
    tuners: tuple[str, ...]
    seeds: int
    budget: int
    phase_length: int
    radii: tuple[float, ...]
    tradeoff_seeds: int
    interval_s: float = 5.0
    objective: str = "latency"
    static_loads: tuple[int, ...] | None = None
    """Load indices of the static workloads, negative from the highest (None: every load)."""

    def loads_of(self, table: ProfileTable) -> list[int]:
        every = range(len(table.loads))
        return list(every) if self.static_loads is None else [every[i] for i in self.static_loads]


FULL_PLAN = EvalPlan(
    models=("vision_cnn", "sensor_mlp"),
    tuners=TUNERS,
    seeds=20,
    budget=480,  # 1.5x the 320-configuration dense grids: room for radius 0 to see them all
    phase_length=150,
    radii=(0.0, 1.0, 1.5, 2.0, 2.5, 3.0),
    tradeoff_seeds=20,
)
QUICK_PLAN = EvalPlan(
    models=("vision_cnn",),
    tuners=TUNERS,
    seeds=2,
    budget=30,
    phase_length=12,
    radii=(1.0, 2.0),
    tradeoff_seeds=2,
    static_loads=(-2,),
)
