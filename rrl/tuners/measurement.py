"""What one decision interval under one configuration showed, and how a gateway snapshot maps
onto it."""

from __future__ import annotations

from dataclasses import dataclass

from models.window_stats import WindowStats


@dataclass(frozen=True, slots=True)
class Measurement:
    """Latencies are over answered requests; ``slo_violations`` counts late answers *and*
    requests refused or dropped (they got no answer in time either)."""

    duration_s: float
    offered: int
    completed: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    slo_violations: int
    rejected: int
    mean_ms: float | None = None
    cpu_cores: float | None = None
    rows_per_request: float = 1.0
    arrived: int | None = None
    """Requests that arrived in the window (refused ones too), when the source counts them."""

    @property
    def rate_per_s(self) -> float:
        return self.offered / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def arrival_rate_per_s(self) -> float:
        """The load the window was under: requests that arrived per second. ``rate_per_s``
        counts what was answered or refused, which in an open loop dips while a backlog builds
        and peaks while it drains: two windows compared at it are compared at the backlog
        their configurations left, not at the load they served."""
        if self.arrived is None:
            return self.rate_per_s
        return self.arrived / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def violation_fraction(self) -> float:
        return self.slo_violations / self.offered if self.offered else 0.0

    @property
    def throughput_per_s(self) -> float:
        return self.completed / self.duration_s if self.duration_s > 0 else 0.0

    @classmethod
    def from_window_stats(
        cls, stats: WindowStats, *, cpu_cores: float | None = None
    ) -> Measurement:
        """A gateway ``stats(model, window_s=...)`` snapshot as a measurement. The gateway
        counts late answers in ``slo_violations`` and refusals in ``rejected``; here both are
        violations. ``cpu_cores`` (CPU seconds per second of the serving process) is measured by
        the caller when the cost objective needs it."""
        return cls(
            duration_s=stats.window_s,
            offered=stats.completed + stats.rejected,
            completed=stats.completed,
            p50_ms=stats.p50_ms,
            p95_ms=stats.p95_ms,
            p99_ms=stats.p99_ms,
            slo_violations=stats.slo_violations + stats.rejected,
            rejected=stats.rejected,
            cpu_cores=cpu_cores,
            rows_per_request=stats.rows_per_request or 1.0,
            arrived=stats.arrived,
        )
