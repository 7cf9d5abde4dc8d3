"""Zoo models in checkpoints: tensor names, weight layouts, and per-layer parameters.

A zoo checkpoint's architecture is ``{"kind": "zoo", "spec": spec_to_doc(spec)}``; layer ``i``
with parameters stores ``layers.<i>.weight`` (output-major, PyTorch's layout: Dense
``[out, in]``, Conv2D ``[O, I, kh, kw]``), quantized or float, and ``layers.<i>.bias`` in float.
The zoo itself keeps kernels input-major (Dense ``[in, out]``, Conv2D HWIO); the two helpers
below convert, and a quantized kernel keeps the checkpoint layout, since its blocks run along
the input dimension of each output row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.checkpoint import ZOO_KIND, Checkpoint, CheckpointError, QuantizedTensor, Tensor
from models.quant import quantize_blocks
from models.spec_codec import SpecError, spec_from_doc, spec_to_doc
from models.zoo import Conv2D, Dense, Layer, ModelSpec, Params, Weights, input_shape, layer_shapes


@dataclass(frozen=True, slots=True)
class QuantParams:
    """A layer whose kernel is quantized (checkpoint layout) and whose bias is float32."""

    kernel: QuantizedTensor
    bias: np.ndarray


LayerParams = Params | QuantParams | None


def weight_name(index: int) -> str:
    return f"layers.{index}.weight"


def bias_name(index: int) -> str:
    return f"layers.{index}.bias"


def to_output_major(layer: Layer, kernel: np.ndarray) -> np.ndarray:
    """Zoo layout -> checkpoint layout."""
    if isinstance(layer, Dense):
        return np.ascontiguousarray(kernel.T)
    return np.ascontiguousarray(kernel.transpose(3, 2, 0, 1))  # HWIO -> OIHW


def to_input_major(layer: Layer, weight: np.ndarray) -> np.ndarray:
    """Checkpoint layout -> zoo layout."""
    if isinstance(layer, Dense):
        return np.ascontiguousarray(weight.T)
    return np.ascontiguousarray(weight.transpose(2, 3, 1, 0))  # OIHW -> HWIO


def kernel_shapes(spec: ModelSpec) -> list[tuple[int, ...] | None]:
    """Checkpoint-layout kernel shape of every layer (None for parameter-free layers)."""
    shapes: list[tuple[int, ...] | None] = []
    shape = input_shape(spec)
    for layer, out_shape in zip(spec.layers, layer_shapes(spec), strict=True):
        match layer:
            case Dense(units=units):
                shapes.append((units, shape[0]))
            case Conv2D(filters=filters, kernel=k):
                shapes.append((filters, shape[2], k, k))
            case _:
                shapes.append(None)
        shape = out_shape
    return shapes


# Which layers to quantize and how: (layer index, checkpoint-layout kernel) -> (bits, block)
# or None to keep the kernel in float.
QuantPolicy = Callable[[int, np.ndarray], tuple[int, int] | None]


def uniform_policy(bits: int | None, block_size: int) -> QuantPolicy:
    """Every kernel at ``bits`` (None: nothing quantized, a float checkpoint)."""
    return lambda _index, _kernel: None if bits is None else (bits, block_size)


def quantize_kernel(kernel: np.ndarray, bits: int, block_size: int) -> QuantizedTensor:
    """A checkpoint-layout kernel quantized in blocks along its flattened input dimension."""
    rows = kernel.reshape(kernel.shape[0], -1)
    return QuantizedTensor(
        tuple(kernel.shape), kernel.dtype.name, quantize_blocks(rows, bits, block_size)
    )


def zoo_checkpoint(spec: ModelSpec, weights: Weights, policy: QuantPolicy) -> Checkpoint:
    """A checkpoint of a zoo model with float weights, kernels quantized as ``policy`` says."""
    tensors: dict[str, Tensor] = {}
    for index, (layer, p) in enumerate(zip(spec.layers, weights, strict=True)):
        if p is None:
            continue
        kernel = to_output_major(layer, p.kernel)
        choice = policy(index, kernel)
        tensors[weight_name(index)] = kernel if choice is None else quantize_kernel(kernel, *choice)
        tensors[bias_name(index)] = np.ascontiguousarray(p.bias)
    return Checkpoint(architecture=zoo_architecture(spec), tensors=tensors)


def zoo_architecture(spec: ModelSpec) -> dict[str, Any]:
    return {"kind": ZOO_KIND, "spec": spec_to_doc(spec)}


def zoo_params(checkpoint: Checkpoint, path: Path) -> tuple[ModelSpec, list[LayerParams]]:
    """The spec and per-layer parameters of a zoo checkpoint; ``CheckpointError`` (naming the
    tensor) when the tensors do not fit the architecture."""
    arch = checkpoint.architecture
    if arch.get("kind") != ZOO_KIND:
        raise CheckpointError(path, f"architecture kind {arch.get('kind')!r} is not a zoo model")
    if set(arch) != {"kind", "spec"}:
        raise CheckpointError(path, f"zoo architecture has keys {sorted(arch)}, wants kind, spec")
    try:
        spec = spec_from_doc(arch["spec"])
    except SpecError as exc:
        raise CheckpointError(path, str(exc)) from exc
    params: list[LayerParams] = []
    expected: set[str] = set()
    for index, (layer, shape) in enumerate(zip(spec.layers, kernel_shapes(spec), strict=True)):
        if shape is None:
            params.append(None)
            continue
        kernel = _tensor(checkpoint, path, weight_name(index), shape)
        bias = _tensor(checkpoint, path, bias_name(index), (shape[0],))
        if isinstance(bias, QuantizedTensor):
            raise CheckpointError(path, "a bias must be stored in float", bias_name(index))
        bias32 = bias.astype(np.float32)
        if isinstance(kernel, QuantizedTensor):
            params.append(QuantParams(kernel, bias32))
        else:
            params.append(Params(to_input_major(layer, kernel.astype(np.float32)), bias32))
        expected |= {weight_name(index), bias_name(index)}
    extra = sorted(set(checkpoint.tensors) - expected)
    if extra:
        raise CheckpointError(path, f"not used by the {spec.name!r} architecture", extra[0])
    return spec, params


def _tensor(checkpoint: Checkpoint, path: Path, name: str, shape: tuple[int, ...]) -> Tensor:
    tensor = checkpoint.tensors.get(name)
    if tensor is None:
        raise CheckpointError(path, "missing: the architecture needs it", name)
    if name in checkpoint.byte_tensors:
        raise CheckpointError(path, "is a bytes tensor, the architecture needs a weight", name)
    if tuple(tensor.shape) != shape:
        raise CheckpointError(
            path, f"has shape {list(tensor.shape)}, the architecture needs {list(shape)}", name
        )
    return tensor


def dequantized_weights(spec: ModelSpec, params: Sequence[LayerParams]) -> Weights:
    """Float weights in zoo layout (quantized kernels dequantized, ``fp32(q * d)``): what a
    NumPy reference forward (``zoo.reference_forward``) computes with."""
    out: list[Params | None] = []
    for layer, p in zip(spec.layers, params, strict=True):
        out.append(dequantized_layer(layer, p) if isinstance(p, QuantParams) else p)
    return tuple(out)


def dequantized_layer(layer: Layer, p: QuantParams) -> Params:
    """A quantized layer's float parameters in zoo layout, ``fp32(q * d)`` exactly."""
    return Params(to_input_major(layer, p.kernel.dequantize()), p.bias)
