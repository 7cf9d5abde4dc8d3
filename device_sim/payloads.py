"""Request bodies per model, built once before a run and cycled through during it.

Encoding happens before the first request is sent so the run's timing measures the wire and the
server, not the simulator's serialization.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device_sim.tensors import DataFile, ModelInputs, inputs_from_rows, random_tensor
from device_sim.wire import RequestBody, body_from_payload, encode_request

# Distinct bodies kept per model: enough that a server cannot cache one answer, few enough that
# big models stay cheap in memory.
DEFAULT_POOL_SIZE = 16
# Data files are replayed row by row up to this many bodies, then wrap around.
MAX_DATA_BODIES = 4096


@dataclass(frozen=True, slots=True)
class Framing:
    binary: bool = False
    batch: int = 1
    timeout_us: int | None = None  # the request's "timeout" parameter (its deadline)


@dataclass(frozen=True, slots=True)
class PayloadPool:
    model: str
    bodies: tuple[RequestBody, ...]

    def body(self, seq: int) -> RequestBody:
        return self.bodies[seq % len(self.bodies)]


def build_pool(
    model: str,
    spec: ModelInputs | None,
    data: list[DataFile],
    framing: Framing,
    rng: np.random.Generator,
    size: int = DEFAULT_POOL_SIZE,
) -> PayloadPool:
    """Bodies for ``model``: rows of its data files for the inputs they cover, random tensors
    from the metadata for the others."""
    columns = {d.input: d.load() for d in data}
    if spec is None and not columns:
        raise ValueError(
            f"no inputs known for model {model!r}: give its metadata (--http-url of a gateway, "
            "or --metadata FILE) or its data (--data MODEL:INPUT=FILE.npy)"
        )
    generated = [] if spec is None else [i for i in spec.inputs if i.name not in columns]
    if spec is not None:
        unknown = set(columns) - {i.name for i in spec.inputs}
        if unknown:
            raise ValueError(f"model {model!r} has no input(s) {sorted(unknown)}")
    if columns:
        rows = min(a.shape[0] for a in columns.values())
        size = min(MAX_DATA_BODIES, max(1, -(-rows // framing.batch)))
    bodies = []
    for i in range(size):
        inputs = inputs_from_rows(columns, i * framing.batch, framing.batch)
        for spec_input in generated:
            inputs[spec_input.name] = random_tensor(spec_input, rng, framing.batch)
        if spec is not None:  # keep the model's input order, as a real client would send it
            inputs = {s.name: inputs[s.name] for s in spec.inputs}
        bodies.append(encode_request(inputs, binary=framing.binary, timeout_us=framing.timeout_us))
    return PayloadPool(model, tuple(bodies))


class RecordedPayloads:
    """Payload files a trace refers to, read once each (a recording dedupes them by content)."""

    def __init__(self, base_dir: Path) -> None:
        self._base = base_dir.resolve()
        self._bodies: dict[str, RequestBody] = {}

    def body(self, ref: str) -> RequestBody:
        cached = self._bodies.get(ref)
        if cached is None:
            path = (self._base / ref).resolve()
            # A trace is data: it may name files beside it, never elsewhere on the machine.
            if not path.is_relative_to(self._base):
                raise ValueError(f"payload {ref!r} points outside the trace's folder")
            cached = body_from_payload(path.read_bytes())
            self._bodies[ref] = cached
        return cached
