"""A zoo checkpoint as a TensorFlow v1 graph whose variables hold the codes, not floats.

Quantized kernels stay codes plus float32 scales in memory: int8 codes, one per byte, at 6 and 8
bits; at 2, 3 and 4 bits two per byte (``_paired``), so that an int4 model holds half a byte per
weight as it does on ONNX Runtime. The graph dequantizes them on every run: unpack, cast,
multiply by the scales, drop the padding (each row is padded with zero codes to whole blocks).
The result is ``fp32(q * d)``, exactly what ``BlockQuantized.dequantize`` gives. Two things keep
the transient float copies small:

- variables are filled by feeding their values once at load (an initializer fed from a
  placeholder), never from constants in the graph: Grappler folds constant subgraphs, and
  dequantizing a constant would be folded into a float32 constant, i.e. fp32 weights again;
- a layer's dequantization waits (control dependency) for the layer's input, and a kernel is
  dequantized and applied in chunks of output rows (dense) or filters (convolution), each chunk
  waiting for the previous one's product. Otherwise the executor, seeing every dequantization
  ready at the start of a run, would materialise all float weights at once.

The chunk size trades the float transient (which TensorFlow's CPU allocator partly keeps
between runs) against graph size (every chunk is a few more ops, and ops are not cheap in a
session). Measured on a 25M-weight MLP with int8 codes (fp32: 101 MB held): 53 MB held with
chunks of 256K elements, 34 MB with 1M (plus 8.6 MB at the peak of a run), against 25 MB of
codes.

Importing this module imports TensorFlow; ``models.backends.tf_backend`` imports it lazily.
"""

from __future__ import annotations

# Sets the environment TensorFlow reads when it is first imported (thread pools, log level).
from models import tf_env  # noqa: F401  isort: skip

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
# Codes of at most this many bits are held two per byte.
NIBBLE_BITS = 4


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


