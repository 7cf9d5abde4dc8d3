"""Model architectures as data, their deterministic weights and a NumPy reference forward.

A ``ModelSpec`` is a plain description (inputs, a stack of layers, a softmax output) that the
ONNX exporter (``models.export_onnx``), the SavedModel exporter (``models.export_tf``) and
``reference_forward`` all interpret the same way, so the two backends can be checked against one
independent implementation. Images are NHWC everywhere at the model boundary; convolution kernels
are stored HWIO (TensorFlow's layout) and each exporter converts as its runtime needs.

Several inputs are allowed only as feature vectors: they are concatenated along the last axis, in
declaration order, before the first layer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

Activation = Literal["linear", "relu"]
Padding = Literal["same", "valid"]
Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Input:
    """A float32 input; ``shape`` is one example's shape (the batch dimension is implicit)."""

    name: str
    shape: Shape


@dataclass(frozen=True, slots=True)
class Dense:
    units: int
    activation: Activation = "linear"


@dataclass(frozen=True, slots=True)
class Conv2D:
    filters: int
    kernel: int
    stride: int = 1
    padding: Padding = "same"
    activation: Activation = "relu"


@dataclass(frozen=True, slots=True)
class MaxPool2D:
    """Valid (unpadded) max pooling; ``stride`` defaults to ``pool``."""

    pool: int = 2
    stride: int | None = None

    @property
    def step(self) -> int:
        return self.pool if self.stride is None else self.stride


@dataclass(frozen=True, slots=True)
class Flatten:
    """NHWC feature map to a vector, in row-major HWC order."""


Layer = Dense | Conv2D | MaxPool2D | Flatten


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    inputs: tuple[Input, ...]
    layers: tuple[Layer, ...]
    output: str = "probabilities"
    softmax: bool = True
    seed: int = 0
    description: str = ""

    def __post_init__(self) -> None:
        # Fail at definition time, not inside an exporter, when shapes do not chain.
        layer_shapes(self)

    @property
    def output_shape(self) -> Shape:
        return layer_shapes(self)[-1]


@dataclass(frozen=True, slots=True)
class Params:
    """One layer's parameters: Dense kernel [in, out] or Conv2D kernel HWIO, and a bias."""

    kernel: np.ndarray
    bias: np.ndarray


Weights = tuple[Params | None, ...]  # one entry per layer; None for parameter-free layers


