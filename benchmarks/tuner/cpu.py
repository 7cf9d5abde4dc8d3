"""Where the CPU goes while a load runs through a gateway: its event loop (the process's main
thread, which runs every request's decoding, the batcher and every reply), the rest of the
gateway (runtime threads), and the other processes of the bench on the same cores (the load
generators, the broker). Read from /proc and ``getrusage`` around the load, and the gateway's
own batch counters from ``/metrics``, so the replay can charge the loop per request and per
batch (``servicetimes.calibrate``) instead of inferring it from capacities alone."""

from __future__ import annotations

import os
import resource
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import machine_cpu_seconds, process_cpu_seconds

CONTENDED = 0.1
"""A capacity ramp that lost more than this share of the machine to the hypervisor says so."""


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
    steal_share: float = 0.0
    """The share of the machine's CPU the hypervisor took meanwhile: a capacity read under
    steal is a contended machine's capacity."""

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
            "steal_share": round(self.steal_share, 4),
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
        self._started = time.monotonic()
        self._before = self._snapshot()

    def stop(self, requests: int) -> CpuUse:
        after = self._snapshot()
        wall = max(time.monotonic() - self._started, 1e-9)
        d = [b - a for a, b in zip(self._before, after, strict=True)]
        return CpuUse(requests, int(d[0]), int(d[1]), d[2], d[3], d[4], steal_share(d[5], wall))

    def _snapshot(self) -> tuple[float, ...]:
        batches, rows = batch_counters(self.base, self.model)
        broker = (process_cpu_seconds(self.broker_pid) or 0.0) if self.broker_pid else 0.0
        return (
            batches,
            rows,
            thread_cpu_seconds(self.gateway_pid, self.gateway_pid),
            process_cpu_seconds(self.gateway_pid) or 0.0,
            children_cpu_seconds() + broker,
            steal_seconds(),
        )


def child_pids(pid: int) -> list[int]:
    """The live child processes of ``pid`` (the agent's model process, when it runs one)."""
    out: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in children.read_text().split()]
        except OSError:  # a thread that ended meanwhile
            continue
    return sorted(set(out))


def steal_share(steal_s: float, wall_s: float) -> float:
    """The share of all the machine's cores the hypervisor took over ``wall_s`` seconds."""
    return steal_s / (wall_s * (os.cpu_count() or 1))


def steal_seconds() -> float:
    """CPU seconds the hypervisor took from this machine (all cores)."""
    seconds = machine_cpu_seconds()
    return 0.0 if seconds is None else seconds["steal"]


@dataclass
class ArmMeter:
    """What one arm cost, around its trace: the gateway's event loop and whole process, its
    child processes (the agent's model process), and the CPU the hypervisor took from the
    machine meanwhile, so that arms measured under different steal can be told apart."""

    gateway_pid: int

    def start(self) -> None:
        self._started = time.monotonic()
        self._before = self._snapshot()

    def stop(self) -> dict[str, float]:
        after = self._snapshot()
        wall = max(time.monotonic() - self._started, 1e-9)
        children = sum(s - self._before[2].get(pid, 0.0) for pid, s in after[2].items())
        return {
            "wall_s": round(wall, 2),
            "loop_s": round(after[0] - self._before[0], 2),
            "gateway_s": round(after[1] - self._before[1], 2),
            "model_process_s": round(children, 2),
            "steal_share": round(steal_share(after[3] - self._before[3], wall), 4),
        }

    def _snapshot(self) -> tuple[float, float, dict[int, float], float]:
        pid = self.gateway_pid
        children = {c: process_cpu_seconds(c) or 0.0 for c in child_pids(pid)}
        return (
            thread_cpu_seconds(pid, pid),
            process_cpu_seconds(pid) or 0.0,
            children,
            steal_seconds(),
        )
