"""Quantized weights in ONNX graphs, kept quantized inside ONNX Runtime.

Two ways, chosen per weight:

- ``com.microsoft.MatMulNBits`` for fully connected layers at 2, 4 or 8 bits with a
  power-of-two block of at least 16: ONNX Runtime's native blockwise kernel. Its ``B`` input is
  ``[N, blocks, block_size * bits / 8]`` uint8 holding the offset codes ``q + 2^(bits-1)`` (the
  kernel's default zero point, so no zero-point input), the first element of a byte in its
  lowest bits, exactly ``models.quant.pack_codes``'s order; a row shorter than whole blocks is
  padded with the zero point. ``accuracy_level=4`` lets it quantize activations to int8 per
  block and use integer dot products: the fast path, with about 0.5% relative error from the
  activations (0 computes in fp32).
- Convolutions, where the serving plan says ``packed``, as im2col from standard ops (Pad, Slice,
  Concat, Reshape on NHWC tensors) feeding the same ``MatMulNBits``: the codes stay packed, but
  the patches cost a copy of K values per output position.
- Blocked dequantization for everything else (convolutions, 3- and 6-bit): INT4 codes when
  they fit in 4 bits (ONNX INT4, opset 21), INT8 otherwise, one block per row with its scale,
  dequantized by ``DequantizeLinear`` on every run into a transient fp32 tensor. ONNX Runtime
  never constant-folds ``DequantizeLinear`` (its constant folding skips it to keep QDQ
  patterns), so the session holds codes, not floats. The price is the dequantization on every
  call: at batch 1 it costs a CNN about as much as its convolutions (INT4 codes take ORT
  several times longer to expand than INT8 ones; memory is what int4 is for, so INT4 it is).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper

from models.onnx_graph import GraphBuilder
from models.quant import BlockQuantized, pack_codes
from models.serving_plan import Way
from models.zoo import Dense, Layer

MS_DOMAIN = "com.microsoft"
QUANT_OPSET = 21  # blocked DequantizeLinear and INT4 tensors
QUANT_IR_VERSION = 10  # INT4 needs IR 10
MATMUL_NBITS = (2, 4, 8)
DEFAULT_ACCURACY_LEVEL = 4


def matmul_nbits_fits(data: BlockQuantized) -> bool:
    """Whether ``MatMulNBits`` runs these codes as they are."""
    size = data.block_size
    return data.bits in MATMUL_NBITS and size >= 16 and size & (size - 1) == 0


def matmul_nbits(
    g: GraphBuilder,
    name: str,
    x: str,
    data: BlockQuantized,
    bias: np.ndarray | None,
    out: str,
    accuracy_level: int,
) -> str:
    """``out = x @ W.T (+ bias)`` for ``W = dequant(data)`` of shape ``[N, K]``."""
    n, k = data.codes.shape
    blocks = data.blocks_per_row
    padded = np.zeros((n, blocks * data.block_size), np.int8)  # zero code = zero point
    padded[:, :k] = data.codes
    blob = pack_codes(padded, data.bits).reshape(n, blocks, data.block_size * data.bits // 8)
    inputs = [
        x,
        g.const(f"{name}_qweight", blob),
        g.const(f"{name}_scales", np.ascontiguousarray(data.scales.reshape(-1))),
    ]
    if bias is not None:
        # inputs 3 and 4 (zero points, g_idx) are absent; 5 is the bias
        inputs += ["", "", g.const(f"{name}_bias", bias.astype(np.float32))]
    return g.node(
        "MatMulNBits",
        inputs,
        out,
        domain=MS_DOMAIN,
        K=k,
        N=n,
        bits=data.bits,
        block_size=data.block_size,
        accuracy_level=accuracy_level,
    )


def default_way(layer: Layer, data: BlockQuantized) -> Way:
    """How a quantized layer runs when no serving plan says: fully connected layers as
    ``MatMulNBits`` where it fits, everything else dequantized in the graph.

    The serving plan measures instead of guessing, because which way is fastest depends on the
    layer's shape, the batch size and the CPU: im2col + ``MatMulNBits`` can win on a small
    feature map at batch 1 and lose on a large one or at larger batches, and a kernel
    dequantized once at load runs ONNX Runtime's pre-packed direct convolution, faster than
    either, at fp32's memory (docs/performance.md, "Measurements behind the backend
    settings").
    """
    if isinstance(layer, Dense) and matmul_nbits_fits(data):
        return "packed"
    return "graph"


def conv_matmul_nbits(
    g: GraphBuilder,
    name: str,
    x: str,
    data: BlockQuantized,
    bias: np.ndarray | None,
    *,
    kernel: tuple[int, int],
    stride: int,
    pads: tuple[int, int, int, int],
    out_hw: tuple[int, int],
    out: str,
    accuracy_level: int,
) -> str:
    """A 2-D convolution of the NHWC ``x`` as im2col and ``MatMulNBits``: NHWC ``out``.

    ``data`` is the kernel ``[O, I, kh, kw]`` flattened to ``[O, K]``, ``K = I*kh*kw`` in
    ``(i, kh, kw)`` order, blocks along ``K``. The patches are built in that order from
    standard ops: the padded input gets a last axis of 1 (``[N, Hp, Wp, I, 1]``), one strided
    ``Slice`` per kernel tap gives ``[N, Ho, Wo, I, 1]``, ``Concat`` along the last axis
    ``[N, Ho, Wo, I, kh*kw]`` and a ``Reshape`` ``[N, Ho, Wo, K]``, which ``MatMulNBits``
    multiplies by the packed codes: ``[N, Ho, Wo, O]``, bias included. ``pads`` are (top,
    left, bottom, right). A 1x1 kernel at stride 1 without padding needs no patches.
    """
    kh, kw = kernel
    ho, wo = out_hw
    k = data.codes.shape[1]
    if (kh, kw, stride) == (1, 1, 1) and not any(pads):
        return matmul_nbits(g, name, x, data, bias, out, accuracy_level)
    if any(pads):
        top, left, bottom, right = pads
        widths = np.array([0, top, left, 0, 0, bottom, right, 0], np.int64)
        x = g.node("Pad", [x, g.const(f"{name}_pads", widths)], f"{name}_padded")
    taps = g.node(
        "Unsqueeze", [x, g.const(f"{name}_tap_axis", np.array([4], np.int64))], f"{name}_taps"
    )
    axes = g.const(f"{name}_slice_axes", np.array([1, 2], np.int64))
    steps = g.const(f"{name}_slice_steps", np.array([stride, stride], np.int64))
    shifted = []
    for dy in range(kh):
        for dx in range(kw):
            tap = f"{name}_tap{dy}{dx}"
            starts = g.const(f"{tap}_starts", np.array([dy, dx], np.int64))
            ends = np.array([dy + (ho - 1) * stride + 1, dx + (wo - 1) * stride + 1], np.int64)
            shifted.append(
                g.node("Slice", [taps, starts, g.const(f"{tap}_ends", ends), axes, steps], tap)
            )
    patches = g.node("Concat", shifted, f"{name}_patches", axis=4)
    shape = g.const(f"{name}_patch_shape", np.array([0, ho, wo, k], np.int64))
    rows = g.node("Reshape", [patches, shape], f"{name}_im2col")
    return matmul_nbits(g, name, rows, data, bias, out, accuracy_level)


def dequantized(g: GraphBuilder, name: str, data: BlockQuantized) -> str:
    """The fp32 ``[N, K]`` weight, computed on every run from stored codes.

    The codes are stored one block per row, ``[N * blocks, block_size]`` (each row of the
    weight padded with zero codes to whole blocks), with one scale per row: a per-axis
    ``DequantizeLinear``, which ONNX Runtime runs several times faster than the blocked form
    along the last axis; a reshape and, when there is padding, a slice give ``[N, K]`` back.
    """
    n, k = data.codes.shape
    blocks, size = data.blocks_per_row, data.block_size
    padded = np.zeros((n, blocks * size), np.int8)
    padded[:, :k] = data.codes
    codes = g.tensor(code_tensor(f"{name}_codes", padded.reshape(n * blocks, size), data.bits))
    scales = g.const(f"{name}_scales", np.ascontiguousarray(data.scales.reshape(-1)))
    flat = g.node("DequantizeLinear", [codes, scales], f"{name}_blocks", axis=0)
    rows = g.const(f"{name}_rows", np.array([n, blocks * size], np.int64))
    if k == blocks * size:
        return g.node("Reshape", [flat, rows], f"{name}_dequantized")
    padded_weight = g.node("Reshape", [flat, rows], f"{name}_padded")
    bounds = {"start": 0, "end": k, "axis": 1}  # Slice's starts, ends, axes
    inputs = [g.const(f"{name}_{key}", np.array([v], np.int64)) for key, v in bounds.items()]
    return g.node("Slice", [padded_weight, *inputs], f"{name}_dequantized")


def code_tensor(name: str, codes: np.ndarray, bits: int) -> TensorProto:
    """int8 codes as an ONNX INT4 initializer (two's-complement nibbles, first element in the
    low nibble, as ONNX packs INT4) when ``bits <= 4``, else INT8."""
    if bits > 4:
        return helper.make_tensor(name, TensorProto.INT8, codes.shape, codes.tobytes(), raw=True)
    flat = codes.reshape(-1)
    nibbles = np.zeros(math.ceil(flat.size / 2) * 2, np.uint8)
    nibbles[: flat.size] = flat.astype(np.uint8) & 0x0F
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return helper.make_tensor(name, TensorProto.INT4, codes.shape, packed.tobytes(), raw=True)
