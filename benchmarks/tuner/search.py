"""The replay search of one seed: the seed's arrivals (the very ones ``iotgw sim --seed`` sends)
through ``benchmarks.tuner.replay`` for the per-gateway configurations, the best static ones
over the whole trace and each report phase's best (the per-phase oracle).

One model: every configuration of the request-level grid (batch 1..128, timeout 0/1/2/4/8 ms;
batch 1 only with timeout 0) under each measured thread setting, 144 on 2 cores.

Several models: the joint grid (144 per model, so 144^n) is too large to replay whole, so it is
pruned per model first: each model's grid replayed with that model alone on the machine, and
for each thread setting its best configuration over the whole trace and in each phase kept
(the configurations a phase's burst or trickle wants, under every split of the cores); the
product of those candidates is then replayed jointly, every model's lane sharing the cores,
and searched exhaustively, both for the whole trace and per phase.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.tuner.arms import stream_seed
from benchmarks.tuner.replay import JointScored, Stream, candidates, score, search
from benchmarks.tuner.scenarios import Phase, Scenario
from models.knobs import Knobs
from rrl.offline.replay import ServiceTimes, request_grid

TIMEOUTS_MS = (0.0, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class ModelPlan:
    """What the search needs of one model of the scenario."""

    name: str
    slo_ms: float
    phases: tuple[Phase, ...]
    service: ServiceTimes
    configured: Knobs
    expert: Knobs


def seeded_trace(
    devices: int, model: str, phases: tuple[Phase, ...], seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The arrival times ``iotgw sim --seed`` will send (the same phases, the same seed), and
    each one's phase."""
    from device_sim.plan import plan_from_scenario
    from device_sim.scenario import parse_scenario

    doc = {
        "phases": [
            {"name": p.name, "duration_s": p.duration_s, "process": "poisson", "rate": p.rate_per_s}
            for p in phases
        ]
    }
    schedule_seed, _ = np.random.SeedSequence(seed).spawn(2)
    plan = plan_from_scenario(
        parse_scenario(doc),
        np.random.default_rng(schedule_seed),
        [f"d{i}" for i in range(devices)],
        [model],
        max_requests=1_000_000,
        max_duration_s=3600.0,
    )
    return plan.times, plan.phase


def streams(
    scenario: Scenario, models: list[ModelPlan], windows: list[dict[str, Any]], seed: int
) -> list[Stream]:
    window_of_step = np.zeros(sum(len(w["steps"]) for w in windows), dtype=np.int32)
    for w, window in enumerate(windows):
        window_of_step[window["steps"]] = w
    out = []
    for k, m in enumerate(models):
        times, phase = seeded_trace(scenario.devices, m.name, m.phases, stream_seed(seed, k))
        out.append(Stream(times, window_of_step[phase], m.service, m.slo_ms / 1e3))
    return out


def replay_seed(
    scenario: Scenario,
    models: list[ModelPlan],
    windows: list[dict[str, Any]],
    seed: int,
    cores: int,
    k: int,
) -> tuple[list[JointScored], list[JointScored], list[JointScored]]:
    """(every per-gateway configuration replayed, the k best static ones other than the
    configured and expert knobs, each window's best)."""
    lanes = streams(scenario, models, windows, seed)
    n = len(windows)
    grids = []
    for m, lane in zip(models, lanes, strict=True):
        settings = m.service.settings()
        grid = [
            (c,) for c in request_grid(settings, m.service.batch_sizes(settings[0]), TIMEOUTS_MS)
        ]
        if len(models) == 1:
            grids.append([g[0] for g in grid])
            continue
        alone = score([lane], grid, n, cores, seed=seed)
        grids.append(candidates(alone, m.slo_ms, n))
    joint = list(itertools.product(*grids))
    scored = score(lanes, joint, n, cores, seed=seed)
    exclude = [tuple(m.configured for m in models), tuple(m.expert for m in models)]
    best, oracle = search(scored, [m.slo_ms for m in models], exclude, k)
    return scored, best, oracle


def prediction(s: JointScored, models: list[ModelPlan]) -> dict[str, Any]:
    """What the replay predicted of a configuration, per model."""
    slos = [m.slo_ms for m in models]
    return {
        "objective": round(s.objective(slos), 4),
        "models": {
            m.name: {
                "p95_ms": f.p95_ms,
                "violations": f.violations,
                "phases_p95_ms": [w[i].p95_ms for w in s.windows],
            }
            for i, (m, f) in enumerate(zip(models, s.overall, strict=True))
        },
    }
