"""The peers benchmark's summary (the headline ratios per model, held against issue 16's
targets), how it measured (for the results file), and the printed tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.common import format_table
from benchmarks.peers.plan import ARMS, GATEWAY, GATEWAY_BINARY, MODELS, TARGETS, Plan

METHOD = {
    "protocol": "Open Inference Protocol v2 over HTTP/1.1 on loopback, "
    "POST /v2/models/<model>/versions/1/infer; the same pre-encoded JSON body to both servers "
    "(flat FP32 data); gateway_binary: the same rows in the binary tensor extension with "
    "binary outputs, which MLServer does not implement",
    "load": "closed loop of N clients (benchmarks.loadgen, raw asyncio HTTP/1.1 client in the "
    "benchmark process, keep-alive): each sends its next request when its reply is in; "
    "every run starts with no request in flight; a short warm-up on the same connections "
    "where replies come faster than it lasts; the timed window holds about 4 replies per "
    "client (1.5 s to 6 s, from the slowest arm's rate at the point before); latency per "
    "request at the client (send -> whole reply read); a request without a 200 reply is lost",
    "request_budget": "every request carries the OIP timeout parameter (20 s): the gateway "
    "would otherwise refuse at once what it predicts would miss the model's SLO, which MLServer "
    "has no notion of; MLServer ignores the parameter",
    "interleaving": "at every point the arms run one after the other, round after round, the "
    "first arm rotating per round; each ratio is the gateway's figure over MLServer's in the "
    "same round, median over rounds (min and max shown)",
    "servers": "both running for the whole benchmark, each in its own processes, sharing the "
    "machine's cores with each other (idle when not driven) and with the load generator",
    "server_cpu": "user + system CPU of the server's whole process tree over the timed run",
}


def _median(doc: dict[str, Any] | None) -> float | None:
    return None if doc is None else float(doc["median"])


def _point(points: Sequence[dict[str, Any]], model: str, rows: int, concurrency: int) -> Any:
    for p in points:
        if (p["model"], p["rows_per_request"], p["concurrency"]) == (model, rows, concurrency):
            return p
    return None


def _ratio(
    points: Sequence[dict[str, Any]], model: str, rows: int, c: int, arm: str, kind: str
) -> float | None:
    p = _point(points, model, rows, c)
    return None if p is None else _median(p["vs_mlserver"].get(arm, {}).get(kind))


def _headline(points: Sequence[dict[str, Any]], model: str, rows: int, arm: str) -> dict:
    return {
        "vs_mlserver_throughput_ratio_c32": _ratio(
            points, model, rows, 32, arm, "throughput_ratio"
        ),
        "vs_mlserver_p99_ratio_c32": _ratio(points, model, rows, 32, arm, "p99_ratio"),
        "vs_mlserver_p50_ratio_c1": _ratio(points, model, rows, 1, arm, "p50_ratio"),
    }


def _meets(value: float | None, rule: tuple[str, float]) -> bool | None:
    if value is None:
        return None
    op, bound = rule
    return value >= bound if op == ">=" else value <= bound


def _arm_medians(points: Sequence[dict[str, Any]], model: str, c: int, key: str) -> dict:
    p = _point(points, model, 1, c)
    if p is None:
        return {}
    return {arm: _median(fig[key]) for arm, fig in p["arms"].items()}


def model_summary(points: Sequence[dict[str, Any]], model: str) -> dict[str, Any]:
    """The three headline ratios (JSON, one row per request) and their targets; beside them the
    binary extension's, and the same at eight rows per request."""
    head = _headline(points, model, 1, GATEWAY)
    out: dict[str, Any] = dict(head)
    out["meets_targets"] = {k: _meets(v, TARGETS[k]) for k, v in head.items()}
    out.update({f"binary_{k}": v for k, v in _headline(points, model, 1, GATEWAY_BINARY).items()})
    out.update({f"{k}_rows8": v for k, v in _headline(points, model, 8, GATEWAY).items()})
    binary8 = _headline(points, model, 8, GATEWAY_BINARY)
    out.update({f"binary_{k}_rows8": v for k, v in binary8.items()})
    out["rows_per_s_c32"] = _arm_medians(points, model, 32, "rows_per_s")
    out["p99_ms_c32"] = _arm_medians(points, model, 32, "p99_ms")
    out["p50_ms_c1"] = _arm_medians(points, model, 1, "p50_ms")
    return out


def summarize(
    plan: Plan,
    points: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    mlserver: dict[str, Any],
) -> dict[str, Any]:
    timed = [r for r in runs if r["figure"] == "peer_run"]
    return {
        **{model: model_summary(points, model) for model in MODELS},
        "mlserver_version": mlserver.get("version"),
        "mlserver_skipped": mlserver.get("skipped"),
        "targets": {k: f"{op} {bound:g}" for k, (op, bound) in TARGETS.items()},
        "lost_requests": {arm: sum(r["lost"] for r in timed if r["arm"] == arm) for arm in ARMS},
        "runs_per_figure": plan.repeats,
    }


def _cell(doc: dict[str, Any] | None, digits: int = 1) -> str:
    return "-" if doc is None else f"{doc['median']:.{digits}f}"


def print_tables(points: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    for model in MODELS:
        for rows in sorted({p["rows_per_request"] for p in points}):
            table = []
            for p in points:
                if (p["model"], p["rows_per_request"]) != (model, rows):
                    continue
                for arm, fig in p["arms"].items():
                    ratio = p["vs_mlserver"].get(arm, {})
                    table.append(
                        [
                            p["concurrency"],
                            arm,
                            _cell(fig["rows_per_s"]),
                            _cell(fig["p50_ms"], 2),
                            _cell(fig["p99_ms"], 2),
                            fig["lost"],
                            _cell(ratio.get("throughput_ratio"), 3),
                            _cell(ratio.get("p50_ratio"), 3),
                            _cell(ratio.get("p99_ratio"), 3),
                        ]
                    )
            print(f"\n{model}, {rows} row(s) per request (medians over rounds; ratios vs MLServer)")
            headers = ["clients", "arm", "rows/s", "p50 ms", "p99 ms", "lost"]
            print(format_table([*headers, "x rows/s", "x p50", "x p99"], table))
    print("\nSummary (JSON, one row per request; targets: " + str(summary["targets"]) + ")")
    keys = [*TARGETS, *(f"binary_{k}" for k in TARGETS)]
    rows_out = [[k, *(summary[m][k] for m in MODELS)] for k in keys]
    print(format_table(["figure", *MODELS], rows_out))
    if summary["mlserver_skipped"]:
        print(f"MLServer arm skipped: {summary['mlserver_skipped']}")
    print(f"lost requests: {summary['lost_requests']}")
