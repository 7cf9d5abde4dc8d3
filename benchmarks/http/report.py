"""The HTTP benchmark's report: the summary figures, the description of the method that goes
into the results file, and the printed tables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from benchmarks.common import Repeated, fmt_repeated, format_table, print_summary
from benchmarks.http.codec_cpu import CONFIGS, HEADLINE
from benchmarks.http.plan import BATCH_SLO_FRACTION, CLOSED_LOOP_SLO_FRACTION, MAX_CLOSED_LOOP, Plan
from benchmarks.http.workload import Model
from benchmarks.judging import judge, pair_floor

METHOD = {
    "protocol": "OIP v2 binary tensor extension: JSON header + raw FP32, "
    "binary_data_output=true, HTTP/1.1 keep-alive, loopback",
    "limit": "models.backends.load_runtime in this process; best of "
    "(intra-op threads, instances) x batch sizes",
    "gateway_knob_rule": "the limit's intra-op threads; concurrency = the limit's "
    "instances or one more; the two largest batch sizes whose in-process batch costs "
    f"<= {BATCH_SLO_FRACTION} x SLO; the fastest of these four (raw client, "
    "N = (concurrency + 1) x batch) meeting the SLO with nothing lost",
    "closed_loop_rule": "N in {(instances + 1), 2 x instances, 3 x instances} x batch, "
    "capped at "
    f"{CLOSED_LOOP_SLO_FRACTION} x SLO x limit rows/s and {MAX_CLOSED_LOOP}",
    "choice": "fastest (client setup, N) whose median p99 <= SLO with nothing lost",
    "clients": {
        "aiohttp": "aiohttp.ClientSession, body and headers built once",
        "raw": "RawHttpConnection: asyncio protocol, whole request pre-encoded once, "
        "checks status and Content-Length",
    },
    "cores_shared": "client, gateway and in-process runs share this machine's cores "
    "(and whatever else runs on it: see the load averages)",
}


def models_config(models: dict[str, Model]) -> dict[str, Any]:
    return {
        m.name: {
            "runtime": m.version.config.runtime,
            "max_batch_size": m.max_batch_size,
            "slo_ms": m.slo_ms,
            "request_body_bytes": len(m.body),
            "rows_per_request": 1,
        }
        for m in models.values()
    }


# -- the summary -------------------------------------------------------------------------------


def summarize(
    plan: Plan,
    heads: dict[str, dict[str, dict[str, Any]]],
    low: dict[str, dict[str, Any]],
    codec: dict[str, dict[str, Any]],
    by_load: dict[str, Any],
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    mlp, cnn = heads["sensor_mlp"], heads["vision_cnn"]
    lo, lo_raw = low["aiohttp"], low["raw"]
    cnn_head = cnn["headline"]
    return {
        "cnn_throughput_ratio": round(cnn_head["ratio"], 4),
        "p50_overhead_ms": round(lo["p50_overhead_ms"].median, 4),
        "mlp_throughput_ratio": round(mlp["headline"]["ratio"], 5),
        "cnn_throughput_ratio_aiohttp_client": round(cnn["aiohttp"]["ratio"], 4),
        "mlp_throughput_ratio_aiohttp_client": round(mlp["aiohttp"]["ratio"], 5),
        "cnn_client": cnn_head["gateway"]["client"],
        "mlp_client": mlp["headline"]["gateway"]["client"],
        "cnn_limit_rows_per_s": round(cnn_head["limit"]["rows_per_s"].median, 1),
        "cnn_gateway_rows_per_s": round(cnn_head["gateway"]["rows_per_s"].median, 1),
        "mlp_limit_rows_per_s": round(mlp["headline"]["limit"]["rows_per_s"].median, 1),
        "mlp_gateway_rows_per_s": round(mlp["headline"]["gateway"]["rows_per_s"].median, 1),
        "cnn_cpu_efficiency_ratio": _round(cnn_head.get("cpu_efficiency_ratio"), 4),
        "cnn_cpu_efficiency_ratio_server_only": _round(
            cnn_head.get("cpu_efficiency_ratio_server_only"), 4
        ),
        "cnn_other_processes_cpu_cores_limit_gateway": [
            _round(_others_median(cnn_head["limit"]), 3),
            _round(_others_median(cnn_head["gateway"]), 3),
        ],
        "p99_overhead_ms": round(lo["p99_overhead_ms"].median, 4),
        "echo_p50_ms": round(lo["echo"]["p50_ms"].median, 4),
        "gateway_p50_ms": round(lo["gateway"]["p50_ms"].median, 4),
        "p50_overhead_ms_raw_client": round(lo_raw["p50_overhead_ms"].median, 4),
        "mlp_runtime_batch1_p50_ms": round(lo["inprocess_runtime_batch1"]["p50_ms"].median, 4),
        "lost_requests_headline": _lost_headline(heads, lo),
        "lost_requests_all_runs": _lost(runs),
        # Of those, the ones the gateway answered with an error status (a sweep point past
        # capacity is refused with 503 and a reason, by admission): refused, not lost.
        "refused_requests_all_runs": _refused(runs),
        "runs_per_figure": min(plan.repeats, plan.headline_repeats),
        "meets_cnn_ratio_target_0_85": cnn_head["ratio"] >= 0.85,
        "meets_p50_overhead_target_1ms": lo["p50_overhead_ms"].median <= 1.0,
        **_cpu_per_request_summary(codec),
        **_cpu_by_load_summary(by_load),
    }


def _cpu_per_request_summary(codec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``cpu_per_request_ratio`` (after / before, the headline workload), the same per
    workload, and the headline's microseconds of gateway CPU per request before and after."""
    out: dict[str, Any] = {}
    for name, entry in codec.items():
        ratio = entry.get("cpu_per_request_ratio")
        key = "cpu_per_request_ratio" + ("" if name == HEADLINE else f"_{name}")
        out[key] = None if ratio is None else round(ratio.median, 4)
        if name == HEADLINE:
            for config in ("before", "after"):
                us = entry[config].get("server_cpu_per_request_us")
                out[f"cpu_per_request_us_{config}"] = None if us is None else round(us.median, 1)
    out["cpu_per_request_workload"] = HEADLINE
    return out


