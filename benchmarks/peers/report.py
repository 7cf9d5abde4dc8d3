"""The peers benchmark's summary (the headline ratios per model: against MLServer, held to issue
16's targets; against Triton, issue 37's, in ``triton_report``), how it measured (for the
results file), and the printed tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.common import format_table
from benchmarks.peers.plan import (
    ARMS,
    GATEWAY,
    GATEWAY_BINARY,
    GATEWAY_GRPC,
    GRPC_ARMS,
    GRPC_TARGETS,
    MLSERVER,
    MODELS,
    TARGETS,
    TRITON,
    TRITON_TARGETS,
    Plan,
)
from benchmarks.peers.triton_report import CLOSED_KEYS, grpc_key, grpc_summary, triton_summary

METHOD = {
    "protocol": "Open Inference Protocol v2 over HTTP/1.1 on loopback, "
    "POST /v2/models/<model>/versions/1/infer; the same pre-encoded JSON body to every server "
    "(flat FP32 data; Triton's bound tensors carry the ONNX file's own names); gateway_binary: "
    "the static gateway on the same rows in the binary tensor extension with binary outputs, "
    "which MLServer does not implement",
    "arms": "gateway_json: the default iotgw serve (agent on), the arm that counts; "
    "gateway_static_json: iotgw serve --no-tuner with the best static configuration "
    "(plan.STATIC_KNOBS), which MLServer (maximum batch and batch time, threads) and Triton "
    "(maximum batch, dynamic batcher queue delay, one instance per gateway concurrency, "
    "threads) get too",
    "wrk": "closed loops through wrk (one thread, keep-alive, the same JSON body, one row per "
    "request) at every JSON arm, a warm-up then the timed window, arms interleaved round by "
    "round; the headline ratios against Triton are these",
    "grpc": "closed loops over gRPC through h2load (Debian's nghttp2-client, one thread; the "
    "calls in flight over up to 8 HTTP/2 connections) at Triton's gRPC endpoint and both "
    "gateways', the same serialized inference.ModelInferRequest (one row in "
    "raw_input_contents, the same time budget) to each, a warm-up then the timed window, arms "
    "interleaved round by round; h2load cannot read a gRPC status, so a call is served only "
    "when the server's own statistics (/v2/models/<model>/stats, success count) counted it, "
    "and each arm's reply was checked against the runtime before any timing",
    "open_loop": "Poisson arrivals from iotgw sim over HTTP (JSON, one row per request): per "
    "arm, the highest rate on a 1.25x ladder from half its wrk rate at 32 connections (then "
    "the rate between the last passing and the first failing one) whose p99 stays under the "
    "model's SLO with nothing lost, no error and the client keeping up (achieved >= 0.9 of "
    "offered)",
    "noise_floor": "per figure, the same arm in two consecutive rounds, larger over smaller, "
    "median over pairs; a ratio's floor is the larger of its two arms'; the capacity's also at "
    "least the search's resolution (sqrt 1.25); targets judged by benchmarks.judging.judge",
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
    return None if p is None else _median(p.get("vs_mlserver", {}).get(arm, {}).get(kind))


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


def wrk_rate(wrk_points: Sequence[dict[str, Any]], model: str, arm: str) -> float:
    """``arm``'s median rate through wrk at 32 connections (else its best at any), req/s."""
    rates = {
        p["connections"]: p["arms"][arm]["requests_per_s"]
        for p in wrk_points
        if p["model"] == model and arm in p["arms"] and p["arms"][arm]["requests_per_s"]
    }
    if not rates:
        return 0.0
    return float(rates.get(32) or max(rates.values()))


