"""What every importer shares: the choice of what to quantize, and the report of what it did."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass

from models.quant import QuantizationError, check_bits, check_block_size
from models.zoo import Conv2D, Dense, Flatten, Layer, MaxPool2D, ModelSpec


class ImportFailed(ValueError):
    """The source cannot be imported; the message says which tensor or layer and why."""


@dataclass(frozen=True, slots=True)
class QuantOptions:
    """How an importer quantizes the weights of fully connected and convolution layers.

    ``bits`` and ``block_size`` are qwZ's (blocks along each kernel's input dimension); a weight
    whose name matches a ``keep_float`` pattern (shell-style, e.g. ``"layers.0.*"``) or that has
    fewer than ``min_elements`` elements stays in float.
    """

    bits: int
    block_size: int = 128
    keep_float: tuple[str, ...] = ()
    min_elements: int = 0

    def __post_init__(self) -> None:
        try:
            check_bits(self.bits)
            check_block_size(self.block_size)
        except QuantizationError as exc:
            raise ImportFailed(str(exc)) from exc

    def float_reason(self, name: str, shape: tuple[int, ...]) -> str | None:
        """Why ``name`` stays in float, or None when it is to be quantized."""
        for pattern in self.keep_float:
            if fnmatch.fnmatchcase(name, pattern):
                return f"kept in float: matches --keep-float {pattern!r}"
        if math.prod(shape) < self.min_elements:
            return f"kept in float: fewer than {self.min_elements} elements"
        return None


@dataclass(frozen=True, slots=True)
class TensorDecision:
    name: str
    shape: tuple[int, ...]
    quantized: bool
    detail: str


@dataclass(frozen=True, slots=True)
class ImportReport:
    """Which tensors an import quantized and which it kept in float, and why."""

    source: str
    decisions: tuple[TensorDecision, ...]
    notes: tuple[str, ...] = ()
    architecture: tuple[str, ...] = ()
    """What the imported model computes, one line per layer and one for the output."""

    @property
    def quantized(self) -> tuple[TensorDecision, ...]:
        return tuple(d for d in self.decisions if d.quantized)

    @property
    def kept_float(self) -> tuple[TensorDecision, ...]:
        return tuple(d for d in self.decisions if not d.quantized)

    def format(self) -> str:
        lines = [f"imported {self.source}"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.architecture:
            lines.append("  architecture:")
            lines += [f"    {line}" for line in self.architecture]
        lines.append(f"  quantized ({len(self.quantized)}):")
        lines += [f"    {d.name} {list(d.shape)}: {d.detail}" for d in self.quantized]
        lines.append(f"  kept in float ({len(self.kept_float)}):")
        lines += [f"    {d.name} {list(d.shape)}: {d.detail}" for d in self.kept_float]
        return "\n".join(lines)


def quantized_detail(bits: int, block_size: int, shape: tuple[int, ...]) -> str:
    row = math.prod(shape[1:])
    blocks = math.ceil(row / block_size)
    return f"int{bits}, {shape[0]} rows x {blocks} block(s) of {block_size} along {row} inputs"


def _layer_text(layer: Layer) -> str:
    match layer:
        case Dense(units=units, activation=activation):
            return f"dense {units}, activation {activation}"
        case Conv2D(filters=f, kernel=k, stride=stride, padding=padding, activation=activation):
            return f"conv2d {f} {k}x{k} stride {stride} {padding}, activation {activation}"
        case MaxPool2D(pool=pool, step=step):
            return f"maxpool2d {pool} stride {step}"
        case Flatten():
            return "flatten"
    raise TypeError(f"unknown layer {layer!r}")


def architecture_lines(
    spec: ModelSpec, remarks: Mapping[int, str] | None = None
) -> tuple[str, ...]:
    """Each layer with its activation, then the output: whether a softmax ends the model.
    ``remarks`` adds a note to a layer's line (where its tensors came from, a default)."""
    remarks = remarks or {}
    lines = [
        f"layers[{i}] {_layer_text(layer)}{remarks.get(i, '')}"
        for i, layer in enumerate(spec.layers)
    ]
    if spec.softmax:
        lines.append(f"output {spec.output!r}: softmax appended (probabilities)")
    else:
        lines.append(f"output {spec.output!r}: no softmax (logits)")
    return tuple(lines)
