"""Where the CPU goes while a load runs through a gateway: its event loop (the process's main
thread, which runs every request's decoding, the batcher and every reply), the rest of the
gateway (runtime threads), and the other processes of the bench on the same cores (the load
generators, the broker). Read from /proc and ``getrusage`` around the load, and the gateway's
own batch counters from ``/metrics``, so the replay can charge the loop per request and per
batch (``servicetimes.calibrate``) instead of inferring it from capacities alone."""

from __future__ import annotations

import os
import resource
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import process_cpu_seconds


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds spent while a load ran, and what the gateway did meanwhile."""

    requests: int
    """Requests sent: each cost the loop its decoding, and its reply when it had one."""
    batches: int
    rows: int
    loop_s: float
    gateway_s: float
    others_s: float
    """The load generators (waited-for children of this process) and the broker."""

    def per_request(self, seconds: float) -> float:
        return seconds / max(self.requests, 1)

    def as_dict(self) -> dict[str, float | int]:
        return {
            "requests": self.requests,
            "batches": self.batches,
            "rows": self.rows,
            "loop_ms_per_request": round(self.per_request(self.loop_s) * 1e3, 4),
            "gateway_ms_per_request": round(self.per_request(self.gateway_s) * 1e3, 4),
            "others_ms_per_request": round(self.per_request(self.others_s) * 1e3, 4),
        }


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread, from /proc (0 when it cannot be read)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU seconds of every child process this process has waited for."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def batch_counters(base: str, model: str) -> tuple[int, int]:
    """(batches, rows) the gateway has run for ``model``, from its ``iotgw_batch_rows``
    histogram."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    batches = rows = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "iotgw_batch_rows":
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name.endswith("_count"):
                batches += sample.value
            elif sample.name.endswith("_sum"):
                rows += sample.value
    return int(batches), int(rows)


@dataclass
class Meter:
    """Snapshots before and after a load; ``stop`` returns what it cost."""

    base: str
    model: str
    gateway_pid: int
    broker_pid: int | None = None

    def start(self) -> None:
        self._before = self._snapshot()

    def stop(self, requests: int) -> CpuUse:
        after = self._snapshot()
        d = [b - a for a, b in zip(self._before, after, strict=True)]
        return CpuUse(requests, int(d[0]), int(d[1]), d[2], d[3], d[4])

    def _snapshot(self) -> tuple[float, ...]:
        batches, rows = batch_counters(self.base, self.model)
        broker = (process_cpu_seconds(self.broker_pid) or 0.0) if self.broker_pid else 0.0
        return (
            batches,
            rows,
            thread_cpu_seconds(self.gateway_pid, self.gateway_pid),
            process_cpu_seconds(self.gateway_pid) or 0.0,
            children_cpu_seconds() + broker,
        )
