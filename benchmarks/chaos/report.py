"""Device-side accounting of ``iotgw bench chaos``: every request id a device published ends as
answered with 200, answered with an error (counted by reason), or lost (no reply by the end of
the settle period). The summary, the printed table and the results file."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from benchmarks.chaos.partition import failover
from benchmarks.chaos.scenarios import Case
from benchmarks.common import format_table, percentiles

SOAK_TAIL_S = 20 * 60  # rss_growth_last_20min: growth over the soak's last 20 minutes


def _columns(ledgers: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Send times, reply times (NaN: none) and statuses (0: none) of every request."""
    sent_at = np.array([t for led in ledgers for t in led["sent_at"]])
    status = np.array([s for led in ledgers for s in led["status"]], dtype=np.int64)
    replied = np.array([np.nan if t is None else t for led in ledgers for t in led["replied_at"]])
    return sent_at, replied, status


def outcomes(ledgers: list[dict[str, Any]]) -> dict[str, Any]:
    """Every request of ``ledgers`` as answered, an error by reason, or lost; its latency."""
    sent_at, replied, status = _columns(ledgers)
    reasons: Counter[str] = Counter()
    for led in ledgers:
        reasons.update(led["reasons"].values())
    ok = status == 200
    latency_ms = (replied[ok] - sent_at[ok]) * 1e3
    pct = percentiles(latency_ms, (50, 99))
    return {
        "sent": int(sent_at.size),
        "answered": int(ok.sum()),
        "errors": dict(sorted(reasons.items())),
        "lost": int((status == 0).sum()),
        "duplicates": sum(led["duplicates"] for led in ledgers),
        "unmatched_replies": sum(led["unmatched"] for led in ledgers),
        "p50_ms": _round(pct["p50"]),
        "p99_ms": _round(pct["p99"]),
        "max_ms": _round(float(latency_ms.max())) if latency_ms.size else None,
    }


def account(case: Case, slo_ms: float) -> dict[str, Any]:
    """One case's figures from its devices' ledgers (and its gRPC clients', under "grpc")."""
    sent_at, replied, status = _columns(case.ledgers)
    start = float(sent_at.min()) if sent_at.size else 0.0
    span = float(sent_at.max() - sent_at.min()) if sent_at.size > 1 else 0.0
    out: dict[str, Any] = {
        "case": case.name,
        **outcomes(case.ledgers),
        "device_reconnects": sum(led["reconnects"] for led in case.ledgers),
        "device_sessions_lost": sum(led["sessions_lost"] for led in case.ledgers),
        "offered_per_s": round(sent_at.size / span, 1) if span else None,
        "events": [{**e, "at": round(e["at"] - start, 3)} for e in case.events],
        **case.config,
    }
    if case.grpc_ledgers:
        out["grpc"] = outcomes(case.grpc_ledgers)
    if case.name.startswith("d_"):
        # The case's own model's SLO (case d may overload another model than a-c's).
        case_slo_ms = float(case.config.get("slo_ms", slo_ms))
        ok = status == 200
        p99 = percentiles((replied[ok] - sent_at[ok]) * 1e3, (99,))["p99"]
        out["admitted_p99_over_slo"] = _round(p99 / case_slo_ms, 3)
        out["errors_503"] = int((status == 503).sum())
        # What the devices really offered, in multiples of the capacity the ramp measured.
        capacity = case.config.get("capacity_ok_per_s")
        if capacity and out["offered_per_s"]:
            out["offered_over_capacity"] = round(out["offered_per_s"] / capacity, 2)
    if case.name == "c_replicas":
        out["answered_after_replica_restart"] = _waited_for_restart(case, sent_at, replied)
    if case.name.startswith("f_"):
        at = {e["event"]: e["at"] for e in case.events}
        cut, restore = at.get("replica 0 link cut"), at.get("replica 0 link restored")
        if cut is not None and restore is not None:
            out.update(failover(sent_at, replied, cut, restore))
        out["broker_dropped"] = [
            {**d, "at": round(d["at"] - start)} for d in case.config["broker_dropped"]
        ]
    if case.name == "e_soak":
        out["rss_growth_last_20min"] = rss_growth(case.config["rss"])
    return out