def _paired(codes: np.ndarray, axis: int) -> np.ndarray:
    """Codes of at most 4 bits, two per byte: output row ``r`` (along ``axis``) in the low
    nibble, row ``r + half`` in the high one, both two's complement; an odd row count gets a
    zero row. ``[.., rows, ..]`` int8 -> ``[.., ceil(rows / 2), ..]`` uint8.

    Pairs are whole output rows so that nothing has to be put back together at run time: the
    two halves of a chunk make two products (half of the filters or output units each), where
    pairing neighbouring codes would need an element-wise interleave per run."""
    rows = codes.shape[axis]
    half = -(-rows // 2)
    if rows % 2:
        pad = [(0, 0)] * codes.ndim
        pad[axis] = (0, 1)
        codes = np.pad(codes, pad)
    low, high = np.split(codes.astype(np.uint8), 2, axis=axis)
    assert low.shape[axis] == half
    return np.ascontiguousarray((low & 0x0F) | (high << 4))


def _paired_scales(scales: np.ndarray, axis: int) -> np.ndarray:
    """``d / 16`` for every row of ``_paired`` codes (zero-padded the same way). Dividing by a
    power of two is exact here (every qwZ scale is a normal float far above 2^-122), so
    ``fp32(16 q * (d / 16)) == fp32(q * d)``: one rounding of the same real product."""
    rows = scales.shape[axis]
    if rows % 2:
        pad = [(0, 0)] * scales.ndim
        pad[axis] = (0, 1)
        scales = np.pad(scales, pad)
    return np.ascontiguousarray(scales / np.float32(16))


def _unpaired(held: tf.Tensor, axis: int) -> tf.Tensor:
    """``16 q`` as float32 from (a slice of) ``_paired`` codes: the low rows, then the high
    rows, along ``axis``.

    Only a multiplication and a mask, both on uint8 and both fast in TF (its shifts check the
    shift amount of every element and cost about ten times as much): ``b * 16`` wraps to the
    low nibble moved up, ``b & 0xF0`` keeps the high one; read as int8, each is ``16 q``. The
    two halves are whole rows, so joining them is a copy of contiguous runs of int8."""
    low = tf.bitcast(held * tf.constant(16, tf.uint8), tf.int8)
    high = tf.bitcast(tf.bitwise.bitwise_and(held, tf.constant(0xF0, tf.uint8)), tf.int8)
    return tf.cast(tf.concat([low, high], axis=axis), tf.float32)


def _chunks(rows: int, row_elements: int, chunk_elements: int) -> list[tuple[int, int]]:
    """Row ranges of at most ``chunk_elements`` elements each (at least one row)."""
    per_chunk = max(1, chunk_elements // row_elements)
    return [(r, min(r + per_chunk, rows)) for r in range(0, rows, per_chunk)]


def _quantized_dense(
    index: int, p: QuantParams, bias: tf.Tensor, variables: _Variables, chunk_elements: int
) -> LayerFn:
    """``x @ W.T + b``, with the codes held input-major (``[blocks * size, out]``): a plain
    matmul on them is several times faster in TF than ``transpose_b`` at batch 8 and more
    (docs/performance.md, "Measurements behind the backend settings"). Chunks are runs of
    whole blocks along the input; their partial products add up. Codes of at most 4 bits are
    paired along the output (``_paired``); unpaired, a chunk's columns are the outputs in
    order, plus one zero column when their number is odd."""
    data = p.kernel.data  # [out, in], blocks along in
    out_features, length = data.codes.shape
    size, blocks = data.block_size, data.blocks_per_row
    codes = _padded_codes(data).T  # [blocks * size, out]
    scales = data.scales.T[:, None, :]  # [blocks, 1, out]
    nibbles = data.bits <= NIBBLE_BITS
    if nibbles:
        held = variables(f"l{index}_codes", _paired(codes, axis=1))
        factors = variables(f"l{index}_scales", _paired_scales(scales, axis=2))
    else:
        held = variables(f"l{index}_codes", codes)
        factors = variables(f"l{index}_scales", np.ascontiguousarray(scales))
    columns = factors.shape[2]
    bounds = _chunks(blocks, size * columns, chunk_elements)

    def apply(x: tf.Tensor) -> tf.Tensor:
        total: tf.Tensor | None = None
        after: tf.Tensor = x
        for first, last in bounds:
            begin, end = first * size, min(last * size, length)
            with tf.control_dependencies([after]):
                chunk = held[first * size : last * size]
                w = _unpaired(chunk, axis=1) if nibbles else tf.cast(chunk, tf.float32)
                w = tf.reshape(w, [last - first, size, columns]) * factors[first:last]
                w = tf.reshape(w, [(last - first) * size, columns])
                w = w if end - begin == (last - first) * size else w[: end - begin]
            part = tf.matmul(x[:, begin:end], w)
            total = part if total is None else total + part
            after = total
        assert total is not None
        return (total if columns == out_features else total[:, :out_features]) + bias

    return apply


def _quantized_conv(
    layer: Conv2D,
    index: int,
    p: QuantParams,
    bias: tf.Tensor,
    variables: _Variables,
    chunk_elements: int,
) -> LayerFn:
    """A convolution in chunks of filters, each dequantized just before its product. Codes of
    at most 4 bits are paired along the filters (``_paired``): a chunk of ``n`` pairs makes
    ``n`` filters of the first half and the same ``n`` of the second half."""
    data = p.kernel.data  # [O, I*kh*kw]
    filters, length = data.codes.shape
    size, blocks = data.block_size, data.blocks_per_row
    _, in_ch, kh, kw = p.kernel.shape
    nibbles = data.bits <= NIBBLE_BITS
    if nibbles:
        held = variables(f"l{index}_codes", _paired(_padded_codes(data), axis=0))
        factors = variables(f"l{index}_scales", _paired_scales(data.scales, axis=0))
    else:
        held = variables(f"l{index}_codes", _padded_codes(data))
        factors = variables(f"l{index}_scales", data.scales)
    rows = held.shape[0]  # filters, or pairs of them
    bounds = _chunks(rows, blocks * size * (2 if nibbles else 1), chunk_elements)
    padding = layer.padding.upper()

    def apply(x: tf.Tensor) -> tf.Tensor:
        firsts: list[tf.Tensor] = []  # output channels in order (the low nibbles' when paired)
        seconds: list[tf.Tensor] = []  # the high nibbles' output channels
        after: tf.Tensor = x
        for begin, end in bounds:
            n = end - begin
            with tf.control_dependencies([after]):
                chunk = held[begin:end]
                if nibbles:
                    w = _unpaired(chunk, axis=0)  # [2n, blocks * size]
                    d = tf.concat([factors[begin:end], factors[rows + begin : rows + end]], 0)
                else:
                    w, d = tf.cast(chunk, tf.float32), factors[begin:end]
                count = 2 * n if nibbles else n
                w = tf.reshape(tf.reshape(w, [count, blocks, size]) * d[:, :, None], [count, -1])
                w = w if blocks * size == length else w[:, :length]
                kernel = tf.transpose(tf.reshape(w, [count, in_ch, kh, kw]), [2, 3, 1, 0])
            after = tf.nn.conv2d(x, kernel, strides=layer.stride, padding=padding)
            if nibbles and len(bounds) > 1:
                firsts.append(after[..., :n])
                seconds.append(after[..., n:])
            else:
                firsts.append(after)
        parts = firsts + seconds
        y = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        return tf.nn.bias_add(y if y.shape[-1] == filters else y[..., :filters], bias)

    return apply
