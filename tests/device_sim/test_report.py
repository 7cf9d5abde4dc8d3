"""The console headline: one line per phase (and per model, in a run of several) with offered
against achieved rate, p50/p99 and what failed by kind, read from a result set built by hand."""

from __future__ import annotations

from typing import Any

import numpy as np

from device_sim.arrivals import Constant
from device_sim.ledger import Ledger, Outcome, Result
from device_sim.plan import plan_from_scenario
from device_sim.report import headline
from device_sim.scenario import Phase, Scenario
from device_sim.summary import summarize

RUN = {
    "models": ["toy"],
    "transport": "mqtt5",
    "target": "mqtt://127.0.0.1:1883",
    "qos": 1,
    "framing": "json",
    "timeout_s": 5.0,
}
LATENCY_S = 0.020


def calm_then_burst(models: list[str], phases: int = 2) -> dict[str, Any]:
    """calm: 10/s for 1 s, every request answered in 20 ms. burst: 40/s for 1 s, of which
    every 4th is refused (overloaded, 503), five get no reply, one is kept back by the
    in-flight bound, and the other 24 are answered in 20 ms. ``phases=1``: calm only."""
    both = (Phase("calm", 1.0, Constant(10)), Phase("burst", 1.0, Constant(40)))
    scenario = Scenario(both[:phases])
    plan = plan_from_scenario(
        scenario,
        np.random.default_rng(0),
        ["d"],
        models,
        max_requests=10**6,
        max_duration_s=1e9,
    )
    ledger = Ledger(len(plan), origin=0.0)
    burst = 0
    for i, (t, phase) in enumerate(zip(plan.times.tolist(), plan.phase.tolist(), strict=True)):
        if phase == 1:
            j, burst = burst, burst + 1
            if j % 4 == 0:
                ledger.record(i, Result(Outcome.ERROR, t, t + 0.005, 503, "overloaded"))
                continue
            if j in (1, 5, 9, 13, 17):
                ledger.record(i, Result(Outcome.LOST, t))
                continue
            if j == 2:
                ledger.refuse(i, "in_flight_limit")
                continue
        ledger.record(i, Result(Outcome.OK, t, t + LATENCY_S, 200))
    run = {**RUN, "models": list(plan.models)}
    return summarize(plan, ledger, slo_ms=None, elapsed_s=plan.duration_s, run=run)


def test_one_headline_line_per_phase() -> None:
    lines = headline(calm_then_burst(["toy"])).splitlines()
    burst_failures = (
        "errors: overloaded (503) 10, timed out (no reply in 5 s) 5, not sent (--max-in-flight) 1"
    )
    assert lines[:4] == [
        "transport: MQTT 5 via mqtt://127.0.0.1:1883 (QoS 1, JSON; replies on each request's "
        "Response Topic)",
        "phase calm (constant 10/s): offered 10 req/s, achieved 10 req/s, "
        "p50 20 ms, p99 20 ms; no errors or timeouts",
        "phase burst (constant 40/s): offered 40 req/s, achieved 24 req/s, "
        f"p50 20 ms, p99 20 ms; {burst_failures}",
        # 34 answered over the 2 s window
        f"whole run: offered 25 req/s, achieved 17 req/s, p50 20 ms, p99 20 ms; {burst_failures}",
    ]
    assert lines[4] == "requests: 50 planned, 49 sent, 34 ok, 10 errors, 5 lost, 1 not sent"


def test_a_run_of_several_models_has_a_line_per_model() -> None:
    summary = calm_then_burst(["fast", "slow"])
    lines = headline(summary).splitlines()
    model_lines = [line for line in lines if line.startswith("model ")]
    assert [line.split(":")[0] for line in model_lines] == ["model fast", "model slow"]
    # between the phases and the whole run
    assert lines.index(model_lines[0]) == 3 and lines[5].startswith("whole run: ")
    refused = []
    for line, model in zip(model_lines, summary["models"], strict=True):
        assert f"offered {model['offered_rps']:.3g} req/s" in line
        count = model["errors"]["overloaded"]["count"]
        assert f"overloaded (503) {count}" in line
        refused.append(count)
    assert sum(refused) == 10  # the models' shares of the refusals are the run's


def test_a_single_phase_needs_no_whole_run_line() -> None:
    summary = calm_then_burst(["toy"], phases=1)
    lines = headline(summary).splitlines()
    assert lines[1] == (
        "phase calm (constant 10/s): offered 10 req/s, achieved 10 req/s, "
        "p50 20 ms, p99 20 ms; no errors or timeouts"
    )
    assert lines[2].startswith("requests: 10 planned")
