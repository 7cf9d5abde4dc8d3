"""One point of the peers benchmark (a model, rows per request, a number of clients): every arm
driven by the same closed-loop load generator (``benchmarks.loadgen``, its raw HTTP/1.1 client
in this process), the arms interleaved round by round, and the gateway's ratios to each peer
(MLServer, Triton) taken within each round, with the noise floor of each figure."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from benchmarks.common import Repeated, ServerProcess, percentiles
from benchmarks.http.workload import Model
from benchmarks.judging import pair_floor
from benchmarks.loadgen import LoadJob, run_load
from benchmarks.peers.plan import PEERS, Plan, windows
from benchmarks.peers.workload import Request, binary_request, json_request

_Arm = TypeVar("_Arm")
_Result = TypeVar("_Result")


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    base: str
    server: ServerProcess
    binary: bool  # the binary tensor extension instead of JSON

    def request(self, model: Model, rows: int) -> Request:
        return binary_request(model, rows) if self.binary else json_request(model, rows)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process under it (MLServer serves from
    an HTTP process and an inference worker; the gateway may start helpers too), from /proc."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += cpu.get(p, 0.0)
        todo.extend(children.get(p, []))
    return total


def with_server_cores(pid: int, run: Callable[[], _Result]) -> tuple[_Result, float]:
    """``run()``'s result and the cores the server ``pid`` (its process tree) used meanwhile."""
    cpu0, t0 = tree_cpu_seconds(pid), time.perf_counter()
    result = run()
    return result, (tree_cpu_seconds(pid) - cpu0) / (time.perf_counter() - t0)


def one_run(
    plan: Plan, arm: Arm, model: Model, request: Request, concurrency: int, cycle_s: float | None
) -> dict:
    """One closed-loop run: a warm-up, then the timed window, on the same connections. The
    server's CPU (its whole process tree) is read around both: the load is the same
    throughout, so its rate over both is its rate over the window."""
    warmup_s, run_s = windows(plan, cycle_s)
    job = LoadJob(
        url=model.url(arm.base),
        body=request.body,
        header_length=request.header_length,
        rows_per_request=request.rows,
        concurrency=concurrency,
        duration_s=run_s,
        max_requests=plan.max_requests_per_run,
        warmup_s=warmup_s,
        timeout_s=plan.client_timeout_s,
        client="raw",
    )
    cpu0, t0 = tree_cpu_seconds(arm.server.pid), time.perf_counter()
    res = asyncio.run(run_load(job))
    server_cores = (tree_cpu_seconds(arm.server.pid) - cpu0) / (time.perf_counter() - t0)
    lat = percentiles(np.asarray(res["latencies_s"]) * 1000.0) if res["answered"] else {}
    req_per_s = res["answered"] / res["elapsed_s"]
    return {
        "requests_per_s": req_per_s,
        "rows_per_s": res["rows_per_s"],
        **{f"{k}_ms": lat.get(k) for k in ("p50", "p95", "p99")},
        "issued": res["issued"],
        "answered": res["answered"],
        "answered_after_window": res["answered_after_window"],
        "lost": res["lost"],
        "errors": res["errors"],
        "warmup_s": warmup_s,
        "run_s": run_s,
        "server_cpu_cores": server_cores,
        "server_cpu_ms_per_request": 1000.0 * server_cores / req_per_s if req_per_s else None,
        "client_cpu_s": res["client_cpu_s"],
        "machine_busy_cores": res["machine_busy_cores"],
    }


def rotated(arms: Sequence[_Arm], round_no: int) -> list[_Arm]:
    """Round ``r`` starts with arm ``r mod n``: each arm takes each place in turn, so that a
    drift of the machine over a point does not favour one arm."""
    k = round_no % len(arms)
    return [*arms[k:], *arms[:k]]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


_NamedArm = TypeVar("_NamedArm", bound=_Named)

CLOSED_KEYS = ("requests_per_s", "p50_ms", "p99_ms")
"""What a closed-loop point through a C client (wrk, h2load) summarises per arm."""