def _waited_for_restart(case: Case, sent_at: np.ndarray, replied: np.ndarray) -> int:
    """Requests sent while replica 0 was down that were answered only after it came back: the
    share the broker kept for it instead of handing it to the replica still serving."""
    at = {e["event"]: e for e in case.events}
    down, back = at.get("replica 0 SIGKILL"), at.get("replica 0 restart")
    if down is None or back is None:
        return 0
    back_at = back["at"] + back["took_s"]
    window = (sent_at >= down["at"]) & (sent_at < back["at"])
    return int((window & (replied >= back_at)).sum())


def rss_growth(samples: list[dict[str, Any]]) -> float | None:
    """Relative RSS growth over the last ``SOAK_TAIL_S`` of the soak (None: too short)."""
    if not samples:
        return None
    end = samples[-1]
    tail = [s for s in samples if s["t_s"] >= end["t_s"] - SOAK_TAIL_S]
    if end["t_s"] - tail[0]["t_s"] < SOAK_TAIL_S * 0.9:
        return None
    return round(end["rss_bytes"] / tail[0]["rss_bytes"] - 1, 4)


def summarize(cases: list[dict[str, Any]]) -> dict[str, Any]:
    chaos = [c for c in cases if c["case"][0] in "abcd"]
    overload = {c["case"]: c for c in cases if c["case"].startswith("d_")}
    ratios = [c["admitted_p99_over_slo"] for c in overload.values()]
    soak = [c for c in cases if c["case"] == "e_soak"]
    summary: dict[str, Any] = {
        "lost_qos1": sum(c["lost"] for c in chaos),
        "admitted_p99_over_slo_ratio_overload": max(
            (r for r in ratios if r is not None), default=None
        ),
        "rss_growth_last_20min": soak[0]["rss_growth_last_20min"] if soak else None,
        "duplicates": sum(c["duplicates"] for c in chaos),
        "accounted": all(
            part["sent"] == part["answered"] + sum(part["errors"].values()) + part["lost"]
            for c in cases
            for part in (c, c.get("grpc"))
            if part is not None
        ),
    }
    grpc = [c["grpc"] for c in cases if "grpc" in c]
    # The gRPC clients' calls in cases a and c, accounted as the devices' requests are.
    summary["grpc_sent"] = sum(g["sent"] for g in grpc) if grpc else None
    summary["lost_grpc"] = sum(g["lost"] for g in grpc) if grpc else None
    for name, c in overload.items():
        summary[f"admitted_p99_over_slo_{name[2:]}"] = c["admitted_p99_over_slo"]
        summary[f"errors_503_{name[2:]}"] = c["errors_503"]
        summary[f"offered_over_capacity_{name[2:]}"] = c.get("offered_over_capacity")
    summary["embedded_broker"] = overload.get("d_overload_embedded", {}).get("broker")
    for c in cases:
        if c["case"].startswith("f_partition"):
            tail = c["case"][len("f_partition") :]  # "" or "_short_session"
            summary[f"lost_qos1_partition{tail}"] = c["lost"]
            summary[f"partition_failover_s{tail}"] = c.get("partition_failover_s")
            summary[f"held_for_cut_replica{tail}"] = c.get("held_for_cut_replica")
            summary[f"duplicates_partition{tail}"] = c["duplicates"]
    return summary


def print_table(cases: list[dict[str, Any]]) -> None:
    parts = [(c["case"], c) for c in cases]
    parts += [(f"{c['case']} (gRPC)", c["grpc"]) for c in cases if "grpc" in c]
    rows = [
        [
            name,
            c["sent"],
            c["answered"],
            ", ".join(f"{k} {v}" for k, v in c["errors"].items()) or "-",
            c["lost"],
            c["duplicates"],
            c["p50_ms"] if c["p50_ms"] is not None else float("nan"),
            c["p99_ms"] if c["p99_ms"] is not None else float("nan"),
        ]
        for name, c in parts
    ]
    print(
        format_table(
            ["case", "sent", "200", "errors", "lost", "dup", "p50 ms", "p99 ms"],
            rows,
        )
    )


def _round(value: float, digits: int = 2) -> float | None:
    return None if value != value else round(float(value), digits)
