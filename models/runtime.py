"""The ``Runtime`` protocol: the whole contract between the gateway and a backend.

A runtime instance is one backend session with its operation-level threads fixed at creation.
It is used from one thread at a time (the gateway runs one batch per instance at once), so
backends need no locking of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from models.serving_plan import ServingPlan


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: name, numpy dtype name ("float32", "int64", "object" for strings),
    and shape with -1 for every variable dimension (the first one is the batch dimension)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    version: str
    platform: str  # "onnxruntime_onnx" or "tensorflow_savedmodel" (Triton's platform names)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    # How a checkpoint's quantized tensors run here (None for other models). Not part of the
    # model's interface: two runtimes serving the same model compare equal.
    serving_plan: ServingPlan | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Threads:
    """Operation-level parallelism of one session; fixed for the session's lifetime."""

    intra_op: int
    inter_op: int


class BackendError(Exception):
    """Root of backend errors (load or inference failures), with the model it concerns."""


class ModelLoadError(BackendError):
    """A model's files are missing, corrupt or inconsistent with its configuration."""


class InferenceFailed(BackendError):
    """The backend rejected or failed a batch."""


@runtime_checkable
class Runtime(Protocol):
    """A loaded model session. Create one with ``models.backends.load_runtime``."""

    @property
    def metadata(self) -> ModelMetadata: ...

    @property
    def threads(self) -> Threads: ...

    @property
    def device(self) -> str:
        """Where it computes, e.g. "cpu" or "cuda:0"."""
        ...

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; every input and output has the batch dimension first. Blocking."""
        ...

    def close(self) -> None:
        """Release the session. Idempotent."""
        ...
