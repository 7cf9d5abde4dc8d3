"""TensorFlow Serving REST ``:predict`` bodies: row (``instances``) and columnar (``inputs``)
formats, ``{"b64": ...}`` values for string inputs, ``predictions`` / ``outputs`` replies."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import numpy as np

from gateway.codecs import json_codec
from gateway.codecs.limits import DEFAULT_LIMITS, DecodeLimits, load_json
from gateway.codecs.oip import convert_values
from gateway.errors import BadRequest
from gateway.types import InferenceRequest, InferenceResponse
from models.runtime import ModelMetadata, TensorSpec

SIGNATURE = "serving_default"


def decode_predict(
    body: bytes,
    metadata: ModelMetadata,
    *,
    model: str,
    version: int | None,
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> tuple[InferenceRequest, bool]:
    """Returns the request and whether it used the row format (``instances``)."""
    doc = load_json(body)
    if not isinstance(doc, dict):
        raise BadRequest("the request body must be a JSON object")
    signature = doc.get("signature_name", SIGNATURE)
    if signature != SIGNATURE:
        raise BadRequest(f"unknown signature_name {signature!r}; this model has {SIGNATURE!r}")
    has_rows, has_columns = "instances" in doc, "inputs" in doc
    if has_rows == has_columns:
        raise BadRequest("give exactly one of 'instances' (row format) or 'inputs' (columnar)")
    specs = {spec.name: spec for spec in metadata.inputs}
    columns = (
        _rows_to_columns(doc["instances"], specs) if has_rows else _columns(doc["inputs"], specs)
    )
    inputs: dict[str, np.ndarray] = {}
    elements = 0
    for name, value in columns.items():
        # Rows were gathered into a list: one more level than each row's own data.
        limits.check_data_depth(value if not has_rows else value[0], f"input {name!r}")
        inputs[name] = _to_array(value, specs[name])
        elements += inputs[name].size
        limits.check_elements(elements)
        if inputs[name].ndim > limits.max_dims:
            raise BadRequest(
                f"input {name!r}: {inputs[name].ndim} dimensions exceed the limit of "
                f"{limits.max_dims}"
            )
    return InferenceRequest(model=model, version=version, inputs=inputs), has_rows


def encode_predict(response: InferenceResponse, *, rows: bool) -> bytes:
    writer = json_codec.writer_for(response.outputs.values())
    outputs = {name: _json_value(arr, writer) for name, arr in response.outputs.items()}
    if rows:
        if len(outputs) == 1:
            (value,) = outputs.values()
            body: dict[str, Any] = {"predictions": value}
        else:
            count = len(next(iter(outputs.values())))
            body = {"predictions": [{n: v[i] for n, v in outputs.items()} for i in range(count)]}
    else:
        body = {"outputs": next(iter(outputs.values())) if len(outputs) == 1 else outputs}
    return writer.dumps(body)


def encode_error(message: str) -> bytes:
    return json_codec.dumps({"error": message})


def _rows_to_columns(instances: Any, specs: dict[str, TensorSpec]) -> dict[str, list[Any]]:
    if not isinstance(instances, list) or not instances:
        raise BadRequest("'instances' must be a non-empty list")
    named = [isinstance(row, dict) and "b64" not in row for row in instances]
    if all(named):
        columns: dict[str, list[Any]] = {}
        for i, row in enumerate(instances):
            if set(row) != set(specs):
                raise BadRequest(
                    f"instances[{i}] has inputs {sorted(row)}; the model takes {sorted(specs)}"
                )
            for name, value in row.items():
                columns.setdefault(name, []).append(value)
        return columns
    if any(named):
        raise BadRequest("'instances' mixes named (object) and unnamed rows")
    if len(specs) != 1:
        raise BadRequest(
            f"the model takes several inputs {sorted(specs)}: each instance must be an object"
        )
    (name,) = specs
    return {name: instances}


def _columns(inputs: Any, specs: dict[str, TensorSpec]) -> dict[str, Any]:
    if isinstance(inputs, dict) and "b64" not in inputs:
        if set(inputs) != set(specs):
            raise BadRequest(f"'inputs' has {sorted(inputs)}; the model takes {sorted(specs)}")
        return inputs
    if len(specs) != 1:
        raise BadRequest(
            f"the model takes several inputs {sorted(specs)}: 'inputs' must be an object"
        )
    (name,) = specs
    return {name: inputs}


def _to_array(value: Any, spec: TensorSpec) -> np.ndarray:
    what = f"input {spec.name!r}"
    dtype = np.dtype(spec.dtype)
    if dtype == np.dtype(object):
        return _strings(value, what)
    if _contains_b64(value):
        raise BadRequest(f"{what}: b64 values are only for string inputs, this one is {dtype}")
    try:
        values = np.asarray(value)
    except ValueError:
        raise BadRequest(f"{what}: ragged values (nested lists of unequal lengths)") from None
    return convert_values(values, dtype, what)


def _strings(value: Any, what: str) -> np.ndarray:
    def decode(item: Any) -> Any:
        if isinstance(item, list):
            return [decode(x) for x in item]
        if isinstance(item, dict) and set(item) == {"b64"} and isinstance(item["b64"], str):
            try:
                return base64.b64decode(item["b64"], validate=True)
            except binascii.Error:
                raise BadRequest(f"{what}: invalid base64") from None
        if isinstance(item, str):
            return item.encode()
        raise BadRequest(f'{what}: string inputs take strings or {{"b64": ...}} values')

    decoded = decode(value)
    shape = _shape_of(decoded, what)
    flat: list[Any] = []
    stack = [decoded]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    # Filled element by element so numpy keeps each bytes value whole.
    arr = np.empty(len(flat), dtype=object)
    arr[:] = flat
    return arr.reshape(shape)


def _shape_of(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    if not value:
        return (0,)
    inner = {_shape_of(v, what) for v in value}
    if len(inner) != 1:
        raise BadRequest(f"{what}: ragged values (nested lists of unequal lengths)")
    return (len(value), *inner.pop())


def _contains_b64(value: Any) -> bool:
    if isinstance(value, dict):
        return "b64" in value
    if isinstance(value, list) and value:
        return _contains_b64(value[0])
    return False


def _json_value(arr: np.ndarray, writer: json_codec.Writer) -> Any:
    if arr.dtype == np.dtype(object):
        return _b64_nested(arr.tolist())
    return writer.value(arr)


def _b64_nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_b64_nested(v) for v in value]
    return {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value
