"""A zoo checkpoint as a TensorFlow v1 graph whose variables hold the codes as int8.

Quantized kernels stay int8 codes (one per weight, each row padded with zero codes to whole
blocks) plus float32 scales in memory; the graph dequantizes them on every run: cast, reshape to
``[rows, blocks, block_size]``, multiply by the scales, drop the padding. Two things keep the
transient float copies small:

- variables are filled by feeding their values once at load (an initializer fed from a
  placeholder), never from constants in the graph: Grappler folds constant subgraphs, and
  dequantizing a constant would be folded into a float32 constant, i.e. fp32 weights again;
- a layer's dequantization waits (control dependency) for the layer's input, and a kernel is
  dequantized and applied in chunks of output rows (dense) or filters (convolution), each chunk
  waiting for the previous one's product. Otherwise the executor, seeing every dequantization
  ready at the start of a run, would materialise all float weights at once.

The chunk size trades the float transient (which TensorFlow's CPU allocator partly keeps
between runs) against graph size (every chunk is a few more ops, and ops are not cheap in a
session). Measured on a 25M-weight int4 MLP (fp32: 101 MB held): 53 MB held with chunks of 256K
elements, 34 MB with 1M (plus 8.6 MB at the peak of a run), against 25 MB of int8 codes.

Importing this module imports TensorFlow; ``models.backends.tf_backend`` imports it lazily.
"""

from __future__ import annotations

# tf_backend sets the environment TensorFlow reads at import (see export_tf).
from models.backends import tf_backend  # noqa: F401  isort: skip

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from models.export_tf import LayerFn, conv2d, dense, forward
from models.quant import BlockQuantized
from models.zoo import Conv2D, ModelSpec, Params
from models.zoo_checkpoint import LayerParams, QuantParams

# Largest float32 transient of one dequantized chunk of a kernel, in elements (4 MiB).
CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True, slots=True)
class CheckpointGraph:
    """What a session needs from the built graph."""

    inputs: dict[str, tf.Tensor]  # input name -> placeholder
    output: tf.Tensor
    init_op: tf.Operation
    init_feed: dict[tf.Tensor, np.ndarray]  # placeholder -> value, fed once to the init op


class _Variables:
    """Creates variables whose initial values are fed at init time, not stored in the graph."""

    def __init__(self) -> None:
        self.feed: dict[tf.Tensor, np.ndarray] = {}
        self.variables: list[tf.Variable] = []

    def __call__(self, name: str, value: np.ndarray) -> tf.Variable:
        value = np.ascontiguousarray(value)
        source = tf.compat.v1.placeholder(tf.as_dtype(value.dtype), value.shape, f"{name}_init")
        var = tf.Variable(source, trainable=False, name=name)
        self.feed[source] = value
        self.variables.append(var)
        return var


def build_graph(
    spec: ModelSpec, params: Sequence[LayerParams], chunk_elements: int = CHUNK_ELEMENTS
) -> CheckpointGraph:
    """Build the model in the current default graph (call under ``graph.as_default()``)."""
    variables = _Variables()
    inputs = {
        i.name: tf.compat.v1.placeholder(tf.float32, [None, *i.shape], name=i.name)
        for i in spec.inputs
    }
    fns: list[LayerFn | None] = []
    for index, (layer, p) in enumerate(zip(spec.layers, params, strict=True)):
        if p is None:
            fns.append(None)
            continue
        bias = variables(f"l{index}_bias", p.bias.astype(np.float32))
        if isinstance(p, Params):
            kernel = variables(f"l{index}_kernel", p.kernel.astype(np.float32))
            fns.append(
                conv2d(layer, kernel, bias) if isinstance(layer, Conv2D) else dense(kernel, bias)
            )
        elif isinstance(layer, Conv2D):
            fns.append(_quantized_conv(layer, index, p, bias, variables, chunk_elements))
        else:
            fns.append(_quantized_dense(index, p, bias, variables, chunk_elements))
    output = forward(spec, [inputs[i.name] for i in spec.inputs], fns)
    init_op = tf.compat.v1.variables_initializer(variables.variables)
    return CheckpointGraph(inputs, tf.identity(output, name=spec.output), init_op, variables.feed)