TRICKLE_VS_SATURATION_TARGET = 2.0
SATURATION_CPU_US_TARGET = 150.0


def _cpu_by_load_summary(entry: dict[str, Any]) -> dict[str, Any]:
    """Per transport and level, the gateway's microseconds of CPU per request (median); the
    trickle against saturation, judged against its target with the floor its rounds give
    (``pair_floor``: consecutive rounds, the larger over the smaller, median over the pairs);
    the idle gateway's cores."""
    out: dict[str, Any] = {"idle_gateway_cores": round(entry["idle_cores"].median, 5)}
    for transport, levels in entry["cpu_us_per_request"].items():
        for level, us in levels.items():
            out[f"cpu_us_per_request_{level}_{transport}"] = _round(_median(us), 1)
        ratio = entry.get(f"trickle_vs_saturation_{transport}")
        key = f"trickle_vs_saturation_{transport}"
        out[key] = _round(_median(ratio), 3)
        out[f"{key}_floor"] = pair_floor(ratio.values if ratio else ())
        out[f"{key}_target"] = judge(
            out[key], TRICKLE_VS_SATURATION_TARGET, out[f"{key}_floor"], at_least=False
        )
        saturated = levels.get("saturation")
        sat_key = f"cpu_us_per_request_saturation_{transport}"
        out[f"{sat_key}_target"] = judge(
            out[sat_key],
            SATURATION_CPU_US_TARGET,
            pair_floor(saturated.values if saturated else ()),
            at_least=False,
        )
    return out


def _median(figure: Repeated | None) -> float | None:
    return None if figure is None else figure.median


def _others_median(part: dict[str, Any]) -> float | None:
    r = part.get("other_processes_cpu_cores")
    return None if r is None else r.median


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _lost_headline(heads: dict[str, dict[str, dict[str, Any]]], low: dict[str, Any]) -> int:
    """Lost in the quoted runs: each ratio entry once (the picks may share one), low load."""
    entries = {id(e): e for h in heads.values() for e in h.values()}.values()
    return (
        sum(int(e["gateway"]["lost"]) for e in entries)
        + int(low["gateway"]["lost"])
        + int(low["echo"]["lost"])
    )


