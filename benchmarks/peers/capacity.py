"""The open loop of the peers benchmark: each arm's capacity at its model's SLO, the highest
Poisson rate whose p99 stays under the SLO with nothing lost and no error (MLPerf's Server
scenario, in spirit), through the device simulator over HTTP (``iotgw sim``, as ``iotgw bench
find`` drives its open loops), one JSON row per request.

The search climbs a geometric ladder (``STEP`` apart) from half the arm's closed-loop rate,
down the ladder instead when that first rate fails already; once a passing rate and the failing
one above it are known, the rate between them (geometric mean) is tried once more. A step also
fails when the simulator could not send at the offered rate (its achieved rate under
``MIN_ACHIEVED`` of the offered): that capacity is the client's, and the step says so.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import python_argv
from benchmarks.find.measure import SIM_DEVICES, phase_figures
from benchmarks.http.workload import Model
from benchmarks.peers.plan import REQUEST_BUDGET_S, Plan
from benchmarks.servers import clean_env

STEP = 1.25  # ratio between two rates of the ladder
MIN_ACHIEVED = 0.9  # achieved / offered below this: the client, not the server, fell behind


def step_verdict(fig: dict[str, Any], slo_ms: float) -> str | None:
    """None when the step passes; else why it fails."""
    if fig["lost"] or fig["errors"]:
        return f"{fig['lost']} lost, {fig['errors']} errors"
    if fig["p99_ms"] is None or fig["p99_ms"] > slo_ms:
        return f"p99 {fig['p99_ms']} ms over the {slo_ms:g} ms SLO"
    offered, achieved = fig["offered_rps"], fig["achieved_rps"]
    if offered and (achieved or 0.0) < MIN_ACHIEVED * offered:
        return f"the client sent {achieved} of {offered} req/s offered (client-bound)"
    return None


Measure = Callable[[float, bool], dict[str, Any]]
"""One open-loop step at a rate (req/s); the flag asks for a warm-up first."""


def search(measure: Measure, start_rps: float, slo_ms: float, max_steps: int) -> dict[str, Any]:
    """The capacity found by at most ``max_steps`` steps from ``start_rps``, and every step."""
    steps: list[dict[str, Any]] = []

    def step(rate: float) -> bool:
        fig = measure(rate, not steps)
        why = step_verdict(fig, slo_ms)
        steps.append({"rate_rps": round(rate, 1), "passed": why is None, "why": why, **fig})
        return why is None

    best, failed_at = None, None
    rate = start_rps
    going_up = step(rate)
    if going_up:
        best = rate
    else:
        failed_at = rate
    while len(steps) < max_steps:
        if best is not None and failed_at is not None:
            between = math.sqrt(best * failed_at)
            if step(between):
                best = between
            break
        rate = rate * STEP if going_up else rate / STEP
        if step(rate):
            best = rate
        else:
            failed_at = rate
    return {
        "capacity_rps": None if best is None else round(best, 1),
        # False: every rate tried passed, so the capacity is at least this (the steps ran out).
        "bounded_above": failed_at is not None,
        "steps": steps,
    }


def write_metadata(model: Model, path: Path) -> Path:
    """The model's metadata as the simulator reads it (the OIP ``GET /v2/models/{m}`` shape),
    from the ONNX file: the simulator is handed it rather than asking each server, since
    MLServer's runtime declares no inputs, and so every arm gets the very same requests."""
    inputs = [{"name": model.input_name, "datatype": "FP32", "shape": [-1, *model.row_shape]}]
    path.write_text(json.dumps({"name": model.name, "inputs": inputs}), encoding="utf-8")
    return path


def open_loop(
    base: str,
    model: Model,
    rate_per_s: float,
    phases: list[tuple[str, float]],
    out: Path,
    seed: int,
) -> dict[str, Any]:
    """Poisson arrivals at ``rate_per_s`` through ``phases`` (name, seconds) from ``iotgw sim``
    over HTTP, JSON, one row per request carrying the benchmark's time budget (as the closed
    loops' requests do); its summary."""
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "phases": [
            {"name": n, "duration_s": d, "process": "poisson", "rate": rate_per_s}
            for n, d in phases
        ]
    }
    scenario = out / "scenario.json"
    scenario.write_text(json.dumps(doc), encoding="utf-8")
    argv = python_argv(
        "gateway.cli",
        *("sim", "run", "--transport", "http", "--http-url", base, "--model", model.name),
        *("--metadata", str(write_metadata(model, out / "metadata.json"))),
        *("--scenario", str(scenario), "--devices", str(SIM_DEVICES), "--seed", str(seed)),
        *("--timeout-s", "10", "--framing", "json", "--slo-ms", str(model.slo_ms)),
        *("--deadline-ms", str(REQUEST_BUDGET_S * 1000.0)),
        *("--out", str(out), "--no-plots", "--quiet"),
    )
    total = sum(d for _, d in phases)
    done = subprocess.run(
        argv, capture_output=True, text=True, env=clean_env(), timeout=total + 120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"iotgw sim failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return dict(json.loads((out / "summary.json").read_text(encoding="utf-8")))


def arm_capacity(
    plan: Plan, base: str, model: Model, closed_rps: float, out: Path, *, seed: int
) -> dict[str, Any]:
    """One capacity search of the server at ``base`` for ``model``; ``closed_rps``: the arm's
    closed-loop rate, where the ladder starts from half."""
    count = iter(range(plan.max_open_steps))

    def measure(rate: float, warm: bool) -> dict[str, Any]:
        phases = [("measured", plan.open_s)]
        if warm:
            phases.insert(0, ("warmup", plan.open_warmup_s))
        folder = out / f"step{next(count)}"
        summary = open_loop(base, model, rate, phases, folder, seed)
        return {**phase_figures(summary, "measured"), "send_lag_ms": summary.get("send_lag_ms")}

    start = max(1.0, 0.5 * closed_rps)
    return {
        "slo_ms": model.slo_ms,
        "start_rps": round(start, 1),
        **search(measure, start, model.slo_ms, plan.max_open_steps),
    }