def _padded_codes(data: BlockQuantized) -> np.ndarray:
    """Codes with each row padded by zero codes to whole blocks: ``[rows, blocks * size]``."""
    rows, length = data.codes.shape
    padded = np.zeros((rows, data.blocks_per_row * data.block_size), np.int8)
    padded[:, :length] = data.codes
    return padded


def _dequantize(codes: tf.Tensor, scales: tf.Tensor, block_size: int, length: int) -> tf.Tensor:
    """float32 ``[rows, length]`` from int8 ``[rows, blocks * block_size]`` codes."""
    rows = tf.shape(codes)[0]
    blocks = scales.shape[1]
    values = tf.reshape(tf.cast(codes, tf.float32), [rows, blocks, block_size])
    values = tf.reshape(values * scales[:, :, tf.newaxis], [rows, blocks * block_size])
    return values if blocks * block_size == length else values[:, :length]


def _chunks(data: BlockQuantized, chunk_elements: int) -> list[tuple[int, int]]:
    """Row ranges of at most ``chunk_elements`` padded codes each (at least one row)."""
    rows = data.codes.shape[0]
    per_chunk = max(1, chunk_elements // (data.blocks_per_row * data.block_size))
    return [(r, min(r + per_chunk, rows)) for r in range(0, rows, per_chunk)]


def _quantized_dense(
    index: int, p: QuantParams, bias: tf.Tensor, variables: _Variables, chunk_elements: int
) -> LayerFn:
    """``x @ W.T + b``, with the codes held input-major (``[blocks * size, out]``): a plain
    matmul on them is several times faster in TF than ``transpose_b`` at batch 8 and more
    (measured on [1024, 4096] at batch 8: 6 ms against 66 ms). Chunks are runs of whole blocks
    along the input; their partial products add up."""
    data = p.kernel.data  # [out, in], blocks along in
    out_features, length = data.codes.shape
    size, blocks = data.block_size, data.blocks_per_row
    codes = variables(f"l{index}_codes", _padded_codes(data).T)  # [blocks * size, out]
    scales = variables(f"l{index}_scales", data.scales.T)  # [blocks, out]
    per_chunk = max(1, chunk_elements // (size * out_features))
    bounds = [(b, min(b + per_chunk, blocks)) for b in range(0, blocks, per_chunk)]

    def apply(x: tf.Tensor) -> tf.Tensor:
        total: tf.Tensor | None = None
        after: tf.Tensor = x
        for first, last in bounds:
            begin, end = first * size, min(last * size, length)
            with tf.control_dependencies([after]):
                w = tf.cast(codes[first * size : last * size], tf.float32)
                w = tf.reshape(w, [last - first, size, out_features]) * scales[first:last, None, :]
                w = tf.reshape(w, [(last - first) * size, out_features])[: end - begin]
            part = tf.matmul(x[:, begin:end], w)
            total = part if total is None else total + part
            after = total
        assert total is not None
        return total + bias

    return apply


def _quantized_conv(
    layer: Conv2D,
    index: int,
    p: QuantParams,
    bias: tf.Tensor,
    variables: _Variables,
    chunk_elements: int,
) -> LayerFn:
    data = p.kernel.data  # [O, I*kh*kw]
    _, in_ch, kh, kw = p.kernel.shape
    codes = variables(f"l{index}_codes", _padded_codes(data))
    scales = variables(f"l{index}_scales", data.scales)
    bounds = _chunks(data, chunk_elements)
    padding = layer.padding.upper()

    def apply(x: tf.Tensor) -> tf.Tensor:
        parts = []
        after: tf.Tensor = x
        for begin, end in bounds:
            with tf.control_dependencies([after]):
                flat = _dequantize(
                    codes[begin:end], scales[begin:end], data.block_size, data.row_length
                )
                kernel = tf.reshape(flat, [end - begin, in_ch, kh, kw])
                kernel = tf.transpose(kernel, [2, 3, 1, 0])  # OIHW -> HWIO
            after = tf.nn.conv2d(x, kernel, strides=layer.stride, padding=padding)
            parts.append(after)
        y = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        return tf.nn.bias_add(y, bias)

    return apply