def _counted(runs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every run entry and its gateway and echo parts: each holds its own counts."""
    for r in runs:
        yield r
        for part in ("gateway", "echo"):
            if isinstance(r.get(part), dict):
                yield r[part]


def _refused(runs: list[dict[str, Any]]) -> int:
    """Requests of every run answered with an HTTP error status (the client counts them lost)."""
    return sum(
        n
        for counts in _counted(runs)
        for what, n in (counts.get("errors") or {}).items()
        if what.startswith("HTTP ")
    )


def _lost(runs: list[dict[str, Any]]) -> int:
    return sum(int(counts.get("lost", 0)) for counts in _counted(runs))


# -- the tables --------------------------------------------------------------------------------


def print_tables(runs: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    def figure(name: str) -> list[dict[str, Any]]:
        return [r for r in runs if r["figure"] == name]

    _print_limit(figure("inprocess_limit_sweep"))
    _print_knobs(figure("gateway_knob_sweep"))
    _print_saturation(figure("gateway_saturation_sweep"))
    _print_ratios(figure("throughput_ratio"))
    for r in figure("low_load_latency"):
        _print_low_load(r)
    _print_cpu_per_request(figure("cpu_per_request"))
    _print_cpu_by_load(figure("cpu_by_load"))
    print_summary(summary)


def _client_short(r: dict[str, Any]) -> str:
    procs = r["client_processes"]
    return f"{r['client_kind']}" + (f" x{procs} procs" if procs else "")


def _server_cores(r: dict[str, Any]) -> float:
    return r["server_cpu_cores"].median if r["server_cpu_cores"] else float("nan")


def _others(part: dict[str, Any]) -> str:
    r = part.get("other_processes_cpu_cores")
    return "-" if r is None else f"{r.median:.2f}"


def _print_limit(sweep: list[dict[str, Any]]) -> None:
    print("\nIn-process runtime (the limit): rows/s, median [min-max]")
    headers = ["model", "intra", "inst", "batch", "rows/s", "batch ms", "cores"]
    rows = [
        [
            r["model"],
            r["intra_op_threads"],
            r["instances"],
            r["batch_size"],
            fmt_repeated(r["rows_per_s"]),
            r["batch_ms"],
            r["cpu_cores"].median,
        ]
        for r in sweep
    ]
    print(format_table(headers, rows))


def _print_knobs(kns: list[dict[str, Any]]) -> None:
    print(
        "\nGateway knobs at saturation (raw client, N = (concurrency + 1) x batch): "
        "median [min-max]"
    )
    headers = ["model", "batch", "conc", "intra", "N", "rows/s", "p99 ms", "lost", "srv cores"]
    rows = [
        [
            r["model"],
            r["knobs"]["max_batch_size"],
            r["knobs"]["concurrency"],
            r["knobs"]["intra_op_threads"],
            r["closed_loop_concurrency"],
            fmt_repeated(r["rows_per_s"]),
            fmt_repeated(r["p99_ms"]),
            r["lost"],
            _server_cores(r),
        ]
        for r in kns
    ]
    print(format_table(headers, rows))


def _print_saturation(gws: list[dict[str, Any]]) -> None:
    print("\nGateway at saturation, sweep (1 row per request, closed loop): median [min-max]")
    headers = ["model", "client", "N", "rows/s", "p50 ms", "p99 ms", "lost"]
    headers += ["srv cores", "cli cores"]
    rows = [
        [
            r["model"],
            _client_short(r),
            r["closed_loop_concurrency"],
            fmt_repeated(r["rows_per_s"]),
            fmt_repeated(r["p50_ms"]),
            fmt_repeated(r["p99_ms"]),
            r["lost"],
            _server_cores(r),
            r["client_cpu_cores"].median,
        ]
        for r in gws
    ]
    print(format_table(headers, rows))


def _print_ratios(heads: list[dict[str, Any]]) -> None:
    print("\nThroughput, limit and gateway in turns (L G L G ... L): median [min-max]")
    headers = ["model", "client", "N", "limit rows/s", "gateway rows/s", "ratio (rounds)"]
    headers += ["ratio of medians", "gw p99 ms", "lost", "CPU ratio", "CPU ratio srv"]
    headers += ["others L/G"]
    rows = [
        [
            r["model"] + (" *" if r["headline"] else ""),
            _client_short(r["gateway"]),
            r["gateway"]["closed_loop_concurrency"],
            fmt_repeated(r["limit"]["rows_per_s"]),
            fmt_repeated(r["gateway"]["rows_per_s"]),
            fmt_repeated(r["ratio_per_pair"]),
            r["ratio_of_medians"],
            fmt_repeated(r["gateway"]["p99_ms"]),
            r["gateway"]["lost"],
            r.get("cpu_efficiency_ratio", float("nan")),
            r.get("cpu_efficiency_ratio_server_only", float("nan")),
            _others(r["limit"]) + "/" + _others(r["gateway"]),
        ]
        for r in heads
    ]
    print(format_table(headers, rows))
    print(
        "(* the headline setup: the fastest that met the SLO with nothing lost. CPU ratio: "
        "gateway rows per CPU-second of server + client, over the limit's rows per CPU-second; "
        "srv: server CPU only. others: CPU cores that other processes on the machine used "
        "during the limit / gateway runs)"
    )


def _print_low_load(r: dict[str, Any]) -> None:
    print(
        f"\nLow load, {r['model']}, one sequential {r['client_kind']} client: "
        "ms, median [min-max]" + ("  (headline)" if r["headline"] else "")
    )
    rt = r["inprocess_runtime_batch1"]
    rows = [
        ["bare aiohttp echo", *_p50_p99(r["echo"]), r["echo"]["lost"]],
        ["gateway", *_p50_p99(r["gateway"]), r["gateway"]["lost"]],
        [
            "gateway - echo (paired)",
            fmt_repeated(r["p50_overhead_ms"]),
            fmt_repeated(r["p99_overhead_ms"]),
            "-",
        ],
        ["in-process runtime, batch 1", *_p50_p99(rt), "-"],
    ]
    server = r["gateway_server_side"]
    if server["p50_ms"] is not None:
        rows.append(["gateway server-side (/stats)", *_p50_p99(server), "-"])
    print(format_table(["", "p50", "p99", "lost"], rows))


def _p50_p99(part: dict[str, Any]) -> list[str]:
    return [fmt_repeated(part["p50_ms"]), fmt_repeated(part["p99_ms"])]


def _print_cpu_per_request(entries: list[dict[str, Any]]) -> None:
    print(
        "\nGateway CPU per request, before ("
        + " ".join(CONFIGS["before"])
        + ") and after ("
        + " ".join(CONFIGS["after"])
        + "), in turns: median [min-max]"
    )
    headers = ["workload", "body B", "before us/req", "after us/req", "ratio (rounds)"]
    headers += ["req/s before", "req/s after", "lost"]
    rows = [
        [
            e["workload"],
            e["request_body_bytes"],
            _us(e["before"]),
            _us(e["after"]),
            fmt_repeated(e["cpu_per_request_ratio"]) if "cpu_per_request_ratio" in e else "-",
            fmt_repeated(e["before"]["requests_per_s"]),
            fmt_repeated(e["after"]["requests_per_s"]),
            e["before"]["lost"] + e["after"]["lost"],
        ]
        for e in entries
    ]
    print(format_table(headers, rows))
    print(
        "(gateway process user + system CPU over the timed window / requests answered; "
        f"{entries[0]['closed_loop_concurrency'] if entries else '-'} requests in flight, "
        "raw client in the benchmark process, one row per request)"
    )


def _us(part: dict[str, Any]) -> str:
    us = part.get("server_cpu_per_request_us")
    return "-" if us is None else fmt_repeated(us)


def _print_cpu_by_load(entries: list[dict[str, Any]]) -> None:
    for e in entries:
        print(
            f"\nGateway CPU per request by load ({e['model']}, JSON, {e['knobs']}): us per "
            "answered request, median [min-max]"
        )
        headers = ["transport", "trickle", "one client", "saturation", "trickle / saturation"]
        rows = []
        for transport, levels in e["cpu_us_per_request"].items():
            ratio = e.get(f"trickle_vs_saturation_{transport}")
            rows.append(
                [
                    transport,
                    *(fmt_repeated(levels[level]) if levels[level] else "-" for level in levels),
                    fmt_repeated(ratio) if ratio else "-",
                ]
            )
        print(format_table(headers, rows))
        print(
            f"(trickle: {e['trickle']}; one client: {e['one_client']}; saturation: "
            f"{e['saturation']}; idle gateway {fmt_repeated(e['idle_cores'])} cores; lost "
            f"{e['lost']})"
        )
