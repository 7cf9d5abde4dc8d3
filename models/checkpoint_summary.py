"""A checkpoint summarized tensor by tensor (``iotgw inspect``): kind, shape, bits, blocks,
sizes, and each tensor's checksum and qwZ checks, a damaged tensor reported in its row."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from models.checkpoint import (
    CheckpointError,
    Entry,
    FloatEntry,
    QuantizedEntry,
    RawHeader,
    decode_quantized,
    read_header,
    read_metadata,
    verified,
)


@dataclass(frozen=True, slots=True)
class TensorSummary:
    name: str
    kind: str  # "quantized", "float" or "bytes"
    shape: tuple[int, ...]
    dtype: str
    bits: int | None
    block_size: int | None
    blocks: int | None
    stored_bytes: int
    float32_bytes: int  # what the tensor takes as float32 (0 for bytes tensors)
    checksum: str  # "ok", or what is wrong with it


@dataclass(frozen=True, slots=True)
class CheckpointSummary:
    path: Path
    format_version: int
    architecture: Mapping[str, Any]
    tensors: tuple[TensorSummary, ...]
    file_bytes: int

    @property
    def ok(self) -> bool:
        return all(t.checksum == "ok" for t in self.tensors)


def summarize(path: Path) -> CheckpointSummary:
    """Per-tensor summary with each tensor's checksum and qwZ checks run; a damaged tensor is
    reported in its row rather than stopping the summary (header problems still raise)."""
    path = Path(path)
    header = read_header(path)
    meta = read_metadata(path, header)
    rows = []
    with safe_open(str(path), framework="np") as fh:
        for name, entry in meta.tensors.items():
            status = "ok"
            try:
                if isinstance(entry, QuantizedEntry):
                    codes = verified(path, fh, name, entry.codes.name, entry.codes.sha256)
                    scales = verified(path, fh, name, entry.scales.name, entry.scales.sha256)
                    decode_quantized(path, name, entry, codes, scales)
                else:
                    verified(path, fh, name, name, entry.sha256)
            except CheckpointError as exc:
                status = exc.problem
            rows.append(_summary_row(name, entry, header, status))
    rows.sort(key=lambda row: _natural(row.name))
    return CheckpointSummary(
        path, meta.format_version, meta.architecture, tuple(rows), path.stat().st_size
    )


def _natural(name: str) -> list[tuple[int, int | str]]:
    """Sort key putting ``layers.2`` before ``layers.11``."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)]


def _summary_row(name: str, entry: Entry, header: RawHeader, status: str) -> TensorSummary:
    if isinstance(entry, QuantizedEntry):
        stored = header.stored[entry.codes.name], header.stored[entry.scales.name]
        blocks = header.stored[entry.scales.name].shape
        return TensorSummary(
            name,
            "quantized",
            tuple(entry.shape),
            entry.dtype,
            entry.bits,
            entry.block_size,
            math.prod(blocks),
            sum(s.end - s.begin for s in stored),
            math.prod(entry.shape) * 4,
            status,
        )
    if isinstance(entry, FloatEntry):
        s = header.stored[name]
        return TensorSummary(
            name,
            "float",
            tuple(entry.shape),
            entry.dtype,
            None,
            None,
            None,
            s.end - s.begin,
            math.prod(entry.shape) * 4,
            status,
        )
    return TensorSummary(
        name, "bytes", (entry.size,), "uint8", None, None, None, entry.size, 0, status
    )
