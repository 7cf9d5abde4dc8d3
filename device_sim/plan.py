"""A run's plan: every request it will offer, fixed before the first one is sent.

A plan comes from a scenario (arrival processes; each arrival goes to a device and a model drawn
uniformly at random, so each device sees its share of the aggregate process) or from a trace
(devices, models, payloads and times as recorded, time divided by the replay speed). Both are
truncated to ``max_requests`` and ``max_duration_s`` so a run always ends by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from device_sim.arrivals import describe_process
from device_sim.scenario import Phase, Scenario
from device_sim.trace import TraceEntry


@dataclass(frozen=True, slots=True)
class PhaseInfo:
    name: str
    start_s: float
    duration_s: float
    process: str = "trace"
    """The arrival process's name (``trace`` for a replay)."""
    parameters: dict[str, float] = field(default_factory=dict)
    mean_rate: float = 0.0
    """Long-run mean requests/s the phase offers."""


@dataclass(frozen=True, slots=True)
class Plan:
    times: np.ndarray  # float64 offsets from the run's start, sorted
    device: np.ndarray  # int32 index into devices
    model: np.ndarray  # int32 index into models
    phase: np.ndarray  # int32 index into phases
    devices: tuple[str, ...]
    models: tuple[str, ...]
    phases: tuple[PhaseInfo, ...]
    duration_s: float  # the offered window: requests are sent within [0, duration_s)
    payloads: tuple[str | None, ...] = ()  # per request, a trace's payload reference

    def __len__(self) -> int:
        return int(self.times.size)


def _bounds(times: np.ndarray, max_requests: int, max_duration_s: float) -> int:
    """How many of the (sorted) arrivals fit both bounds."""
    return min(max_requests, int(np.searchsorted(times, max_duration_s, side="left")))


def _phase_info(phase: Phase, start_s: float) -> PhaseInfo:
    kind, parameters = describe_process(phase.process)
    mean = round(phase.process.mean_rate(), 6)
    return PhaseInfo(phase.name, start_s, phase.duration_s, kind, parameters, mean)


def plan_from_scenario(
    scenario: Scenario,
    rng: np.random.Generator,
    devices: list[str],
    models: list[str],
    *,
    max_requests: int,
    max_duration_s: float,
) -> Plan:
    if not devices:
        raise ValueError("a run needs at least one device")
    schedule = scenario.sample(rng)
    n = _bounds(schedule.times, max_requests, max_duration_s)
    times, phase = schedule.times[:n], schedule.phase[:n]
    device = rng.integers(0, len(devices), n).astype(np.int32)

    model_names = list(dict.fromkeys([*models, *(m for p in scenario.phases for m in p.models)]))
    if not model_names:
        raise ValueError("no model to send to: give --model or 'models' in every phase")
    model = np.empty(n, dtype=np.int32)
    for i, p in enumerate(scenario.phases):
        choices = p.models or tuple(models)
        if not choices:
            raise ValueError(f"phase {p.name!r} names no model and no --model was given")
        mask = phase == i
        index = np.array([model_names.index(m) for m in choices], dtype=np.int32)
        model[mask] = index[rng.integers(0, index.size, int(mask.sum()))]

    phases = tuple(
        _phase_info(p, start)
        for p, start in zip(scenario.phases, scenario.phase_starts(), strict=True)
        if start < max_duration_s
    )
    return Plan(
        times=times,
        device=device,
        model=model,
        phase=phase,
        devices=tuple(devices),
        models=tuple(model_names),
        phases=phases,
        duration_s=min(scenario.duration_s, max_duration_s),
    )


def plan_from_trace(
    entries: list[TraceEntry], *, speed: float, max_requests: int, max_duration_s: float
) -> Plan:
    if not entries:
        raise ValueError("the trace is empty")
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    all_times = np.array([e.t for e in entries]) / speed
    all_times -= all_times[0]  # replay starts with the trace's first request
    n = _bounds(all_times, max_requests, max_duration_s)
    kept = entries[:n]
    devices = {d: i for i, d in enumerate(dict.fromkeys(e.device for e in kept))}
    models = {m: i for i, m in enumerate(dict.fromkeys(e.model for e in kept))}
    times = all_times[:n]
    # The offered window is the trace's span plus one mean gap: n evenly spaced requests from
    # 0 then span n gaps, so a replayed constant-rate trace reports the rate it was recorded at.
    span = float(times[-1]) if n else 0.0
    duration = span * n / (n - 1) if n > 1 and span > 0 else max(span, 1.0)
    return Plan(
        times=times,
        device=np.array([devices[e.device] for e in kept], dtype=np.int32),
        model=np.array([models[e.model] for e in kept], dtype=np.int32),
        phase=np.zeros(n, dtype=np.int32),
        devices=tuple(devices),
        models=tuple(models),
        phases=(
            PhaseInfo("trace", 0.0, duration, "trace", {"speed": speed}, round(n / duration, 6)),
        ),
        duration_s=duration,
        payloads=tuple(e.payload for e in kept),
    )
