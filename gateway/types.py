"""Transport-free request and response: what adapters translate wire formats to and from."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class InferenceRequest:
    model: str
    inputs: dict[str, np.ndarray]
    version: int | None = None  # None: the model's default (highest ready) version
    id: str | None = None
    outputs: list[str] | None = None  # None: every output
    timeout_s: float | None = None  # None: the model's SLO
    priority: int = 0  # 0: default level; 1 is the most urgent
    # The transport's recent estimate of how long a reply takes to leave it once handed over
    # (MQTT: publish to the broker's PUBACK): the deadline is met only if the answer is ready
    # this much sooner.
    delivery_s: float = 0.0


@dataclass(slots=True)
class InferenceResponse:
    model: str
    version: int
    outputs: dict[str, np.ndarray]
    id: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # queue_s, compute_s
