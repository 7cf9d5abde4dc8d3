"""What a request must be before it reaches a model's queue: its inputs' names, datatypes and
shapes those of the model's metadata, one batch dimension shared by every input and within the
model's limit, finite values where the model forbids others, and only outputs the model has.
Every adapter's request passes here (``InferenceService.infer``), so a request HTTP refuses is
refused on every transport, with the same message."""

from __future__ import annotations

import numpy as np

from gateway.codecs.datatypes import dtype_label
from gateway.errors import BadRequest
from gateway.types import InferenceRequest
from models.runtime import ModelMetadata


def validate_request(
    request: InferenceRequest, metadata: ModelMetadata, max_rows: int, allow_nonfinite: bool
) -> int:
    """Check names, dtypes, shapes and values against the model; returns the batch rows."""
    expected = {spec.name: spec for spec in metadata.inputs}
    given = request.inputs
    missing = [n for n in expected if n not in given]
    if missing:
        raise BadRequest(f"model {metadata.name}: missing input(s) {missing}")
    unexpected = [n for n in given if n not in expected]
    if unexpected:
        raise BadRequest(
            f"model {metadata.name}: unexpected input(s) {unexpected}; expected {list(expected)}"
        )
    rows: int | None = None
    for name, arr in given.items():
        spec = expected[name]
        if arr.dtype != np.dtype(spec.dtype):
            raise BadRequest(
                f"input {name!r}: datatype {dtype_label(arr.dtype)} does not match the model's "
                f"{dtype_label(np.dtype(spec.dtype))}"
            )
        if arr.ndim != len(spec.shape) or any(
            want != -1 and got != want for got, want in zip(arr.shape, spec.shape, strict=True)
        ):
            raise BadRequest(
                f"input {name!r}: shape {list(arr.shape)} does not match the model's "
                f"{list(spec.shape)}"
            )
        if rows is None:
            rows = arr.shape[0]
        elif arr.shape[0] != rows:
            raise BadRequest(
                f"inputs disagree on the batch dimension ({rows} vs {arr.shape[0]} for {name!r})"
            )
        if not allow_nonfinite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise BadRequest(f"input {name!r} contains NaN or infinity, which the model forbids")
    assert rows is not None
    if rows < 1:
        raise BadRequest("the batch dimension must be at least 1")
    if rows > max_rows:
        raise BadRequest(f"batch of {rows} rows exceeds the model's limit of {max_rows}")
    if request.outputs is not None:
        known = {spec.name for spec in metadata.outputs}
        unknown = [n for n in request.outputs if n not in known]
        if unknown:
            raise BadRequest(
                f"model {metadata.name}: unknown output(s) {unknown}; known: {sorted(known)}"
            )
    return rows
