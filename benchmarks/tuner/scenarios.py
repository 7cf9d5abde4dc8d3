"""Scenarios whose rates are fractions of the capacity measured at the start of the run, so that
the same scenario means the same on 2 cores and on 16.

A scenario is one or more *streams* (a model and its steps; several streams share the gateway
and the cores, each replayed by its own ``iotgw sim`` at once), sent over HTTP or MQTT. The
steps of every stream have the same durations, so the phases line up across models. A step's
``window`` groups consecutive steps into one report phase (the diurnal ramp is many short
Poisson steps, reported and switched by the oracle per quarter of its day).

Capacity is measured per model, alone on the gateway, with the load generator the scenario
uses (``iotgw sim``, same transport, framing and devices), since on a small machine the
generator's own CPU is part of what limits the rate: a Poisson ramp of short steps, each
``RAMP_FACTOR`` times the last, and the capacity is the highest step the gateway served
(achieved >= 95% of offered, p95 within half the SLO, under 1% of the requests violating it)
before two missed steps in a row (one miss alone is taken for other work on a shared machine);
the first step is a warm-up, not judged. ``max`` is measured with the expert default (eager
batching), ``batch1`` with the same instances at max batch 1 (what a configuration that never
batches can serve).

``--rates-from`` takes the capacities of an earlier results file instead, for the phase rates
only: a rerun then replays that run's very arrivals (the capacity itself is still measured, for
the replay's calibration), where a fresh measurement on a shared machine may differ by a third.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

Reference = Literal["max", "batch1"]
Transport = Literal["http", "mqtt"]
RAMP_FACTOR = 1.4
PASS_ACHIEVED = 0.95
PASS_P95_OF_SLO = 0.5
PASS_VIOLATIONS = 0.01


@dataclass(frozen=True)
class Step:
    """A phase of a stream, its rate a fraction of a measured capacity of the stream's model."""

    name: str
    fraction: float
    of: Reference
    duration_s: float
    at_most_of_max: float | None = None
    """Cap as a fraction of the max capacity (a burst above batch-1 capacity must stay below
    what eager batching serves, or it measures overload, not configurations). The ramp's short
    steps overstate what 20 s sustain: at 0.8 of it every arm but the configured knobs' fell
    into a queue that never drained (p95 10 s, requests lost)."""
    window: str | None = None
    """The report phase this step belongs to (default: its own name)."""


@dataclass(frozen=True)
class Phase:
    name: str
    rate_per_s: float
    duration_s: float
    window: str | None = None


@dataclass(frozen=True)
class Stream:
    model: str
    steps: tuple[Step, ...]

    def scaled(self, factor: float) -> Stream:
        return Stream(
            self.model,
            tuple(replace(s, duration_s=round(s.duration_s * factor, 3)) for s in self.steps),
        )


@dataclass(frozen=True)
class Scenario:
    name: str
    streams: tuple[Stream, ...]
    transport: Transport = "http"
    framing: Literal["binary", "json"] = "binary"
    devices: int = 32
    """Per stream."""

    def __post_init__(self) -> None:
        durations = {tuple(s.duration_s for s in st.steps) for st in self.streams}
        if len(durations) != 1:
            raise ValueError(f"{self.name}: every stream's steps must have the same durations")

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(s.model for s in self.streams)

    def references(self) -> tuple[Reference, ...]:
        """The capacities measured per model: ``max`` and ``batch1`` always, since the batch-1
        ramp calibrates the replay's per-batch cost (``servicetimes.calibrate``)."""
        return ("max", "batch1")

    def scaled(self, duration_factor: float) -> Scenario:
        return replace(self, streams=tuple(s.scaled(duration_factor) for s in self.streams))


@dataclass(frozen=True)
class Capacity:
    """Requests/s the gateway served on the ramp, per reference configuration."""

    rps: dict[str, float]
    ramps: dict[str, list[dict[str, Any]]]


def pinned_capacity(results: Path, scenario: str, model: str) -> dict[str, float]:
    """The capacity (requests/s per reference) whose fractions set ``model``'s phase rates in
    ``scenario`` in an earlier ``tuner_e2e`` results file: the one it measured, or the one it
    took from a file before it."""
    doc = json.loads(results.read_text(encoding="utf-8"))
    try:
        config = doc["config"]["scenarios"][scenario]["models"][model]
        rps = config.get("rates_of_capacity_rps") or config["capacity_rps"]
    except KeyError as exc:
        raise ValueError(f"{results}: no capacity of {model} in {scenario} ({exc})") from None
    return {str(ref): float(v) for ref, v in rps.items()}


def resolve(stream: Stream, capacity: Capacity) -> tuple[Phase, ...]:
    """A stream's phases in requests/s on this machine."""
    phases = []
    for s in stream.steps:
        rate = s.fraction * capacity.rps[s.of]
        if s.at_most_of_max is not None:
            rate = min(rate, s.at_most_of_max * capacity.rps["max"])
        phases.append(Phase(s.name, round(max(rate, 1.0), 1), s.duration_s, s.window))
    return tuple(phases)


def ramp_phases(start_rps: float, steps: int, step_s: float) -> tuple[Phase, ...]:
    return tuple(
        Phase(f"ramp{k}", round(start_rps * RAMP_FACTOR**k, 1), step_s) for k in range(steps)
    )


def _ended(steps: list[dict[str, Any]]) -> bool:
    return any(not a["passed"] and not b["passed"] for a, b in itertools.pairwise(steps))