def same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """TensorFlow's "SAME" padding of one spatial axis: (before, after), the odd pixel after."""
    out = math.ceil(size / stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def input_shape(spec: ModelSpec) -> Shape:
    """Shape entering the first layer (inputs concatenated when there are several)."""
    if not spec.inputs:
        raise ValueError(f"{spec.name}: a model needs at least one input")
    if len(spec.inputs) == 1:
        return spec.inputs[0].shape
    if any(len(i.shape) != 1 for i in spec.inputs):
        raise ValueError(f"{spec.name}: several inputs must all be feature vectors")
    return (sum(i.shape[0] for i in spec.inputs),)


def layer_shapes(spec: ModelSpec) -> list[Shape]:
    """Per-example output shape of every layer, in order."""
    shape = input_shape(spec)
    shapes: list[Shape] = []
    for index, layer in enumerate(spec.layers):
        shape = _next_shape(shape, layer, f"{spec.name} layer {index} ({layer})")
        shapes.append(shape)
    if not shapes or len(shapes[-1]) != 1:
        raise ValueError(f"{spec.name}: the last layer must produce a vector")
    return shapes


def _next_shape(shape: Shape, layer: Layer, where: str) -> Shape:
    match layer:
        case Dense(units=units):
            if len(shape) != 1:
                raise ValueError(f"{where}: Dense needs a vector input, got {shape}")
            return (units,)
        case Conv2D(filters=filters, kernel=k, stride=s, padding=padding):
            h, w = _spatial(shape, where)
            if padding == "same":
                return (math.ceil(h / s), math.ceil(w / s), filters)
            if h < k or w < k:
                raise ValueError(f"{where}: kernel {k} larger than input {shape}")
            return ((h - k) // s + 1, (w - k) // s + 1, filters)
        case MaxPool2D(pool=p):
            h, w = _spatial(shape, where)
            if h < p or w < p:
                raise ValueError(f"{where}: pool {p} larger than input {shape}")
            return ((h - p) // layer.step + 1, (w - p) // layer.step + 1, shape[2])
        case Flatten():
            return (math.prod(shape),)
    raise TypeError(f"{where}: unknown layer type")


def _spatial(shape: Shape, where: str) -> tuple[int, int]:
    if len(shape) != 3:
        raise ValueError(f"{where}: needs an HWC input, got {shape}")
    return shape[0], shape[1]


def init_weights(spec: ModelSpec) -> Weights:
    """He-normal kernels and small normal biases, fully determined by ``spec.seed``.

    Biases are random rather than zero so that a backend dropping them would be caught by the
    comparison with the reference forward.
    """
    rng = np.random.default_rng(spec.seed)
    params: list[Params | None] = []
    shape = input_shape(spec)
    for layer, out_shape in zip(spec.layers, layer_shapes(spec), strict=True):
        match layer:
            case Dense(units=units):
                kshape: Shape = (shape[0], units)
                fan_in = shape[0]
            case Conv2D(filters=filters, kernel=k):
                kshape = (k, k, shape[2], filters)
                fan_in = k * k * shape[2]
            case _:
                params.append(None)
                shape = out_shape
                continue
        kernel = rng.normal(0.0, math.sqrt(2.0 / fan_in), kshape).astype(np.float32)
        bias = rng.normal(0.0, 0.05, kshape[-1]).astype(np.float32)
        params.append(Params(kernel, bias))
        shape = out_shape
    return tuple(params)


def reference_forward(
    spec: ModelSpec, weights: Weights, inputs: Mapping[str, np.ndarray]
) -> np.ndarray:
    """The model's output for a batch, computed in float64 with plain NumPy."""
    arrays = []
    for inp in spec.inputs:
        x = np.asarray(inputs[inp.name], dtype=np.float64)
        if x.shape[1:] != inp.shape:
            raise ValueError(f"input {inp.name}: expected [N, {inp.shape}], got {x.shape}")
        arrays.append(x)
    x = arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-1)
    for layer, p in zip(spec.layers, weights, strict=True):
        x = _apply(layer, p, x)
    if spec.softmax:
        z = np.exp(x - x.max(axis=-1, keepdims=True))
        x = z / z.sum(axis=-1, keepdims=True)
    return x


def _apply(layer: Layer, p: Params | None, x: np.ndarray) -> np.ndarray:
    match layer:
        case Dense():
            assert p is not None
            return _activate(x @ p.kernel.astype(np.float64) + p.bias, layer.activation)
        case Conv2D(kernel=k, stride=s, padding=padding):
            assert p is not None
            if padding == "same":
                top, bottom = same_pads(x.shape[1], k, s)
                left, right = same_pads(x.shape[2], k, s)
                x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
            # windows: [N, H', W', C, k, k], then contract (C, kh, kw) with the HWIO kernel
            windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))
            windows = windows[:, ::s, ::s]
            y = np.tensordot(windows, p.kernel.astype(np.float64), axes=([3, 4, 5], [2, 0, 1]))
            return _activate(y + p.bias, layer.activation)
        case MaxPool2D(pool=pool):
            windows = np.lib.stride_tricks.sliding_window_view(x, (pool, pool), axis=(1, 2))
            return windows[:, :: layer.step, :: layer.step].max(axis=(-2, -1))
        case Flatten():
            return x.reshape(x.shape[0], -1)
    raise TypeError(f"unknown layer {layer!r}")


def _activate(x: np.ndarray, activation: Activation) -> np.ndarray:
    return np.maximum(x, 0.0) if activation == "relu" else x


# --- bundled demo architectures -------------------------------------------------------------

SENSOR_MLP = ModelSpec(
    name="sensor_mlp",
    inputs=(Input("features", (32,)),),
    layers=(Dense(64, "relu"), Dense(64, "relu"), Dense(8)),
    seed=1,
    description="Sensor-window classifier: 32 features to 8 classes.",
)

# Sized so that one batch-1 ONNX Runtime call on one intra-op thread costs a few milliseconds on a
# small edge CPU: enough work for batching and operator-level threads to matter, small enough to
# serve hundreds of requests per second.
VISION_CNN = ModelSpec(
    name="vision_cnn",
    inputs=(Input("image", (32, 32, 3)),),
    layers=(
        Conv2D(32, 3),
        Conv2D(64, 3),
        Conv2D(64, 3),
        MaxPool2D(2),
        Conv2D(128, 3),
        Conv2D(128, 3),
        MaxPool2D(2),
        Conv2D(256, 3),
        Conv2D(256, 3),
        MaxPool2D(2),
        Flatten(),
        Dense(128, "relu"),
        Dense(10),
    ),
    seed=2,
    description="Tiny-image classifier: 32x32 RGB to 10 classes.",
)

SENSOR_FUSION = ModelSpec(
    name="sensor_fusion",
    inputs=(Input("accel", (3,)), Input("temperature", (1,))),
    layers=(Dense(16, "relu"), Dense(4)),
    seed=3,
    description="Accelerometer and temperature fused into 4 machine states (multi-input demo).",
)

DEMO_SPECS: tuple[ModelSpec, ...] = (SENSOR_MLP, VISION_CNN, SENSOR_FUSION)
