"""One measurement of ``iotgw bench find``: a gateway (static knobs, or its agent on), a load
(closed loop through wrk, Poisson through ``iotgw sim``), and what the clients saw."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import python_argv
from benchmarks.servers import admin_request, clean_env, set_knobs, start_gateway
from benchmarks.tuner.arms import figures
from benchmarks.wrk import WrkResult, run_wrk
from models.knobs import Knobs

SIM_DEVICES = 64


@contextlib.contextmanager
def gateway(repo: Path, workdir: Path, *, agent: bool, log_name: str) -> Iterator[str]:
    """A fresh ``iotgw serve`` over HTTP: the default (agent on, every setting shipped) or
    ``--no-tuner``; yields its base URL and stops it on exit."""
    tuner = () if agent else ("--no-tuner",)
    server, base = start_gateway(repo, workdir, 180.0, tuner_args=tuner, log_name=log_name)
    with server:
        yield base


def json_body(base: str, model: str) -> bytes:
    """One single-row OIP JSON request for ``model``, shaped from its metadata (zeros)."""
    status, meta = admin_request("GET", f"{base}/v2/models/{model}", timeout_s=10)
    if status != 200:
        raise RuntimeError(f"no metadata for {model}: {status} {meta}")
    first = meta["inputs"][0]
    shape = [1, *(int(d) for d in first["shape"][1:])]
    count = 1
    for d in shape:
        count *= d
    doc = {"inputs": [{"name": first["name"], "datatype": "FP32", "shape": shape}]}
    doc["inputs"][0]["data"] = [0.0] * count
    return json.dumps(doc, separators=(",", ":")).encode()


def closed(base: str, model: str, body: bytes, connections: int, seconds: float) -> WrkResult:
    return run_wrk(
        f"{base}/v2/models/{model}/infer", body, connections=connections, seconds=seconds
    )


def static_closed(
    base: str, model: str, body: bytes, knobs: Knobs, connections: int, warmup_s: float, s: float
) -> dict[str, Any]:
    set_knobs(base, model, knobs.as_dict())
    closed(base, model, body, connections, warmup_s)
    return closed(base, model, body, connections, s).as_dict()


def open_loop(
    base: str,
    model: str,
    rate_per_s: float,
    phases: list[tuple[str, float]],
    out: Path,
    *,
    slo_ms: float,
    seed: int,
) -> dict[str, Any]:
    """Poisson arrivals at ``rate_per_s`` through ``phases`` (name, seconds) from the device
    simulator over HTTP; its summary (per phase, and a timeline of p95 by bin)."""
    out.mkdir(parents=True, exist_ok=True)
    scenario = out / "scenario.json"
    doc = {
        "phases": [
            {"name": n, "duration_s": d, "process": "poisson", "rate": rate_per_s}
            for n, d in phases
        ]
    }
    scenario.write_text(json.dumps(doc), encoding="utf-8")
    argv = python_argv(
        "gateway.cli",
        "sim",
        "run",
        "--transport",
        "http",
        "--http-url",
        base,
        "--model",
        model,
        "--scenario",
        str(scenario),
        "--devices",
        str(SIM_DEVICES),
        "--seed",
        str(seed),
        "--timeout-s",
        "10",
        "--framing",
        "json",
        "--slo-ms",
        str(slo_ms),
        "--out",
        str(out),
        "--no-plots",
        "--quiet",
    )
    total = sum(d for _, d in phases)
    done = subprocess.run(
        argv, capture_output=True, text=True, env=clean_env(), timeout=total + 120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"iotgw sim failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads((out / "summary.json").read_text(encoding="utf-8")))


def phase_figures(summary: dict[str, Any], name: str) -> dict[str, Any]:
    """What the clients saw in one phase of a simulator run (as ``iotgw bench tuner`` reads
    its phases)."""
    (phase,) = [p for p in summary["phases"] if p["name"] == name]
    return figures(phase)


def static_open(
    base: str,
    model: str,
    knobs: Knobs,
    rate: float,
    warmup_s: float,
    s: float,
    out: Path,
    *,
    slo_ms: float,
    seed: int,
) -> dict[str, Any]:
    set_knobs(base, model, knobs.as_dict())
    summary = open_loop(
        base, model, rate, [("warmup", warmup_s), ("measured", s)], out, slo_ms=slo_ms, seed=seed
    )
    return {**phase_figures(summary, "measured"), "send_lag_ms": summary.get("send_lag_ms")}


OPEN_PROBES = (1.0, 0.85, 0.7, 0.55, 0.4, 0.25)
"""Fractions of the closed-loop capacity probed, highest first, for the open loop's own."""
KEEPS_UP_LAG_MS = 20.0
"""A simulator whose 99th percentile send lag stays under this kept up with its schedule."""


