"""The MQTT benchmark's report: the summary (overheads and ratios taken per round, median over
rounds; the CPU each request costs), the printed table, and the results file."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.common import Repeated, fmt_repeated, format_table
from benchmarks.mqtt.plan import LOW_LOAD_KNOBS, MODEL, SATURATION_KNOBS, Plan

Results = dict[str, list[dict[str, Any]]]
TABLE_HEADERS = [
    "",
    "echo p50 ms",
    "gateway p50 ms",
    "echo p99 ms",
    "gateway p99 ms",
    "echo req/s",
    "gateway req/s",
]


def _per_round(
    a: list[dict[str, Any]], b: list[dict[str, Any]], fn: Callable[[Any, Any], float]
) -> Repeated:
    return Repeated.of(fn(x, y) for x, y in zip(a, b, strict=True))


def _rps(part: list[dict[str, Any]]) -> Repeated:
    return Repeated.of(x["rps"] for x in part)


def _cpu_us_per_request(res: dict[str, Any], who: str) -> float | None:
    cores = res["cpu_cores"].get(who)
    return None if cores is None or not res["rps"] else cores / res["rps"] * 1e6


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _median_us(part: list[dict[str, Any]], who: str) -> float | None:
    return _round(_median([_cpu_us_per_request(x, who) for x in part]), 1)


# -- the summary -------------------------------------------------------------------------------


def summarize(plan: Plan, results: Results, runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for qos in (0, 1):
        summary.update(_qos_figures(results, qos))
    summary.update(_http_figures(results))
    summary.update(_cpu_figures(results, runs))
    summary["lost"] = sum(int(r.get("lost", 0)) for r in runs)
    summary["errors"] = sum(sum(r.get("errors", {}).values()) for r in runs)
    summary["runs_per_figure"] = plan.runs
    return summary


def _qos_figures(results: Results, qos: int) -> dict[str, Any]:
    """The gateway against the echo at one QoS."""
    low_e, low_g = results[f"low/echo/qos{qos}"], results[f"low/gateway/qos{qos}"]
    sat_e, sat_g = results[f"sat/echo/qos{qos}"], results[f"sat/gateway/qos{qos}"]
    p50 = _per_round(low_g, low_e, lambda g, e: g["p50"] - e["p50"])
    p99 = _per_round(low_g, low_e, lambda g, e: g["p99"] - e["p99"])
    ratio = _per_round(sat_g, sat_e, lambda g, e: g["rps"] / e["rps"])
    return {
        f"qos{qos}_p50_overhead_ms": round(p50.median, 3),
        f"qos{qos}_p99_overhead_ms": round(p99.median, 3),
        f"qos{qos}_gateway_vs_echo_throughput_ratio": round(ratio.median, 4),
        f"mqtt_qos{qos}_rps": round(_rps(sat_g).median, 1),
        f"echo_qos{qos}_rps": round(_rps(sat_e).median, 1),
    }


def _http_figures(results: Results) -> dict[str, Any]:
    """The gateway over MQTT against the gateway over HTTP."""
    http, raw = results["sat/gateway-http"], results["sat/gateway-http-raw"]

    def ratio(mqtt: str, other: list[dict[str, Any]]) -> float:
        return round(_per_round(results[mqtt], other, lambda m, h: m["rps"] / h["rps"]).median, 4)

    return {
        "mqtt_qos0_vs_http_throughput_ratio": ratio("sat/gateway/qos0", http),
        "mqtt_vs_http_throughput_ratio": ratio("sat/gateway/qos1", http),
        "http_rps": round(_rps(http).median, 1),
        "http_raw_client_rps": round(_rps(raw).median, 1),
        "mqtt_vs_http_raw_client_throughput_ratio": ratio("sat/gateway/qos1", raw),
    }


def _cpu_figures(results: Results, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What each process spends per answered request on each path (its CPU over the window /
    answered per second): other load on the machine moves this much less than rates."""
    mqtt, http = results["sat/gateway/qos1"], results["sat/gateway-http"]
    per_pair = [
        (_cpu_us_per_request(m, "gateway") or math.nan)
        / (_cpu_us_per_request(h, "gateway") or math.nan)
        for m, h in zip(mqtt, http, strict=True)
    ]
    sat_runs = [r for r in runs if r["phase"] == "saturation"]
    return {
        "gateway_cpu_us_per_request_mqtt_qos1": _median_us(mqtt, "gateway"),
        "gateway_cpu_us_per_request_http": _median_us(http, "gateway"),
        "gateway_cpu_per_request_mqtt_qos1_vs_http": _round(_median(per_pair), 3),
        "clients_cpu_us_per_request_mqtt_qos1": _median_us(mqtt, "clients"),
        "clients_cpu_us_per_request_http": _median_us(http, "clients"),
        "broker_cpu_us_per_request_mqtt_qos1": _median_us(mqtt, "broker"),
        "others_cpu_cores_during_saturation": _round(
            _median([r["cpu_cores"].get("others") for r in sat_runs]), 2
        ),
    }


