"""Scenarios: a sequence of phases, each an arrival process held for a duration.

File format (TOML, or JSON with the same structure), documented in docs/device_sim.md::

    [[phases]]
    name = "light"            # optional, default "phase<i>"
    duration_s = 60
    process = "poisson"       # constant | poisson | onoff | diurnal
    rate = 5                  # every other key is a parameter of the process
    models = ["sensor_mlp"]   # optional: models this phase's requests go to (default: --model)
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from device_sim.arrivals import ArrivalProcess, make_process, process_parameters

_PHASE_KEYS = {"name", "duration_s", "process", "models"}


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    duration_s: float
    process: ArrivalProcess
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Schedule:
    """Arrival offsets from the start of the run, with the phase each one belongs to."""

    times: np.ndarray  # float64, sorted
    phase: np.ndarray  # int32 index into Scenario.phases


@dataclass(frozen=True, slots=True)
class Scenario:
    phases: tuple[Phase, ...]
    source: str = field(default="scenario", compare=False)
    """Where the load came from: ``arrival`` (command-line options) or the scenario file."""

    @property
    def duration_s(self) -> float:
        return sum(p.duration_s for p in self.phases)

    def phase_starts(self) -> list[float]:
        starts, t = [], 0.0
        for p in self.phases:
            starts.append(t)
            t += p.duration_s
        return starts

    def sample(self, rng: np.random.Generator) -> Schedule:
        times, phases = [], []
        for i, (start, phase) in enumerate(zip(self.phase_starts(), self.phases, strict=True)):
            offsets = phase.process.sample(rng, phase.duration_s)
            times.append(start + offsets)
            phases.append(np.full(offsets.size, i, dtype=np.int32))
        if not times:
            return Schedule(np.empty(0), np.empty(0, dtype=np.int32))
        return Schedule(np.concatenate(times), np.concatenate(phases))


def single_phase(process: ArrivalProcess, duration_s: float, name: str = "main") -> Scenario:
    return Scenario((Phase(name, _duration(duration_s, name), process),), source="arrival")


def _duration(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: duration_s must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: duration_s must be > 0, got {value!r}")
    return float(value)


def _check_keys(kind: str, params: dict[str, Any]) -> None:
    """A typo (``rat = 100``) is named with every key a phase of this process may hold."""
    required, optional = process_parameters(kind)
    unknown = sorted(set(params) - set(required) - set(optional))
    if unknown:
        valid = ", ".join(sorted(_PHASE_KEYS) + required + optional)
        raise ValueError(
            f"unknown key {', '.join(map(repr, unknown))}; valid keys of a {kind!r} phase: {valid}"
        )


def parse_scenario(doc: Any) -> Scenario:
    """Build a scenario from the decoded file (a mapping with a ``phases`` list)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("phases"), list) or not doc["phases"]:
        raise ValueError("a scenario needs a non-empty 'phases' list")
    phases = []
    for i, entry in enumerate(doc["phases"]):
        where = f"phases[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a table/object")
        name = str(entry.get("name", f"phase{i}"))
        kind = entry.get("process")
        if not isinstance(kind, str):
            raise ValueError(f"{where}: 'process' must name an arrival process")
        models = entry.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            raise ValueError(f"{where}: 'models' must be a list of model names")
        params = {k: v for k, v in entry.items() if k not in _PHASE_KEYS}
        try:
            _check_keys(kind, params)
            process = make_process(kind, params)
        except ValueError as exc:
            raise ValueError(f"{where} ({name!r}): {exc}") from None
        phases.append(
            Phase(name, _duration(entry.get("duration_s"), where), process, tuple(models))
        )
    return Scenario(tuple(phases))


def load_scenario(path: Path) -> Scenario:
    """Read a scenario from a ``.toml`` or ``.json`` file."""
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return replace(parse_scenario(doc), source=str(path))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
