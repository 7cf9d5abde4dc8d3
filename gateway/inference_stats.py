"""One model version's cumulative statistics since it was loaded, as Triton reports them
(``ModelStatistics`` over gRPC, which tritonclient's ``get_inference_statistics`` and Triton's
performance tools read): counts and total nanoseconds per request, batches run and rows
inferred. Plain integers kept beside the Prometheus metrics, so a reply is one consistent set
read without parsing the exposition; each request and batch adds a few of them.

``ModelRegistry.statistics`` picks the versions a request names; ``report`` is the reply both
transports send: over HTTP as Triton's JSON (``GET /v2/models[/{m}[/versions/{v}]]/stats``), over
gRPC parsed into its message."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

_NS = 1_000_000_000


@dataclass(slots=True)
class Duration:
    """How many, and their total nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, seconds: float, times: int = 1) -> None:
        self.count += times
        self.ns += round(seconds * _NS) * times


@dataclass(slots=True)
class InferenceStatistics:
    success: Duration = field(default_factory=Duration)
    """Requests answered, and their time in the gateway (read to reply)."""
    fail: Duration = field(default_factory=Duration)
    """Requests that got an error (refusals included), and their time in the gateway."""
    queue: Duration = field(default_factory=Duration)
    """Requests that reached a batch, and their time in the queue before it."""
    compute_infer: Duration = field(default_factory=Duration)
    """Requests that reached a batch, and their batch's run time: a batch of n requests adds n
    to the count and n times its time, as Triton counts it."""
    inference_count: int = 0
    """Rows inferred (a batch of n rows adds n)."""
    execution_count: int = 0
    """Batches run."""
    last_inference_ms: int = 0
    """When the last batch ended, in milliseconds since the epoch (0: none yet)."""

    def request(self, ok: bool, seconds: float) -> None:
        (self.success if ok else self.fail).add(seconds)

    def batch(self, rows: int, queue_s: Sequence[float], compute_s: float) -> None:
        self.execution_count += 1
        self.inference_count += rows
        for waited in queue_s:
            self.queue.add(waited)
        self.compute_infer.add(compute_s, times=len(queue_s))
        self.last_inference_ms = int(time.time() * 1000)

    def as_doc(self, name: str, version: int) -> dict[str, Any]:
        """One entry of Triton's ``model_stats``, with its field names."""
        durations = ("success", "fail", "queue", "compute_infer")
        return {
            "name": name,
            "version": str(version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                d: {"count": getattr(self, d).count, "ns": getattr(self, d).ns} for d in durations
            },
        }


def report(versions: Sequence[tuple[str, int, InferenceStatistics]]) -> dict[str, Any]:
    """Triton's statistics reply, ``{"model_stats": [...]}``, for (name, version, statistics)."""
    return {"model_stats": [s.as_doc(name, version) for name, version, s in versions]}
