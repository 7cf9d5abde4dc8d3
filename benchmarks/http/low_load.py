"""Experiment 5, low load: one sequential client, the bare echo and the gateway in turns, per
client kind (aiohttp: the headline; raw); overhead = gateway - echo, per round. The in-process
batch-1 runtime time is measured beside it: that part is compute, not overhead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import Repeated, percentiles
from benchmarks.http.bench import Bench
from benchmarks.http.figures import load_figure, ms, paired_diff
from benchmarks.http.plan import setup_fields
from benchmarks.http.workload import Model
from benchmarks.servers import admin_request, set_knobs

KINDS = ("aiohttp", "raw")
LOW_LOAD_KNOBS = {
    "batch_timeout_ms": 0,
    "concurrency": 1,
    "intra_op_threads": 1,
    "inter_op_threads": 1,
}


@dataclass(slots=True)
class _Runs:
    """Per client kind: the echo's runs, the gateway's, and the gateway's own /stats."""

    echo: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in KINDS})
    gateway: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {k: [] for k in KINDS})
    server_side: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {k: [] for k in KINDS}
    )
    runtime: list[list[float]] = field(default_factory=list)


def low_load(bench: Bench, base: str, echo_base: str, model: Model) -> dict[str, dict[str, Any]]:
    """Per client kind, the low-load entry."""
    knobs = set_knobs(base, model.name, LOW_LOAD_KNOBS)
    bench.config["low_load_knobs"] = knobs
    runs = _interleaved_runs(bench, base, echo_base, model)
    rt_p = [percentiles([ms(x) for x in lat]) for lat in runs.runtime]
    runtime: dict[str, Any] = {
        "intra_op_threads": 1,
        "p50_ms": Repeated.of(p["p50"] for p in rt_p),
        "p99_ms": Repeated.of(p["p99"] for p in rt_p),
    }
    return {kind: _entry(bench, model, knobs, kind, runs, runtime) for kind in KINDS}


def _interleaved_runs(bench: Bench, base: str, echo_base: str, model: Model) -> _Runs:
    """Every round: echo then gateway per client kind, then the runtime's own batch-1 calls."""
    plan = bench.plan
    runner = bench.runner(model, 1, 1)
    one_row = {model.input_name: model.row}
    runner.call_latencies(one_row, 200)  # warm-up
    runs = _Runs()
    for _ in range(plan.headline_repeats):
        for kind in KINDS:
            for url, server in (
                (model.url(echo_base), bench.echo),
                (model.url(base), bench.gateway),
            ):
                r = bench.load(
                    url=url,
                    model=model,
                    concurrency=1,
                    setup=(kind, 0),
                    duration_s=120.0,
                    warmup_s=plan.low_warmup_s,
                    max_requests=plan.low_requests,
                    server=server,
                )
                if server is bench.echo:
                    runs.echo[kind].append(r)
                    continue
                runs.gateway[kind].append(r)
                status, stats = admin_request(
                    "GET",
                    f"{base}/admin/models/{model.name}/versions/1/stats"
                    f"?window_s={max(1.0, r['elapsed_s'])}",
                )
                if status == 200:
                    runs.server_side[kind].append(stats)
        runs.runtime.append(runner.call_latencies(one_row, plan.low_requests))
    return runs


def _entry(
    bench: Bench,
    model: Model,
    knobs: dict[str, Any],
    kind: str,
    runs: _Runs,
    runtime: dict[str, Any],
) -> dict[str, Any]:
    echo = load_figure(runs.echo[kind])
    gw = load_figure(runs.gateway[kind])
    server_side = runs.server_side[kind]
    entry: dict[str, Any] = {
        "figure": "low_load_latency",
        "model": model.name,
        "headline": kind == "aiohttp",
        **setup_fields((kind, 0)),
        "offered": "one sequential client (next request sent when the reply is in)",
        "requests_per_run": bench.plan.low_requests,
        "request_body_bytes": len(model.body),
        "echo": {"where": "separate process, same machine, loopback", **echo},
        "gateway": {"where": "separate process (iotgw serve)", "knobs": knobs, **gw},
        "gateway_server_side": {
            "p50_ms": Repeated.of(s["p50_ms"] for s in server_side) if server_side else None,
            "p99_ms": Repeated.of(s["p99_ms"] for s in server_side) if server_side else None,
            "what": "the gateway's own /stats: service entry -> result, no HTTP, codec",
        },
        "inprocess_runtime_batch1": runtime,
        "p50_overhead_ms": paired_diff(gw["p50_ms"], echo["p50_ms"]),
        "p99_overhead_ms": paired_diff(gw["p99_ms"], echo["p99_ms"]),
    }
    bench.runs.append(entry)
    bench.log(
        f"  {kind}: echo p50 {echo['p50_ms'].median:.3f} ms, gateway p50 "
        f"{gw['p50_ms'].median:.3f} ms, overhead {entry['p50_overhead_ms'].median:.3f} "
        f"ms (runtime batch 1: {runtime['p50_ms'].median:.3f} ms)"
    )
    return entry
