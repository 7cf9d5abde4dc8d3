"""The checkpoint file's format: its constants, the metadata document (a strict pydantic model),
and reading the safetensors header and metadata with every check that needs no tensor data: the
header against the file's size (a truncated file names the first tensor it cuts), the metadata's
own checksum, and the stored tensors' dtypes and shapes against what the metadata implies.

``models.checkpoint`` builds on this to write and load whole checkpoints; ``CheckpointError`` is
defined here so that both (and ``models.checkpoint_summary``) raise the same error.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.quant import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, packed_size
from models.runtime import ModelLoadError

FORMAT = "iotgw.qwz-checkpoint"
FORMAT_VERSION = 1
METADATA_KEY = "iotgw.checkpoint"
CODES_SUFFIX = ".codes"
SCALES_SUFFIX = ".scales"
# safetensors' own limit on the JSON header; a larger claimed length is a corrupt file.
MAX_HEADER_BYTES = 100_000_000
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
# The architecture kinds a checkpoint can hold (``architecture["kind"]``).
ZOO_KIND = "zoo"  # a ModelSpec of the zoo, rebuilt for either runtime
ONNX_KIND = "onnx"  # an imported ONNX graph, which only ONNX Runtime serves
_SAFETENSORS_DTYPE = {
    "U8": "uint8",
    "I8": "int8",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
}
_ITEMSIZE = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


class CheckpointError(ModelLoadError):
    """A checkpoint that cannot be used; names the file, the tensor (when one is at fault) and
    the problem."""

    def __init__(self, path: Path | str, problem: str, tensor: str | None = None) -> None:
        self.path = Path(path)
        self.tensor = tensor
        self.problem = problem
        where = f"checkpoint {self.path}" + (f": tensor {tensor!r}" if tensor else "")
        super().__init__(f"{where}: {problem}")


# -- the metadata document --------------------------------------------------------------------

_Sha = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
_Dim = Annotated[int, Field(ge=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StoredRef(_Strict):
    name: str
    sha256: _Sha


class QuantizedEntry(_Strict):
    kind: Literal["quantized"]
    shape: tuple[_Dim, ...] = Field(min_length=2)
    dtype: Literal["float32", "float16", "bfloat16", "float64"]
    bits: Literal[2, 3, 4, 6, 8]
    block_size: int = Field(ge=MIN_BLOCK_SIZE, le=MAX_BLOCK_SIZE)
    codes: StoredRef
    scales: StoredRef


class FloatEntry(_Strict):
    kind: Literal["float"]
    shape: tuple[Annotated[int, Field(ge=0)], ...]
    dtype: Literal["float32", "float16", "bfloat16", "float64"]
    sha256: _Sha


class BytesEntry(_Strict):
    kind: Literal["bytes"]
    size: int = Field(ge=0)
    sha256: _Sha


Entry = Annotated[QuantizedEntry | FloatEntry | BytesEntry, Field(discriminator="kind")]


class Metadata(_Strict):
    format: Literal["iotgw.qwz-checkpoint"]
    format_version: int = Field(ge=1)
    architecture: dict[str, Any]
    tensors: dict[str, Entry]
    content_sha256: _Sha


def content_hash(architecture: Mapping[str, Any], tensors: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the architecture and tensor entries."""
    doc = {"architecture": architecture, "tensors": tensors}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def sha256_of(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data).hexdigest()


# -- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor of the safetensors header."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class RawHeader:
    stored: dict[str, StoredTensor]
    metadata: dict[str, str]
    data_bytes: int