def capacity_from_ramp(summary: dict[str, Any], slo_ms: float) -> tuple[float, list[dict]]:
    """The highest step served before two missed in a row (and every step's figures)."""
    served = 0.0
    steps: list[dict[str, Any]] = []
    misses = 0
    for i, p in enumerate(summary["phases"]):
        latency = p["latency_ms"] or {}
        slo = p["slo"] or {}
        ok = (
            p["achieved_rps"] >= PASS_ACHIEVED * p["offered_rps"]
            and latency.get("p95") is not None
            and latency["p95"] <= PASS_P95_OF_SLO * slo_ms
            and slo.get("violation_fraction", 1.0) <= PASS_VIOLATIONS
        )
        # One step missed among passing ones is a burst of other work on the machine, not the
        # gateway's limit: the ramp ends at the second miss in a row.
        if i == 0:  # the warm-up step: connections open, sessions run their first batches
            ok = True
        misses = 0 if ok else misses + 1
        if ok and misses == 0 and not _ended(steps):
            served = p["offered_rps"]
        steps.append(
            {
                "offered_rps": p["offered_rps"],
                "achieved_rps": p["achieved_rps"],
                "p95_ms": latency.get("p95"),
                "violation_fraction": slo.get("violation_fraction"),
                "passed": ok,
            }
        )
    return served, steps


def diurnal_steps(
    low: float, high: float, day_s: float, steps: int, noise: float, seed: int
) -> tuple[Step, ...]:
    """A compressed day as ``steps`` Poisson steps of fractions of ``max``: a cosine from
    ``low`` (night) up to ``high`` (noon) and back, each step's rate times a log-normal
    factor (``noise``: its sigma; a fixed seed, so every arm and seed sees the same day), in
    four report windows (night, morning, afternoon, evening)."""
    rng = np.random.default_rng(seed)
    names = ("night", "morning", "afternoon", "evening")
    out = []
    for k in range(steps):
        t = (k + 0.5) / steps
        # Quarter windows: night is the first quarter, the peak sits between morning and
        # afternoon, evening ramps back down to night.
        level = low + (high - low) * 0.5 * (1 - math.cos(2 * math.pi * (t - 0.125)))
        level = min(level * float(rng.lognormal(0.0, noise)), 1.5 * high)
        out.append(
            Step(f"h{k:02d}", round(level, 4), "max", day_s / steps, window=names[4 * k // steps])
        )
    return tuple(out)


# vision_cnn: the earlier scenario's shape (trickle, burst, sustained, trickle) as fractions of
# capacity, kept below what the ramp's short steps overstate.
VISION_CNN = Scenario(
    "vision_cnn",
    (
        Stream(
            "vision_cnn",
            (
                Step("trickle", 0.06, "max", 20.0),
                Step("burst", 0.6, "max", 20.0),
                Step("sustained-high", 0.4, "max", 30.0),
                Step("trickle-again", 0.06, "max", 15.0),
            ),
        ),
    ),
)
# sensor_mlp, small rows at high rates: the batching-sensitive one. The burst is above what
# batch size 1 serves (so a configuration that does not batch collapses) and below what eager
# batching serves; the middle rate is below batch 1's capacity, half the burst.
SENSOR_STEPS = (
    Step("trickle", 0.03, "max", 15.0),
    Step("burst", 1.3, "batch1", 20.0, at_most_of_max=0.6),
    Step("middle", 0.65, "batch1", 20.0, at_most_of_max=0.3),
    Step("trickle-again", 0.03, "max", 15.0),
)
SENSOR_MLP = Scenario("sensor_mlp", (Stream("sensor_mlp", SENSOR_STEPS),))
# Two models on one gateway, bursting in turn (each burst half of what the model alone serves,
# the other trickling), twice: the cores one needs in its burst the other needs in the next.
_A_BURST = (("a-burst", 0.45, 0.03), ("b-burst", 0.03, 0.45)) * 2
SHARED_CORES = Scenario(
    "shared_cores",
    (
        Stream(
            "sensor_mlp",
            tuple(Step(f"{n}{i // 2 + 1}", a, "max", 15.0) for i, (n, a, _) in enumerate(_A_BURST)),
        ),
        Stream(
            "vision_cnn",
            tuple(Step(f"{n}{i // 2 + 1}", b, "max", 15.0) for i, (n, _, b) in enumerate(_A_BURST)),
        ),
    ),
    devices=16,
)
# A compressed day on sensor_mlp: night trickle, a ramp to half the max capacity at noon and
# back, every 3 s step's rate perturbed (sigma 0.25).
DIURNAL = Scenario(
    "diurnal",
    (Stream("sensor_mlp", diurnal_steps(0.03, 0.5, 60.0, 20, 0.25, seed=7)),),
)
# sensor_mlp's shifting workload over MQTT 5 (QoS 1) through a Mosquitto the bench starts.
SENSOR_MLP_MQTT = Scenario(
    "sensor_mlp_mqtt", (Stream("sensor_mlp", SENSOR_STEPS),), transport="mqtt"
)
SCENARIOS = {s.name: s for s in (VISION_CNN, SENSOR_MLP, SHARED_CORES, DIURNAL, SENSOR_MLP_MQTT)}
# The ramp's first step, requests/s, per model (a tenth of a guess at the capacity on 2 cores).
RAMP_START = {"vision_cnn": 20.0, "sensor_mlp": 100.0}
