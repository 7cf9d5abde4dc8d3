"""The block-quantized checkpoint: one safetensors file, self-describing and checked on load.

Layout. Tensors are stored under their logical names, except quantized ones, which are two
stored tensors, ``<name>.codes`` (uint8, the packed codes of ``models.quant.pack_codes``, row
major) and ``<name>.scales`` (float32 ``[rows, blocks_per_row]``). A quantized weight is kept
output-major with blocks along its input dimension: rows are ``shape[0]`` and each row holds
``prod(shape[1:])`` codes (PyTorch's layout: ``Linear`` [out, in], ``Conv2d`` [O, I, kh, kw]).
Tensors that stay in float (biases, norms, anything the importer chose not to quantize) are
stored as they are; ``bytes`` tensors hold opaque data such as an ONNX graph.

The safetensors header's ``__metadata__["iotgw.checkpoint"]`` is a JSON document: the format
name and version, the architecture (``{"kind": "zoo", "spec": ...}`` for a ``ModelSpec`` that
both runtimes can rebuild, or ``{"kind": "onnx", ...}`` for an imported ONNX graph), and per
tensor its kind, original shape and dtype, bits and block size, and the SHA-256 of every stored
tensor's bytes; ``content_sha256`` covers that whole document (canonical JSON), so an edited
header is caught as well as edited data. (A checksum detects damage, not a determined forger.)

Loading parses JSON and raw little-endian arrays only: nothing is ever unpickled. Every
problem is a ``CheckpointError`` (a ``ModelLoadError``) naming the file, the tensor when there
is one, and what is wrong: truncation, bytes that do not match their checksum, a header that
contradicts the data, codes and scales that cannot come from the qwZ quantizer.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from models.quant import (
    MAX_BLOCK_SIZE,
    MIN_BLOCK_SIZE,
    BlockQuantized,
    QuantizationError,
    pack_codes,
    packed_size,
    unpack_codes,
)
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


@dataclass(frozen=True, slots=True, eq=False)
class QuantizedTensor:
    """A quantized weight: its logical ``shape`` and source ``dtype``, and the codes and
    scales as a ``[shape[0], prod(shape[1:])]`` matrix with blocks along the rows."""

    shape: tuple[int, ...]
    dtype: str
    data: BlockQuantized

    def __post_init__(self) -> None:
        if len(self.shape) < 2:
            raise QuantizationError(f"a quantized tensor needs two or more dims, got {self.shape}")
        want = (self.shape[0], math.prod(self.shape[1:]))
        if self.data.codes.shape != want:
            raise QuantizationError(f"codes of shape {self.data.codes.shape}, expected {want}")

    def dequantize(self) -> np.ndarray:
        """float32, the logical shape."""
        return self.data.dequantize().reshape(self.shape)


Tensor = QuantizedTensor | np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class Checkpoint:
    """What a checkpoint holds: the architecture document and the tensors by logical name
    (float tensors as numpy arrays, ``bytes`` tensors as uint8 arrays)."""

    architecture: Mapping[str, Any]
    tensors: Mapping[str, Tensor]
    byte_tensors: frozenset[str] = frozenset()


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


# -- writing ----------------------------------------------------------------------------------


def save_checkpoint(checkpoint: Checkpoint, path: Path) -> Path:
    """Write ``checkpoint`` to ``path`` atomically (a temporary file renamed into place)."""
    stored: dict[str, np.ndarray] = {}
    entries: dict[str, dict[str, Any]] = {}

    def put(stored_name: str, array: np.ndarray) -> str:
        if stored_name in stored:  # e.g. a float tensor literally named "w.codes" beside "w"
            raise QuantizationError(f"two stored tensors would be named {stored_name!r}")
        stored[stored_name] = array
        return sha256_of(array)

    for name, tensor in checkpoint.tensors.items():
        if isinstance(tensor, QuantizedTensor):
            data = tensor.data
            codes = pack_codes(data.codes, data.bits)
            scales = np.ascontiguousarray(data.scales, dtype=np.float32)
            entries[name] = {
                "kind": "quantized",
                "shape": list(tensor.shape),
                "dtype": tensor.dtype,
                "bits": data.bits,
                "block_size": data.block_size,
                "codes": {"name": name + CODES_SUFFIX, "sha256": put(name + CODES_SUFFIX, codes)},
                "scales": {
                    "name": name + SCALES_SUFFIX,
                    "sha256": put(name + SCALES_SUFFIX, scales),
                },
            }
        elif name in checkpoint.byte_tensors:
            blob = np.ascontiguousarray(tensor, dtype=np.uint8).reshape(-1)
            entries[name] = {"kind": "bytes", "size": int(blob.size), "sha256": put(name, blob)}
        else:
            array = np.ascontiguousarray(tensor)
            if array.dtype.name not in FLOAT_DTYPES:
                raise QuantizationError(f"tensor {name!r}: {array.dtype} is not a float dtype")
            entries[name] = {
                "kind": "float",
                "shape": list(array.shape),
                "dtype": array.dtype.name,
                "sha256": put(name, array),
            }
    architecture = dict(checkpoint.architecture)
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "architecture": architecture,
        "tensors": entries,
        "content_sha256": content_hash(architecture, entries),
    }
    Metadata.model_validate(document)  # what we write must read back
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(stored, str(tmp), metadata={METADATA_KEY: json.dumps(document, sort_keys=True)})
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


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


def load_checkpoint(path: Path) -> Checkpoint:
    """Read and verify a checkpoint: checksums, layout, and the qwZ invariants of every
    quantized tensor. Raises ``CheckpointError``."""
    path = Path(path)
    header = read_header(path)
    meta = read_metadata(path, header)
    tensors: dict[str, Tensor] = {}
    byte_tensors = set()
    try:
        with safe_open(str(path), framework="np") as fh:
            for name, entry in meta.tensors.items():
                if isinstance(entry, QuantizedEntry):
                    codes = verified(path, fh, name, entry.codes.name, entry.codes.sha256)
                    scales = verified(path, fh, name, entry.scales.name, entry.scales.sha256)
                    tensors[name] = decode_quantized(path, name, entry, codes, scales)
                elif isinstance(entry, FloatEntry):
                    tensors[name] = verified(path, fh, name, name, entry.sha256)
                else:
                    tensors[name] = verified(path, fh, name, name, entry.sha256)
                    byte_tensors.add(name)
    except SafetensorError as exc:  # our own header checks make this rare
        raise CheckpointError(path, f"not a valid safetensors file: {exc}") from exc
    return Checkpoint(meta.architecture, tensors, frozenset(byte_tensors))


def verified(path: Path, fh: Any, name: str, stored_name: str, sha256: str) -> np.ndarray:
    array: np.ndarray = fh.get_tensor(stored_name)
    if sha256_of(array) != sha256:
        what = "" if stored_name == name else f" ({stored_name})"
        raise CheckpointError(
            path, f"checksum mismatch{what}: the bytes were altered or damaged", name
        )
    return array


def decode_quantized(
    path: Path, name: str, entry: QuantizedEntry, packed: np.ndarray, scales: np.ndarray
) -> QuantizedTensor:
    """Unpack the codes and check what the qwZ quantizer guarantees of every block: a positive
    finite scale, and either a code at an end of the range (the block's absmax maps there) or
    all-zero codes with scale 1 (a zero block)."""
    rows, row_len = entry.shape[0], math.prod(entry.shape[1:])
    try:
        codes = unpack_codes(packed, entry.bits, rows * row_len).reshape(rows, row_len)
    except QuantizationError as exc:
        raise CheckpointError(path, f"corrupt codes: {exc}", name) from exc
    if not (np.isfinite(scales).all() and (scales > 0).all()):
        bad = int(np.flatnonzero(~(np.isfinite(scales) & (scales > 0)).reshape(-1))[0])
        raise CheckpointError(
            path,
            f"scale of block {bad} is {scales.reshape(-1)[bad]!r}, not a positive number",
            name,
        )
    data = BlockQuantized(
        codes, scales.astype(np.float32, copy=False), entry.bits, entry.block_size
    )
    bad_block = first_non_qwz_block(data)
    if bad_block is not None:
        raise CheckpointError(
            path,
            f"inconsistent: block {bad_block} has no code at -2^(b-1) or 2^(b-1)-1 and is not a "
            "zero block with scale 1, so codes and scales cannot come from the qwZ quantizer",
            name,
        )
    return QuantizedTensor(tuple(entry.shape), entry.dtype, data)


def first_non_qwz_block(data: BlockQuantized) -> int | None:
    """Index (row-major over all blocks) of the first block breaking the qwZ invariant."""
    half = 1 << (data.bits - 1)
    rows = data.codes.reshape(-1, data.row_length)
    n_rows, length, size = rows.shape[0], data.row_length, data.block_size
    blocks = data.blocks_per_row
    # Pad each row to whole blocks with zeros (they neither reach an end nor break "all zero").
    padded = np.zeros((n_rows, blocks * size), np.int8)
    padded[:, :length] = rows
    grouped = padded.reshape(n_rows, blocks, size)
    extreme = ((grouped == -half) | (grouped == half - 1)).any(axis=2)
    zero = ~grouped.any(axis=2) & (data.scales.reshape(n_rows, blocks) == 1.0)
    bad = np.flatnonzero(~(extreme | zero).reshape(-1))
    return int(bad[0]) if bad.size else None
