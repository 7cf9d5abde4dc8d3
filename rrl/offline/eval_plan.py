"""What an offline evaluation runs (models, tuners, seeds, budgets): shared by the evaluation
(``rrl/offline/evaluate.py``) and its report (``rrl/offline/report.py``) without either importing
the other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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
