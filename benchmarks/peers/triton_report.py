"""The gateway against Triton, per model: issue 37's headline ratios, each with its noise floor
and judged against its target by ``benchmarks.judging.judge`` (met only when it clears the
target after the floor moves it the wrong way).

Closed loops through wrk (``wrk_points``): the ratio is the median over rounds of the
gateway's figure over Triton's in the same round; its floor, the larger of the two arms'
repeat floors (``measure.repeat_floor``: the same arm in two consecutive rounds). The open loop
(``capacity``): the median over rounds of the gateway's capacity over Triton's; its floor, the
larger of the search's resolution and the two arms' repeat floors (None with one search each:
nothing measured twice). The arm that counts is the default ``iotgw serve`` (``GATEWAY``); the
``--no-tuner`` arm's figures (``static_``) and the project's client's (``loadgen_``) stand
beside it. The same closed loops over gRPC (``grpc_points``, h2load against Triton's gRPC
endpoint) give ``grpc_vs_triton_grpc_...``, each beside its floor, issue 33's target judged."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.judging import judge, pair_floor
from benchmarks.peers.capacity import STEP
from benchmarks.peers.plan import (
    GATEWAY,
    GATEWAY_GRPC,
    GATEWAY_STATIC,
    GATEWAY_STATIC_GRPC,
    GRPC_TARGETS,
    TRITON,
    TRITON_GRPC,
    TRITON_TARGETS,
)

# key -> (concurrency, the ratio's kind, the figure whose floors bound it)
CLOSED_KEYS = {
    "vs_triton_throughput_ratio_c8": (8, "throughput_ratio", "requests_per_s"),
    "vs_triton_throughput_ratio_c32": (32, "throughput_ratio", "requests_per_s"),
    "vs_triton_throughput_ratio_c128": (128, "throughput_ratio", "requests_per_s"),
    "vs_triton_p99_ratio_c32": (32, "p99_ratio", "p99_ms"),
    "vs_triton_p50_ratio_c1": (1, "p50_ratio", "p50_ms"),
}
CAPACITY_KEY = "vs_triton_capacity_ratio"
SEARCH_RESOLUTION = math.sqrt(STEP)  # the last step of a search halves the ladder's step


def _closed(
    points: Sequence[dict[str, Any]],
    model: str,
    c: int,
    arm: str,
    kind: str,
    figure: str,
    peer: str = TRITON,
) -> tuple[float | None, float | None]:
    """(ratio, floor) of ``arm`` against ``peer`` (Triton over HTTP, or over gRPC) at ``c``
    connections."""
    p = next((p for p in points if (p["model"], p["connections"]) == (model, c)), None)
    vs = f"vs_{peer.removesuffix('_json')}"
    if p is None or arm not in p.get(vs, {}):
        return None, None
    ratio = p[vs][arm].get(kind)
    floors = [p["arms"][a]["floors"].get(figure) for a in (arm, peer)]
    floor = None if None in floors else max(f for f in floors if f is not None)
    return (None if ratio is None else float(ratio["median"])), floor


def _loadgen_ratio(points: Sequence[dict[str, Any]], model: str, c: int, kind: str) -> float | None:
    """The project's client's ratio (one row per request), the same point."""
    for p in points:
        if (p["model"], p["rows_per_request"], p["concurrency"]) == (model, 1, c):
            ratio = p.get("vs_triton", {}).get(GATEWAY, {}).get(kind)
            return None if ratio is None else float(ratio["median"])
    return None


def _capacity(
    capacity: Sequence[dict[str, Any]], model: str, arm: str
) -> tuple[float | None, float | None]:
    """(ratio, floor) of ``arm``'s capacity against Triton's, round by round."""
    by: dict[str, dict[int, float | None]] = {}
    for row in capacity:
        if row["model"] == model:
            by.setdefault(row["arm"], {})[row["round"]] = row["capacity_rps"]
    mine, peer = by.get(arm, {}), by.get(TRITON, {})
    ratios = [m / p for r, m in sorted(mine.items()) if m is not None and (p := peer.get(r))]
    if not ratios:
        return None, None
    floors = [pair_floor([v for _, v in sorted(values.items())]) for values in (mine, peer)]
    known = [f for f in floors if f is not None]
    floor = max([SEARCH_RESOLUTION, *known]) if len(known) == 2 else None
    return round(statistics.median(ratios), 4), None if floor is None else round(floor, 4)


def _judged(key: str, value: float | None, floor: float | None) -> dict[str, Any]:
    op, target = TRITON_TARGETS[key]
    return {
        key: None if value is None else round(value, 4),
        f"{key}_noise_floor": floor,
        f"{key}_judged": judge(value, target, floor, at_least=op == ">="),
    }


def grpc_key(key: str) -> str:
    """A closed-loop key over HTTP (``vs_triton_...``) as its gRPC twin
    (``grpc_vs_triton_grpc_...``: the gateway's gRPC against Triton's gRPC)."""
    return "grpc_" + key.replace("vs_triton_", "vs_triton_grpc_")


def grpc_summary(grpc_points: Sequence[dict[str, Any]], model: str) -> dict[str, Any]:
    """The closed-loop figures over gRPC (``grpc_points``: h2load against Triton's gRPC
    endpoint), each beside its noise floor; issue 33's target (``GRPC_TARGETS``) judged
    against it; the static gateway's beside them (``static_grpc_...``)."""
    out: dict[str, Any] = {}
    for http_key, (c, kind, figure) in CLOSED_KEYS.items():
        key = grpc_key(http_key)
        value, floor = _closed(grpc_points, model, c, GATEWAY_GRPC, kind, figure, TRITON_GRPC)
        out[key] = None if value is None else round(value, 4)
        out[f"{key}_noise_floor"] = floor
        if key in GRPC_TARGETS:
            op, target = GRPC_TARGETS[key]
            out[f"{key}_judged"] = judge(value, target, floor, at_least=op == ">=")
        static = _closed(grpc_points, model, c, GATEWAY_STATIC_GRPC, kind, figure, TRITON_GRPC)
        out[f"static_{key}"] = static[0]
    return out


def triton_summary(
    points: Sequence[dict[str, Any]],
    wrk_points: Sequence[dict[str, Any]],
    capacity: Sequence[dict[str, Any]],
    model: str,
) -> dict[str, Any]:
    """Issue 37's keys for ``model``, each with ``_noise_floor`` and ``_judged`` beside it;
    then the static arm's (``static_``) and the project's client's (``loadgen_``)."""
    out: dict[str, Any] = {}
    for key, (c, kind, figure) in CLOSED_KEYS.items():
        out.update(_judged(key, *_closed(wrk_points, model, c, GATEWAY, kind, figure)))
    out.update(_judged(CAPACITY_KEY, *_capacity(capacity, model, GATEWAY)))
    for key, (c, kind, figure) in CLOSED_KEYS.items():
        static, _ = _closed(wrk_points, model, c, GATEWAY_STATIC, kind, figure)
        out[f"static_{key}"] = static
    out[f"static_{CAPACITY_KEY}"] = _capacity(capacity, model, GATEWAY_STATIC)[0]
    for key, (c, kind, _) in CLOSED_KEYS.items():
        out[f"loadgen_{key}"] = _loadgen_ratio(points, model, c, kind)
    caps: dict[str, list[float | None]] = {}
    for row in capacity:
        if row["model"] == model:
            caps.setdefault(row["arm"], []).append(row["capacity_rps"])
    out["capacity_rps"] = caps  # per arm, round by round
    return out
