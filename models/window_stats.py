"""What one served model version's requests experienced over a recent window: the snapshot the
gateway's admin API and dashboard show and the tuner measures its configurations by."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Requests answered, refused and arrived over the last ``window_s`` seconds. Latencies are
    inside the gateway (admission to reply), over the answered requests."""

    window_s: float
    completed: int
    rate_per_s: float
    rows_per_request: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    slo_violations: int
    rejected: int
    queue_depth: int
    arrived: int = 0
    """Requests that reached the model in the window, answered yet or not: the offered load.
    Completions lag it whenever a queue builds (a step up in rate), so a rate judged from them
    reads a burst as a fraction of itself."""
    arrived_rows: int = 0
    in_system: int = 0
    """Requests inside the model now (queued or running)."""
    in_system_peak: int = 0
    """The most requests inside the model at once during the window (and now): a closed loop
    of N clients reaches N in every window and never more, however its requests cycle, while
    an open loop's peak moves with its bursts (``rrl.agent.evidence.LoadKind``). A reading at
    one instant says less: a batch that holds every client empties the model at once, so it
    reads anywhere from 1 to N."""