def interleaved_point(
    plan: Plan,
    arms: Sequence[_NamedArm],
    point: dict[str, Any],
    figure: str,
    run_one: Callable[[_NamedArm], dict[str, Any]],
    record: Callable[[dict[str, Any]], None],
    peers: Sequence[str] = PEERS,
) -> dict[str, Any]:
    """Every arm ``plan.repeats`` times (``run_one``), interleaved (``rotated``); each run
    handed to ``record`` as ``<figure>_run``. Returns the point (``<figure>_point``): per arm
    the medians and floors of ``CLOSED_KEYS``, its failed (and lost) calls and its server's
    CPU per request, and the ratios to each of ``peers``."""
    by_arm: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    for round_no in range(plan.repeats):
        for arm in rotated(arms, round_no):
            run = run_one(arm)
            by_arm[arm.name].append(run)
            record({"figure": f"{figure}_run", **point, "arm": arm.name, "round": round_no, **run})
    arms_out = {
        name: {
            **{k: median_of(runs, k) for k in CLOSED_KEYS},
            "floors": {k: repeat_floor(runs, k) for k in CLOSED_KEYS},
            **{k: sum(r[k] for r in runs) for k in ("failed", "lost") if k in runs[0]},
            "server_cpu_ms_per_request": median_of(runs, "server_cpu_ms_per_request"),
        }
        for name, runs in by_arm.items()
    }
    return {
        "figure": f"{figure}_point",
        **point,
        "arms": arms_out,
        **peer_ratios(by_arm, "requests_per_s", peers),
    }


def measure_point(
    plan: Plan,
    arms: Sequence[Arm],
    model: Model,
    rows: int,
    concurrency: int,
    cycle_s: float | None,
    record: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Every arm ``plan.repeats`` times, interleaved; each run is handed to ``record``.
    ``cycle_s``: about how long a client waits for a reply (``plan.windows``). Returns the
    point: per arm the figures over rounds, and the gateway arms' ratios to each peer."""
    point = {"model": model.name, "rows_per_request": rows, "concurrency": concurrency}
    requests = {arm.name: arm.request(model, rows) for arm in arms}
    by_arm: dict[str, list[dict[str, Any]]] = {arm.name: [] for arm in arms}
    for round_no in range(plan.repeats):
        for arm in rotated(arms, round_no):
            run = one_run(plan, arm, model, requests[arm.name], concurrency, cycle_s)
            by_arm[arm.name].append(run)
            record({"figure": "peer_run", **point, "arm": arm.name, "round": round_no, **run})
    return {
        "figure": "peer_point",
        **point,
        "arms": {name: _arm_figures(runs) for name, runs in by_arm.items()},
        **peer_ratios(by_arm, "rows_per_s"),
    }


def _repeated(runs: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    values = [r[key] for r in runs if r[key] is not None]
    return Repeated.of(values).as_dict() if values else None


def _arm_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    errors: Counter[str] = Counter()
    for r in runs:
        errors.update(r["errors"])
    keys = ("rows_per_s", "requests_per_s", "p50_ms", "p95_ms", "p99_ms")
    return {
        **{k: _repeated(runs, k) for k in (*keys, "server_cpu_ms_per_request")},
        "floors": {k: repeat_floor(runs, k) for k in keys},
        "answered": sum(r["answered"] for r in runs),
        "lost": sum(r["lost"] for r in runs),
        "errors": dict(errors),
    }


def repeat_floor(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    """An arm's figure ``key`` in consecutive rounds: its ``pair_floor``."""
    return pair_floor([r[key] for r in runs])


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    """The median of the runs' ``key`` where they have one (None: none has)."""
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def peer_ratios(
    by_arm: dict[str, list[dict[str, Any]]], throughput: str, peers: Sequence[str] = PEERS
) -> dict[str, Any]:
    """``vs_<peer>`` for each of ``peers`` measured (its name less ``_json``): per gateway arm,
    the median over rounds of its figure over the peer's in the same round (``throughput``,
    p50 and p99)."""
    out: dict[str, Any] = {}
    for peer in peers:
        runs_of_peer = by_arm.get(peer)
        out[f"vs_{peer.removesuffix('_json')}"] = {
            name: {
                "throughput_ratio": _round_ratios(runs, runs_of_peer, throughput),
                "p50_ratio": _round_ratios(runs, runs_of_peer, "p50_ms"),
                "p99_ratio": _round_ratios(runs, runs_of_peer, "p99_ms"),
            }
            for name, runs in by_arm.items()
            if runs_of_peer and name not in peers
        }
    return out


def _round_ratios(
    runs: list[dict[str, Any]], peer: list[dict[str, Any]], key: str
) -> dict[str, Any] | None:
    values = [
        a[key] / b[key]
        for a, b in zip(runs, peer, strict=True)
        if a[key] is not None and b[key] not in (None, 0)
    ]
    return Repeated.of(values).as_dict(4) if values else None