# -- the printed report --------------------------------------------------------------------------


def print_report(plan: Plan, results: Results, summary: dict[str, Any]) -> None:
    rows = []
    for qos in (0, 1):
        parts = [
            ("p50", results[f"low/echo/qos{qos}"]),
            ("p50", results[f"low/gateway/qos{qos}"]),
            ("p99", results[f"low/echo/qos{qos}"]),
            ("p99", results[f"low/gateway/qos{qos}"]),
            ("rps", results[f"sat/echo/qos{qos}"]),
            ("rps", results[f"sat/gateway/qos{qos}"]),
        ]
        cells = [fmt_repeated(Repeated.of(x[key] for x in part)) for key, part in parts]
        rows.append([f"QoS {qos}", *cells])
    print(format_table(TABLE_HEADERS, rows))
    print(
        f"HTTP (binary, aiohttp) req/s at saturation: "
        f"{fmt_repeated(_rps(results['sat/gateway-http']))}; "
        f"MQTT QoS 1 / HTTP = {summary['mqtt_vs_http_throughput_ratio']} "
        f"(QoS 0: {summary['mqtt_qos0_vs_http_throughput_ratio']}), "
        f"{plan.processes} client processes x {plan.in_flight} in flight each"
    )
    print(
        f"HTTP with the raw client: {summary['http_raw_client_rps']} req/s; MQTT QoS 1 / HTTP "
        f"(raw client) = {summary['mqtt_vs_http_raw_client_throughput_ratio']}"
    )
    print(
        "gateway CPU per request: MQTT QoS 1 "
        f"{summary['gateway_cpu_us_per_request_mqtt_qos1']} us, HTTP "
        f"{summary['gateway_cpu_us_per_request_http']} us; broker "
        f"{summary['broker_cpu_us_per_request_mqtt_qos1']} us; other work on the machine used "
        f"{summary['others_cpu_cores_during_saturation']} cores (median over saturation windows)"
    )
    print(f"lost requests: {summary['lost']}, error replies: {summary['errors']}")


# -- the results file ----------------------------------------------------------------------------


def _method(plan: Plan) -> str:
    return (
        "Low load: one paho client process, one request at a time, echo and gateway "
        "interleaved per round; overheads are per-round gateway minus echo, median. "
        f"Saturation: {plan.processes} load-client processes with {plan.in_flight} "
        "requests in flight each (closed loop, started together after a warm-up), the "
        "same for every target: MQTT via one paho-mqtt MQTT 5 client per process "
        "(TCP_NODELAY), HTTP via one aiohttp session per process with as many "
        "keep-alive connections as requests in flight (headline), and again with the "
        "HTTP bench's raw asyncio client (the HTTP path's best case). Throughput = "
        "requests answered "
        "with status 200 inside the window / window; unanswered after the timeout = "
        "lost. Ratios per round (runs next to each other), median over rounds. "
        "cpu_cores: cores used over each window by the server processes, the clients, "
        "and the rest of the machine (others)."
    )


def config(plan: Plan) -> dict[str, Any]:
    """The results file's ``config``: what was measured and how."""
    return {
        "model": MODEL,
        "payload": "binary frame, 1x32 FP32 (the same JSON header and tensor over HTTP)",
        "plan": plan.__dict__,
        "broker": "mosquitto, set_tcp_nodelay true",
        "gateway": (
            "iotgw serve --broker (MQTT 5, QoS of the run), --receive-maximum 256, --no-tuner"
        ),
        "low_load_knobs": LOW_LOAD_KNOBS,
        "saturation_knobs": SATURATION_KNOBS,
        "method": _method(plan),
    }
