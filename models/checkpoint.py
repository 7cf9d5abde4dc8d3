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

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from models.checkpoint_format import (
    CODES_SUFFIX,
    FLOAT_DTYPES,
    FORMAT,
    FORMAT_VERSION,
    METADATA_KEY,
    SCALES_SUFFIX,
    CheckpointError,
    FloatEntry,
    Metadata,
    QuantizedEntry,
    content_hash,
    read_header,
    read_metadata,
    sha256_of,
)
from models.quant import BlockQuantized, QuantizationError, pack_codes, unpack_codes

__all__ = [
    "METADATA_KEY",
    "Checkpoint",
    "CheckpointError",
    "QuantizedTensor",
    "Tensor",
    "content_hash",
    "decode_quantized",
    "first_non_qwz_block",
    "load_checkpoint",
    "save_checkpoint",
    "sha256_of",
    "verified",
]


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
