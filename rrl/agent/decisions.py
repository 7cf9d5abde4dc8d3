"""The online agent's decisions: one record per interval, what ran, why, what the queueing model
predicted for it and what it measured. ``/admin/tuner/{model}`` and the decision log show them.

Kinds:

| kind | what ran |
|---|---|
| ``exploit`` | the incumbent; the gate tried no candidate (its reason says why) |
| ``explore`` | a candidate the gate let through, in a trial window |
| ``compare`` | the incumbent in a trial's interleaved window |
| ``revert`` | the incumbent again, after a candidate measured worse (or not better) |
| ``accept`` | the candidate that won its trial, now the incumbent |
| ``recall`` | the configuration remembered for a workload state that recurred |
| ``yield`` | fewer threads, for another model the core budget says wants them |
| ``hold`` | the incumbent while a candidate that rebuilds sessions waits for the pace |
| ``drain`` | whatever drains a backlog (not learned) |
| ``idle`` | nothing changes: too little traffic |
| ``workload`` | the workload state changed |
| ``wake`` | the incumbent; a resting agent saw the load move (``rrl.agent.resting``) |
| ``failed`` | the gateway could not build a configuration |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from models.knobs import Knobs
from rrl.agent.gate import Verdict
from rrl.agent.queueing import Prediction
from rrl.tuners.measurement import Measurement
from rrl.tuners.workload import WorkloadState


@dataclass(frozen=True, slots=True)
class Decision:
    """One interval: what ran, why, and what it gave (``objective`` None: not measured)."""

    at: float  # wall clock (time.time())
    model: str
    kind: str
    config: Knobs
    workload: WorkloadState | None
    reason: str = ""
    objective: float | None = None
    measurement: Measurement | None = None
    rebuilt: bool = False
    predicted: Prediction | None = None
    """What the queueing model expected of ``config`` before it ran."""
    gate: Verdict | None = None
    """The gate's verdict, when one was asked for this interval."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "kind": self.kind,
            "config": self.config.as_dict(),
            "workload": None if self.workload is None else str(self.workload),
            "reason": self.reason,
            "objective": self.objective,
            "rebuilt": self.rebuilt,
            "predicted": None if self.predicted is None else self.predicted.as_dict(),
            "measurement": _measured(self.measurement),
            "gate": None if self.gate is None else self.gate.as_dict(),
        }


def _measured(m: Measurement | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "duration_s": round(m.duration_s, 3),
        "offered": m.offered,
        "completed": m.completed,
        "rate_per_s": round(m.rate_per_s, 2),
        "p50_ms": round(m.p50_ms, 3),
        "p95_ms": round(m.p95_ms, 3),
        "p99_ms": round(m.p99_ms, 3),
        "slo_violations": m.slo_violations,
    }


@dataclass(frozen=True, slots=True)
class Step:
    """What ``ModelAgent.choose`` picked for the next interval."""

    config: Knobs
    kind: str
    reason: str = ""
    predicted: Prediction | None = None
    gate: Verdict | None = None


def log_line(d: Decision) -> str:
    """One decision on one log line: what ran, predicted, measured, and why."""
    predicted = "" if d.predicted is None else f" predicted p95={d.predicted.p95_ms:.1f}ms"
    objective = "" if d.objective is None else f" J={d.objective:.2f}"
    m = d.measurement
    seen = "" if m is None else f" p95={m.p95_ms:.1f}ms n={m.offered} viol={m.slo_violations}"
    why = f" ({d.reason})" if d.reason else ""
    return f"[{d.workload}] {d.kind}: {d.config}{predicted}{objective}{seen}{why}"
