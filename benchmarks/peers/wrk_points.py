"""The closed loops of the peers benchmark through wrk (``benchmarks.wrk``, a C load generator
that costs the shared cores far less per request than a Python client): every JSON arm on the
same body, one row per request, the arms interleaved round by round as in ``measure``, and the
gateway's ratios to each peer taken within each round."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.http.workload import Model
from benchmarks.peers.measure import (
    Arm,
    interleaved_point,
    with_server_cores,
)
from benchmarks.peers.plan import Plan
from benchmarks.peers.workload import json_request
from benchmarks.wrk import run_wrk


def wrk_run(plan: Plan, arm: Arm, model: Model, body: bytes, connections: int) -> dict[str, Any]:
    """A warm-up on fresh connections, then the timed run; the server's CPU (its process
    tree) over the timed run."""
    url = model.url(arm.base)
    timeout_s = plan.client_timeout_s
    run_wrk(url, body, connections=connections, seconds=plan.wrk_warmup_s, timeout_s=timeout_s)
    res, server_cores = with_server_cores(
        arm.server.pid,
        lambda: run_wrk(
            url, body, connections=connections, seconds=plan.wrk_s, timeout_s=timeout_s
        ),
    )
    return {
        **res.as_dict(),
        "requests_per_s": res.rate_per_s,  # answered 2xx only; ``failed`` counts the others
        "server_cpu_cores": server_cores,
        "server_cpu_ms_per_request": 1000.0 * server_cores / res.rate_per_s
        if res.rate_per_s
        else None,
    }


def wrk_point(
    plan: Plan,
    arms: Sequence[Arm],
    model: Model,
    connections: int,
    record: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Every arm ``plan.repeats`` times at ``connections``, interleaved; each run handed to
    ``record``. Returns the point: per arm the medians and floors, the ratios to each peer."""
    body = json_request(model, 1).body
    return interleaved_point(
        plan,
        arms,
        {"model": model.name, "connections": connections},
        "peer_wrk",
        lambda arm: wrk_run(plan, arm, model, body, connections),
        record,
    )
