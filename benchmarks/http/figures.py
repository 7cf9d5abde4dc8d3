"""Figures made of repeated runs: one ``runs`` entry from the load runs of one configuration,
the CPU each row costs, the choice of the setup to quote."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks.common import Repeated, percentiles


def ms(seconds: float) -> float:
    return seconds * 1e3


def load_figure(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs of one gateway/echo load configuration -> one ``runs`` entry."""
    pct = [percentiles([ms(x) for x in r["latencies_s"]]) for r in results]
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    return {
        "rows_per_s": Repeated.of(r["rows_per_s"] for r in results),
        "requests_per_s": Repeated.of(r["answered"] / r["elapsed_s"] for r in results),
        "p50_ms": Repeated.of(p["p50"] for p in pct),
        "p95_ms": Repeated.of(p["p95"] for p in pct),
        "p99_ms": Repeated.of(p["p99"] for p in pct),
        "answered": sum(r["answered"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "errors": dict(errors),
        "client_cpu_cores": Repeated.of(r["client_cpu_s"] / r["client_wall_s"] for r in results),
        "server_cpu_cores": repeated_or_none([r["server_cpu_cores"] for r in results]),
        "other_processes_cpu_cores": repeated_or_none([_others_cores(r) for r in results]),
    }


def _others_cores(r: dict[str, Any]) -> float | None:
    """What other processes on the machine used meanwhile: the machine's busy cores minus the
    server and the client."""
    if r["machine_busy_cores"] is None or r["server_cpu_cores"] is None:
        return None
    client = r["client_cpu_s"] / r["client_wall_s"]
    return max(0.0, r["machine_busy_cores"] - r["server_cpu_cores"] - client)


def repeated_or_none(values: Sequence[float | None]) -> Repeated | None:
    if not values or any(v is None for v in values):
        return None
    return Repeated.of(v for v in values if v is not None)


def cpu_efficiency(results: Sequence[dict[str, Any]], limit_per_core: Repeated) -> dict[str, Any]:
    """Rows per CPU-second, gateway against limit. On a machine that other work shares, the
    wall-clock ratio moves with whatever else runs; the CPU each row costs does much less, and
    says what the ratio would be where the cores are all ours and all busy."""
    if any(r["server_cpu_cores"] is None for r in results):
        return {}
    server = Repeated.of(r["rows_per_s"] / max(r["server_cpu_cores"], 1e-9) for r in results)
    both = Repeated.of(
        r["rows_per_s"] / max(r["server_cpu_cores"] + r["client_cpu_s"] / r["client_wall_s"], 1e-9)
        for r in results
    )
    return {
        "gateway_rows_per_server_cpu_s": server,
        "gateway_rows_per_cpu_s_with_client": both,
        "cpu_efficiency_ratio": both.median / limit_per_core.median,
        "cpu_efficiency_ratio_server_only": server.median / limit_per_core.median,
    }


def paired_diff(a: Repeated, b: Repeated) -> Repeated:
    return Repeated.of(x - y for x, y in zip(a.values, b.values, strict=True))


def pick(entries: list[dict[str, Any]], client: str | None = None) -> dict[str, Any]:
    """The fastest setup whose median p99 meets the SLO with nothing lost (the fastest of all
    when none does; the entry says so)."""
    pool = [e for e in entries if client is None or e["client_kind"] == client]
    ok = [e for e in pool if e["meets_slo"]]
    return max(ok or pool, key=lambda e: e["rows_per_s"].median)
