"""The five parallelism knobs of one served model version: the one type every package uses.

A model's ``config.toml`` ``[batching]`` table, the gateway's live setting, the admin API's
body and the tuner's configurations are all ``Knobs``, in milliseconds as on the wire. The
bounds a file may hold are in the field annotations (pydantic reads them when it validates a
``config.toml``); the tighter bounds that hold on this machine at run time are ``KnobLimits``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict, Field

KNOB_NAMES = (
    "max_batch_size",
    "batch_timeout_ms",
    "concurrency",
    "intra_op_threads",
    "inter_op_threads",
)


class InvalidKnobs(ValueError):
    """A knob change names an unknown knob or holds a value outside its limits. The gateway
    answers it as a bad request."""


@dataclass(frozen=True, slots=True, order=True)
class Knobs:
    """One setting of the five knobs (the timeout in milliseconds). Ordered field by field, so
    a set of them sorts the same way in every run."""

    # pydantic validates the [batching] table of a config.toml into this type: no other keys.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid")

    max_batch_size: Annotated[int, Field(ge=1, description="Most rows in one batch.")] = 8
    batch_timeout_ms: Annotated[
        float, Field(ge=0.0, le=10_000.0, description="Longest wait for a batch to fill.")
    ] = 1.0
    concurrency: Annotated[
        int, Field(ge=1, le=64, description="Batches in flight (runtime instances).")
    ] = 1
    intra_op_threads: Annotated[
        int, Field(ge=1, le=256, description="Threads inside one operator.")
    ] = 1
    inter_op_threads: Annotated[
        int, Field(ge=1, le=256, description="Operators run in parallel.")
    ] = 1

    @property
    def batch_timeout_s(self) -> float:
        """The timeout in seconds, as the batcher's clock (``time.monotonic``) counts."""
        return self.batch_timeout_ms / 1000.0

    @property
    def threads_per_instance(self) -> int:
        return self.intra_op_threads + self.inter_op_threads

    def as_dict(self) -> dict[str, float | int]:
        """The knobs by wire name: the admin API's body, the metrics' labels."""
        return {name: getattr(self, name) for name in KNOB_NAMES}

    def as_tuple(self) -> tuple[int, float, int, int, int]:
        return (
            self.max_batch_size,
            self.batch_timeout_ms,
            self.concurrency,
            self.intra_op_threads,
            self.inter_op_threads,
        )

    def with_changes(self, changes: Mapping[str, Any]) -> Knobs:
        """These knobs with ``changes`` (wire names) applied, each checked for its type; the
        machine's limits are ``KnobLimits.check``'s."""
        unknown = sorted(set(changes) - set(KNOB_NAMES))
        if unknown:
            raise InvalidKnobs(f"unknown knob(s) {unknown}; known: {list(KNOB_NAMES)}")
        updates: dict[str, Any] = {}
        for name, value in changes.items():
            if name == "batch_timeout_ms":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InvalidKnobs(f"{name} must be a number, got {value!r}")
                updates[name] = float(value)
            elif isinstance(value, bool) or not isinstance(value, int):
                raise InvalidKnobs(f"{name} must be an integer, got {value!r}")
            else:
                updates[name] = value
        return dataclasses.replace(self, **updates)

    def __str__(self) -> str:
        return (
            f"batch={self.max_batch_size} timeout={self.batch_timeout_ms:g}ms "
            f"conc={self.concurrency} intra={self.intra_op_threads} inter={self.inter_op_threads}"
        )


@dataclass(frozen=True, slots=True)
class KnobLimits:
    """Largest values accepted at run time. Threads are capped by a multiple of the cores: more
    is never useful and a typo such as 1000 would otherwise spawn a thousand threads per
    session."""

    max_batch_size: int
    max_batch_timeout_ms: float = 1000.0
    max_concurrency: int = 16
    max_threads: int = 4 * (os.cpu_count() or 1)

    def check(self, knobs: Knobs) -> Knobs:
        """``knobs`` when every one is within these limits, else ``InvalidKnobs`` naming it."""
        if not 0.0 <= knobs.batch_timeout_ms <= self.max_batch_timeout_ms:
            raise InvalidKnobs(f"batch_timeout_ms must be in [0, {self.max_batch_timeout_ms:g}]")
        uppers = {
            "max_batch_size": self.max_batch_size,
            "concurrency": self.max_concurrency,
            "intra_op_threads": self.max_threads,
            "inter_op_threads": self.max_threads,
        }
        for name, upper in uppers.items():
            value = getattr(knobs, name)
            if not 1 <= value <= upper:
                raise InvalidKnobs(f"{name} must be an integer in [1, {upper}], got {value!r}")
        return knobs