def summarize(
    plan: Plan,
    points: Sequence[dict[str, Any]],
    wrk_points: Sequence[dict[str, Any]],
    grpc_points: Sequence[dict[str, Any]],
    capacity: Sequence[dict[str, Any]],
    runs: Sequence[dict[str, Any]],
    peers: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    timed = [r for r in runs if r["figure"] == "peer_run"]
    wrk_runs = [r for r in runs if r["figure"] == "peer_wrk_run"]
    grpc_runs = [r for r in runs if r["figure"] == "peer_grpc_run"]
    return {
        **{
            model: {
                **model_summary(points, model),
                **triton_summary(points, wrk_points, capacity, model),
                **grpc_summary(grpc_points, model),
            }
            for model in MODELS
        },
        "mlserver_version": peers[MLSERVER].get("version"),
        "mlserver_skipped": peers[MLSERVER].get("skipped"),
        "triton_version": peers[TRITON].get("version"),
        "triton_skipped": peers[TRITON].get("skipped"),
        "targets": {k: f"{op} {bound:g}" for k, (op, bound) in TARGETS.items()},
        "triton_targets": {k: f"{op} {bound:g}" for k, (op, bound) in TRITON_TARGETS.items()},
        "grpc_targets": {k: f"{op} {bound:g}" for k, (op, bound) in GRPC_TARGETS.items()},
        "lost_requests": {arm: sum(r["lost"] for r in timed if r["arm"] == arm) for arm in ARMS},
        "wrk_failed_requests": {
            arm: sum(r["failed"] for r in wrk_runs if r["arm"] == arm) for arm in ARMS
        },
        "grpc_failed_requests": {
            arm: sum(r["failed"] for r in grpc_runs if r["arm"] == arm) for arm in GRPC_ARMS
        },
        "runs_per_figure": plan.repeats,
        "capacity_searches_per_arm": plan.capacity_repeats,
    }


def point_line(p: dict[str, Any], throughput: str) -> str:
    """One point in a line for the log: every arm's throughput, p99 and losses, and the
    gateway's throughput ratio to each peer."""

    def med(doc: Any) -> str:
        if isinstance(doc, dict):
            doc = doc["median"]
        return "-" if doc is None else f"{doc:.4g}"

    parts = [
        f"{arm} {med(fig[throughput])}/s p99 {med(fig['p99_ms'])} ms "
        f"lost {fig.get('lost', fig.get('failed'))}"
        for arm, fig in p["arms"].items()
    ]
    for peer, arm in (("mlserver", GATEWAY), ("triton", GATEWAY), ("triton_grpc", GATEWAY_GRPC)):
        ratio = p.get(f"vs_{peer}", {}).get(arm, {}).get("throughput_ratio")
        if ratio is not None:
            parts.append(f"x{med(ratio)} vs {peer}")
    where = p.get("rows_per_request")
    head = f"{p['model']} c={p.get('concurrency', p.get('connections'))}"
    client = " (h2load, gRPC)" if p["figure"] == "peer_grpc_point" else " (wrk)"
    head += f" rows={where}" if where is not None else client
    return f"{head}: {'; '.join(parts)}"


def _cell(doc: dict[str, Any] | None, digits: int = 1) -> str:
    return "-" if doc is None else f"{doc['median']:.{digits}f}"


def _ratio_cells(
    p: dict[str, Any], arm: str, peers: Sequence[str] = ("mlserver", "triton")
) -> list[str]:
    cells = []
    for peer in peers:
        ratio = p.get(f"vs_{peer}", {}).get(arm, {})
        cells += [_cell(ratio.get("throughput_ratio"), 3), _cell(ratio.get("p99_ratio"), 3)]
    return cells


def _print_points(points: Sequence[dict[str, Any]]) -> None:
    for model in MODELS:
        for rows in sorted({p["rows_per_request"] for p in points}):
            table = [
                [
                    p["concurrency"],
                    arm,
                    _cell(fig["rows_per_s"]),
                    _cell(fig["p50_ms"], 2),
                    _cell(fig["p99_ms"], 2),
                    fig["lost"],
                    *_ratio_cells(p, arm),
                ]
                for p in points
                if (p["model"], p["rows_per_request"]) == (model, rows)
                for arm, fig in p["arms"].items()
            ]
            print(f"\n{model}, {rows} row(s) per request, the project's client (medians)")
            headers = ["clients", "arm", "rows/s", "p50 ms", "p99 ms", "lost"]
            ratios = ["x rows/s MLS", "x p99 MLS", "x rows/s Triton", "x p99 Triton"]
            print(format_table([*headers, *ratios], table))


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_closed_points(points: Sequence[dict[str, Any]], client: str, grpc: bool) -> None:
    """wrk's points (HTTP, against both peers) or h2load's (gRPC, against Triton's)."""
    peers = ("triton_grpc",) if grpc else ("mlserver", "triton")
    for model in MODELS:
        table = [
            [
                p["connections"],
                arm,
                _number(fig["requests_per_s"], 1),
                _number(fig["p50_ms"], 2),
                _number(fig["p99_ms"], 2),
                fig["failed"],
                *_ratio_cells(p, arm, peers),
            ]
            for p in points
            if p["model"] == model
            for arm, fig in p["arms"].items()
        ]
        print(f"\n{model}, {client}, one row per request (medians)")
        headers = ["connections", "arm", "req/s", "p50 ms", "p99 ms", "failed"]
        ratios = [f"x {what} {peer}" for peer in peers for what in ("req/s", "p99")]
        print(format_table([*headers, *ratios], table))


def print_tables(
    points: Sequence[dict[str, Any]],
    wrk_points: Sequence[dict[str, Any]],
    grpc_points: Sequence[dict[str, Any]],
    summary: dict[str, Any],
) -> None:
    _print_points(points)
    _print_closed_points(wrk_points, "wrk", grpc=False)
    _print_closed_points(grpc_points, "h2load over gRPC", grpc=True)
    print("\nSummary vs MLServer (JSON, one row per request; targets: " + str(summary["targets"]))
    keys = [*TARGETS, *(f"binary_{k}" for k in TARGETS)]
    print(format_table(["figure", *MODELS], [[k, *(summary[m][k] for m in MODELS)] for k in keys]))
    print("\nSummary vs Triton (value, noise floor, verdict)")
    rows_out = [
        [
            k,
            *(
                f"{summary[m][k]} ({summary[m][k + '_noise_floor']}): {summary[m][k + '_judged']}"
                for m in MODELS
            ),
        ]
        for k in TRITON_TARGETS
    ]
    print(format_table(["figure", *MODELS], rows_out))
    print("\nOver gRPC, against Triton's gRPC (value, noise floor, verdict where a target is set)")
    rows_out = [
        [
            k,
            *(
                f"{summary[m][k]} ({summary[m][k + '_noise_floor']})"
                + (f": {summary[m][k + '_judged']}" if k in GRPC_TARGETS else "")
                for m in MODELS
            ),
        ]
        for k in (grpc_key(c) for c in CLOSED_KEYS)
    ]
    print(format_table(["figure", *MODELS], rows_out))
    for m in MODELS:
        print(f"capacity at the SLO, req/s ({m}): {summary[m]['capacity_rps']}")
    for peer in ("mlserver", "triton"):
        if summary[f"{peer}_skipped"]:
            print(f"{peer} arm skipped: {summary[f'{peer}_skipped']}")
    print(f"lost requests: {summary['lost_requests']}")
    print(f"wrk failed requests: {summary['wrk_failed_requests']}")
    print(f"gRPC failed requests: {summary['grpc_failed_requests']}")
