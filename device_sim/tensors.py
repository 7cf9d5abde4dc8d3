"""What a model expects as input, and input tensors that fit it.

Model metadata has the shape of the Open Inference Protocol's ``GET /v2/models/{m}`` answer
(``{"name", "inputs": [{"name", "datatype", "shape"}]}``, -1 for a variable dimension, the first
being the batch dimension). It comes from the gateway over HTTP, or, for MQTT-only setups, from a
JSON file holding one such object or a list of them. Inputs are either generated at random from the
metadata or read as rows of ``.npy`` files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from models.datatypes import OIP_DATATYPES

# The protocol's datatype names and their numpy dtypes.
DATATYPES = OIP_DATATYPES
_LABELS = {dt.name: label for label, dt in DATATYPES.items() if label != "BYTES"}


def datatype_of(arr: np.ndarray) -> str:
    if arr.dtype.kind in "OUS":
        return "BYTES"
    try:
        return _LABELS[arr.dtype.name]
    except KeyError:
        raise ValueError(f"no Open Inference Protocol datatype for numpy {arr.dtype}") from None


@dataclass(frozen=True, slots=True)
class InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1 for a variable dimension


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """A model as the devices see it: its name and the inputs its metadata lists."""

    name: str
    inputs: tuple[InputSpec, ...]


def parse_metadata(doc: Any, where: str) -> ModelInputs:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise ValueError(f"{where}: model metadata needs a string 'name'")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ValueError(f"{where}: model {doc['name']!r} needs a non-empty 'inputs' list")
    inputs = []
    for i, entry in enumerate(raw_inputs):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: inputs[{i}] must be an object")
        name, datatype, shape = entry.get("name"), entry.get("datatype"), entry.get("shape")
        if not isinstance(name, str) or datatype not in DATATYPES:
            raise ValueError(
                f"{where}: inputs[{i}] needs a 'name' and a 'datatype' in {sorted(DATATYPES)}"
            )
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= -1 for d in shape):
            raise ValueError(f"{where}: input {name!r}: 'shape' must be a list of ints >= -1")
        inputs.append(InputSpec(name, datatype, tuple(shape)))
    return ModelInputs(doc["name"], tuple(inputs))


def load_metadata_file(path: Path) -> dict[str, ModelInputs]:
    """Models described in a JSON file: one metadata object or a list of them."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: {exc}") from None
    docs = doc if isinstance(doc, list) else [doc]
    specs = [parse_metadata(d, str(path)) for d in docs]
    return {s.name: s for s in specs}


async def fetch_metadata(
    session: aiohttp.ClientSession, base_url: str, model: str, timeout_s: float = 10.0
) -> ModelInputs:
    """The model's metadata from a gateway's ``GET /v2/models/{model}``."""
    url = f"{base_url.rstrip('/')}/v2/models/{model}"
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise ValueError(f"GET {url} answered {resp.status}: {_error_text(body)}")
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"GET {url}: not JSON: {exc}") from None
    return parse_metadata(doc, url)


def _error_text(body: bytes) -> str:
    """What a refusal says: the gateway's ``{"error": ...}`` message, else the body as text
    (never a bytes literal)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return str(doc["error"])
    text = body[:200].decode("utf-8", errors="replace").strip()
    return text or "(empty body)"


def concrete_shape(shape: tuple[int, ...], batch: int) -> tuple[int, ...]:
    """The metadata shape with the batch dimension set to ``batch`` and any other variable
    dimension to 1 (the smallest legal value, so generated payloads are never oversized)."""
    return tuple(
        batch if (i == 0 and d == -1) else (1 if d == -1 else d) for i, d in enumerate(shape)
    )


def random_tensor(spec: InputSpec, rng: np.random.Generator, batch: int) -> np.ndarray:
    """A tensor of the input's datatype and shape with plausible values (standard normal for
    floats, small non-negative integers, random booleans, short ASCII strings for BYTES)."""
    shape = concrete_shape(spec.shape, batch)
    dtype = DATATYPES[spec.datatype]
    if spec.datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if spec.datatype == "BYTES":
        flat = [f"s{v}" for v in rng.integers(0, 10_000, math.prod(shape))]
        return np.array(flat, dtype=object).reshape(shape)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 10, shape).astype(dtype)


def random_inputs(spec: ModelInputs, rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    return {i.name: random_tensor(i, rng, batch) for i in spec.inputs}


@dataclass(frozen=True, slots=True)
class DataFile:
    """``--data MODEL:INPUT=FILE.npy``: rows of the file (first axis) feed that input."""

    model: str
    input: str
    path: Path

    @classmethod
    def parse(cls, text: str) -> DataFile:
        target, sep, file = text.partition("=")
        model, colon, name = target.partition(":")
        if not (sep and colon and model and name and file):
            raise ValueError(f"--data wants MODEL:INPUT=FILE.npy, got {text!r}")
        return cls(model, name, Path(file))

    def load(self) -> np.ndarray:
        # allow_pickle=False: a data file must never be able to run code.
        arr = np.load(self.path, allow_pickle=False)
        if arr.ndim < 1 or arr.shape[0] == 0:
            raise ValueError(f"{self.path}: needs at least one row along the first axis")
        return arr


def inputs_from_rows(
    columns: dict[str, np.ndarray], start: int, batch: int
) -> dict[str, np.ndarray]:
    """``batch`` consecutive rows (wrapping around) of every input column, from row ``start``."""
    out = {}
    for name, arr in columns.items():
        idx = (start + np.arange(batch)) % arr.shape[0]
        out[name] = arr[idx]
    return out