def read_header(path: Path) -> RawHeader:
    """The safetensors header, checked against the file's size, tensor by tensor, so that a
    truncated file names the first tensor it cut."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise CheckpointError(path, f"truncated: {size} bytes, not even a header length")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointError(path, f"corrupt: header length {header_len} is implausible")
            raw = fh.read(header_len)
    except FileNotFoundError as exc:
        raise CheckpointError(path, "file does not exist") from exc
    except IsADirectoryError as exc:
        raise CheckpointError(path, "is a directory, not a checkpoint file") from exc
    if len(raw) < header_len:
        raise CheckpointError(
            path, f"truncated: the header needs {header_len} bytes, the file has {len(raw)}"
        )
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(path, f"corrupt: the header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(path, "corrupt: the header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(path, "corrupt: __metadata__ is not a string-to-string map")
    data_bytes = size - 8 - header_len
    stored: dict[str, StoredTensor] = {}
    for name, info in header.items():
        stored[name] = _stored_tensor(path, name, info, data_bytes)
    return RawHeader(stored, metadata, data_bytes)


def _stored_tensor(path: Path, name: str, info: Any, data_bytes: int) -> StoredTensor:
    try:
        dtype = _SAFETENSORS_DTYPE[info["dtype"]]
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(o) for o in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(path, f"corrupt header entry {info!r}", name) from exc
    if any(d < 0 for d in shape) or not 0 <= begin <= end:
        raise CheckpointError(path, f"corrupt header entry {info!r}", name)
    if end > data_bytes:
        raise CheckpointError(
            path,
            f"truncated: its data is bytes {begin}..{end} but the file holds {data_bytes}",
            name,
        )
    if end - begin != math.prod(shape) * _ITEMSIZE[dtype]:
        raise CheckpointError(
            path, f"corrupt: {end - begin} bytes cannot hold {dtype} of shape {shape}", name
        )
    return StoredTensor(dtype, shape, begin, end)


def read_metadata(path: Path, header: RawHeader) -> Metadata:
    text = header.metadata.get(METADATA_KEY)
    if text is None:
        raise CheckpointError(
            path,
            f"not an iotgw checkpoint: no {METADATA_KEY!r} metadata (a plain safetensors "
            "state dict? import it with `iotgw quantize safetensors`)",
        )
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(path, f"corrupt metadata: not JSON ({exc})") from exc
    version = doc.get("format_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise CheckpointError(
            path, f"format version {version} is newer than this iotgw reads ({FORMAT_VERSION})"
        )
    try:
        meta = Metadata.model_validate(doc)
    except ValidationError as exc:
        raise CheckpointError(path, f"invalid metadata: {_messages(exc)}") from exc
    actual = content_hash(meta.architecture, doc["tensors"])
    if actual != meta.content_sha256:
        raise CheckpointError(
            path,
            "metadata was altered: its content_sha256 does not match the architecture and "
            "tensor entries",
        )
    _check_layout(path, meta, header)
    return meta


def _messages(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


def _expected_stored(entry: Entry) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Stored tensor name -> (dtype, shape) that an entry implies."""
    match entry:
        case QuantizedEntry():
            rows, row_len = entry.shape[0], math.prod(entry.shape[1:])
            blocks = math.ceil(row_len / entry.block_size)
            count = rows * row_len
            return {
                entry.codes.name: ("uint8", (packed_size(count, entry.bits),)),
                entry.scales.name: ("float32", (rows, blocks)),
            }
    raise AssertionError("only quantized entries have derived stored tensors")


def _check_layout(path: Path, meta: Metadata, header: RawHeader) -> None:
    """The header's tensors are exactly those the metadata describes, with the dtypes and
    shapes it implies."""
    described: set[str] = set()
    for name, entry in meta.tensors.items():
        if isinstance(entry, QuantizedEntry):
            expected = _expected_stored(entry)
        elif isinstance(entry, FloatEntry):
            expected = {name: (entry.dtype, entry.shape)}
        else:
            expected = {name: ("uint8", (entry.size,))}
        for stored_name, (dtype, shape) in expected.items():
            if stored_name in described:
                raise CheckpointError(
                    path, "inconsistent: stored twice in the metadata", stored_name
                )
            described.add(stored_name)
            found = header.stored.get(stored_name)
            if found is None:
                raise CheckpointError(path, f"missing: the metadata lists {stored_name!r}", name)
            if (found.dtype, found.shape) != (dtype, tuple(shape)):
                raise CheckpointError(
                    path,
                    f"inconsistent: {stored_name!r} is {found.dtype} {list(found.shape)}, the "
                    f"metadata implies {dtype} {list(shape)}",
                    name,
                )
    extra = sorted(set(header.stored) - described)
    if extra:
        raise CheckpointError(path, "not described by the metadata", extra[0])
