"""The five parallelism knobs of one model version, and their bounds on this machine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gateway.errors import BadRequest


@dataclass(frozen=True, slots=True)
class Knobs:
    max_batch_size: int
    batch_timeout_s: float
    concurrency: int
    intra_op_threads: int
    inter_op_threads: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "max_batch_size": self.max_batch_size,
            "batch_timeout_ms": self.batch_timeout_s * 1000.0,
            "concurrency": self.concurrency,
            "intra_op_threads": self.intra_op_threads,
            "inter_op_threads": self.inter_op_threads,
        }


@dataclass(frozen=True, slots=True)
class KnobLimits:
    """Largest accepted values. Threads are capped by a multiple of the cores: more is never
    useful and a typo such as 1000 would otherwise spawn a thousand threads per session."""

    max_batch_size: int
    max_batch_timeout_s: float = 1.0
    max_concurrency: int = 16
    max_threads: int = 4 * (os.cpu_count() or 1)


KNOB_NAMES = (
    "max_batch_size",
    "batch_timeout_ms",
    "concurrency",
    "intra_op_threads",
    "inter_op_threads",
)


def apply_changes(current: Knobs, changes: Mapping[str, Any], limits: KnobLimits) -> Knobs:
    """Validate ``changes`` (wire names, timeout in ms) and return the new knobs."""
    unknown = sorted(set(changes) - set(KNOB_NAMES))
    if unknown:
        raise BadRequest(f"unknown knob(s) {unknown}; known: {list(KNOB_NAMES)}")
    updates: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "batch_timeout_ms":
            timeout_ms = _number(name, value)
            if not 0.0 <= timeout_ms <= limits.max_batch_timeout_s * 1000.0:
                raise BadRequest(
                    f"batch_timeout_ms must be in [0, {limits.max_batch_timeout_s * 1000.0:g}]"
                )
            updates["batch_timeout_s"] = timeout_ms / 1000.0
            continue
        upper = {
            "max_batch_size": limits.max_batch_size,
            "concurrency": limits.max_concurrency,
            "intra_op_threads": limits.max_threads,
            "inter_op_threads": limits.max_threads,
        }[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
            raise BadRequest(f"{name} must be an integer in [1, {upper}], got {value!r}")
        updates[name] = value
    return replace(current, **updates)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number, got {value!r}")
    return float(value)