def open_capacity(
    base: str,
    model: str,
    knobs: Knobs,
    closed_capacity: float,
    warmup_s: float,
    s: float,
    out: Path,
    *,
    slo_ms: float,
) -> tuple[float, list[dict[str, Any]]]:
    """The highest Poisson rate ``iotgw sim`` and the gateway (on ``knobs``) sustain together:
    the first of ``OPEN_PROBES`` x ``closed_capacity``, highest first, at which every request
    was sent on time (the simulator kept up: nothing unsent, its send lag's p99 under
    ``KEEPS_UP_LAG_MS``) and answered (no refusal, none lost) with a p99 within the SLO; with
    every probe. The closed-loop capacity comes from wrk, a C client that takes far less of the
    two cores than the simulator: Poisson at 0.6 of it (2,611/s for sensor_mlp) left the
    simulator 1.3 s behind its schedule and the gateway refusing most of what arrived. (0, the
    probes) when none held."""
    probes: list[dict[str, Any]] = []
    set_knobs(base, model, knobs.as_dict())
    for fraction in OPEN_PROBES:
        rate = fraction * closed_capacity
        summary = open_loop(
            base,
            model,
            rate,
            [("warmup", warmup_s), ("measured", s)],
            out / f"probe-{fraction:g}",
            slo_ms=slo_ms,
            seed=7,
        )
        (phase,) = [p for p in summary["phases"] if p["name"] == "measured"]
        lag: float | None = (summary.get("send_lag_ms") or {}).get("p99")
        unsent = phase["requests"].get("not_sent")
        kept_up = not unsent and lag is not None and lag <= KEEPS_UP_LAG_MS
        row = {"fraction": fraction, **figures(phase), "send_lag_p99_ms": lag, "kept_up": kept_up}
        p99 = row["p99_ms"]
        row["held"] = bool(
            kept_up and not row["errors"] and not row["lost"] and p99 is not None and p99 <= slo_ms
        )
        probes.append(row)
        if row["held"]:
            return float(row["achieved_rps"]), probes
    return 0.0, probes


def knobs_in_effect(base: str, model: str) -> dict[str, Any]:
    """The knobs ``model`` is served with now."""
    _, doc = admin_request("GET", f"{base}/admin/models/{model}/knobs", timeout_s=10)
    return dict(doc["knobs"])


def wait_for_agent(base: str, model: str, timeout_s: float = 120.0) -> None:
    """Until the gateway's agent for ``model`` has started (its state answers)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            status, _ = admin_request("GET", f"{base}/admin/tuner/{model}", timeout_s=5)
            if status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the agent for {model} did not start within {timeout_s:g}s")


def start_agent_at(base: str, model: str, knobs: Knobs) -> None:
    """Set ``knobs`` by hand (which pauses the agent) and resume it: it starts from them."""
    set_knobs(base, model, knobs.as_dict())
    status, doc = admin_request("PUT", f"{base}/admin/tuner/{model}", {"paused": False}, 10)
    if status != 200:
        raise RuntimeError(f"could not resume the agent: {status} {doc}")


LOGGED_KINDS = frozenset(
    {"explore", "accept", "revert", "recall", "yield", "wake", "workload", "drain", "hold"}
)
"""Decisions kept in a run's log: what moved the knobs or the state, not the resting windows."""
REASON_CHARS = 240


def agent_state(base: str, model: str) -> dict[str, Any]:
    """The agent's final knobs and what it did: decision kinds, configurations measured, and
    the log of what moved (seconds from its first decision, kind, knobs, why), so a run's
    outcome can be read back to the decisions that led to it."""
    _, snap = admin_request("GET", f"{base}/admin/tuner/{model}?decisions=1000", timeout_s=10)
    decisions = snap.get("decisions", [])
    kinds: dict[str, int] = {}
    for d in decisions:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    first = decisions[0]["at"] if decisions else 0.0
    log = [
        {
            "t": round(d["at"] - first, 1),
            "kind": d["kind"],
            "knobs": d["config"],
            "reason": d["reason"][:REASON_CHARS],
        }
        for d in decisions
        if d["kind"] in LOGGED_KINDS
    ]
    return {
        "final_knobs": knobs_in_effect(base, model),
        "decisions": kinds,
        "evidence": snap.get("evidence"),
        "explored": [d["config"] for d in decisions if d["kind"] == "explore"],
        "log": log,
    }
