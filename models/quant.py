"""The qwZ block quantizer of ZeRO++ (DeepSpeed), restated in NumPy, bit for bit.

DeepSpeed's rule (``csrc/includes/quantization_utils.h``, symmetric type), for ``b`` bits:

1. the weight is read as fp16 (round to nearest even; values beyond fp16's range become
   infinite in DeepSpeed and are refused here);
2. per block, ``m = max|w|`` in fp16, then in fp32 ``s = 2^b / (2 m)`` (= ``2^(b-1) / m``: the
   doubling is exact, so the one rounded division gives the same fp32 value); a zero block
   uses ``s = 1``;
3. ``q = clamp(rint(fp32(w * s)), -2^(b-1), 2^(b-1) - 1)`` with round-half-even (CUDA's
   ``__float2int_rn``). ``+m`` lands on ``2^(b-1)`` and clips to ``2^(b-1) - 1`` (about one step
   of error); ``-m`` maps exactly to ``-2^(b-1)``;
4. the stored scale is ``d = fp32(1 / s)`` and ``dequant = fp32(q * d)`` (DeepSpeed's all-gather
   then rounds that to fp16: ``dequantize(np.float16)``).

So every block that is not all zeros holds at least one code at ``-2^(b-1)`` or ``2^(b-1) - 1``
(its absmax), and a block whose codes are all zero is a zero block with ``d = 1``: the
checkpoint loader checks exactly this to catch codes and scales that do not belong together.

Two layouts of the blocks:

- ``quantize_blocks``: blocks of ``block_size`` consecutive elements along the last axis (the
  input dimension K of a weight stored output-major, as PyTorch's ``Linear`` [out, in]); a block
  never spans two rows, and when K is not a multiple of the block size the last block of each row
  is shorter. This is what a trainer that exports its codes uses and what ONNX Runtime's
  ``MatMulNBits`` consumes.
- ``quantize_flat_groups``: DeepSpeed's own layout in the ZeRO++ all-gather: the flattened
  tensor (a rank's shard) cut into ``groups`` contiguous runs, the group count chosen by
  ``deepspeed_group_count`` exactly as ``CUDAQuantizer.quantize`` does, to reproduce the numerics
  of a real qwZ all-gather.

Sub-byte packing (``pack_codes``) stores the offset codes ``u = q + 2^(b-1)`` (0 .. 2^b - 1) as a
little-endian bit stream: code ``i`` occupies bits ``b*i .. b*i + b - 1``, bit 0 being the least
significant bit of byte 0. For 4 bits that puts the first element in the low nibble, as ONNX
Runtime's ``MatMulNBits`` (and ONNX's INT4) do, and the opposite of DeepSpeed's int4 kernels,
which put ``x[2i]`` in the high nibble and ``x[2i+1]`` in the low one, as two's-complement
nibbles (``pack_int4_deepspeed`` writes that layout, for comparing with a DeepSpeed dump).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SUPPORTED_BITS = (2, 3, 4, 6, 8)
MIN_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 4096
# DeepSpeed's CUDAQuantizer.target_group_size ("the optimal size is 4k, so we set the target to
# be below 8k") and its hard limit on a group's size.
DEEPSPEED_TARGET_GROUP_SIZE = 8000
DEEPSPEED_MAX_GROUP_SIZE = 16000


class QuantizationError(ValueError):
    """A weight, bit width or block layout the quantizer cannot take."""


@dataclass(frozen=True, slots=True, eq=False)
class BlockQuantized:
    """Codes and per-block scales of one weight.

    ``codes``: int8, the quantized weight's shape, one code per element in
    ``[-2^(bits-1), 2^(bits-1) - 1]``. ``scales``: float32 ``d = 1/s``, shape
    ``codes.shape[:-1] + (blocks_per_row,)``; blocks run along the last axis, ``block_size``
    elements each (the last one of a row shorter when the row length is not a multiple).
    """

    codes: np.ndarray
    scales: np.ndarray
    bits: int
    block_size: int

    def __post_init__(self) -> None:
        if self.bits not in SUPPORTED_BITS:
            raise QuantizationError(f"bits must be one of {SUPPORTED_BITS}, got {self.bits}")
        if self.codes.dtype != np.int8 or self.codes.ndim < 1:
            raise QuantizationError(f"codes must be an int8 array, got {self.codes.dtype}")
        if self.scales.dtype != np.float32:
            raise QuantizationError(f"scales must be float32, got {self.scales.dtype}")
        if self.block_size < 1:
            raise QuantizationError(f"block_size must be positive, got {self.block_size}")
        want = (*self.codes.shape[:-1], self.blocks_per_row)
        if self.scales.shape != want:
            raise QuantizationError(
                f"scales have shape {self.scales.shape}, codes {self.codes.shape} with blocks "
                f"of {self.block_size} need {want}"
            )

    @property
    def row_length(self) -> int:
        return int(self.codes.shape[-1])

    @property
    def blocks_per_row(self) -> int:
        return math.ceil(self.row_length / self.block_size)

    @property
    def packed_nbytes(self) -> int:
        """Bytes of the packed codes plus the scales: what the checkpoint stores."""
        return packed_size(self.codes.size, self.bits) + self.scales.nbytes

    def block_scales(self) -> np.ndarray:
        """The scale of every element's block, shaped like ``codes`` (float32)."""
        return np.repeat(self.scales, self.block_size, axis=-1)[..., : self.row_length]

    def dequantize(self, dtype: type[np.floating] = np.float32) -> np.ndarray:
        """``fp32(q * d)``, cast to ``dtype`` (``np.float16`` gives DeepSpeed's all-gather
        output: the fp32 product rounded once more, to fp16)."""
        values = self.codes.astype(np.float32) * self.block_scales()
        return values if dtype == np.float32 else values.astype(dtype)


def quantize_blocks(weight: np.ndarray, bits: int, block_size: int) -> BlockQuantized:
    """Quantize ``weight`` with qwZ's rule in blocks of ``block_size`` along its last axis.

    ``block_size`` is a power of two from 16 to 4096. Raises ``QuantizationError`` for a
    non-finite weight or one beyond fp16's range (DeepSpeed reads weights as fp16).
    """
    check_bits(bits)
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size & (block_size - 1) != 0:
        raise QuantizationError(
            f"block_size must be a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}, "
            f"got {block_size}"
        )
    w16 = to_fp16(weight)
    if w16.ndim < 1 or w16.shape[-1] == 0:
        raise QuantizationError(f"cannot quantize a weight of shape {w16.shape}")
    rows = w16.reshape(-1, w16.shape[-1])
    length = rows.shape[1]
    full = length // block_size
    codes = np.empty(rows.shape, np.int8)
    parts = []
    if full:
        # [rows, full, block] -> one block per row of the 2-D view
        head = rows[:, : full * block_size].reshape(-1, block_size)
        head_codes, head_scales = quantize_groups(head, bits)
        codes[:, : full * block_size] = head_codes.reshape(rows.shape[0], -1)
        parts.append(head_scales.reshape(rows.shape[0], full))
    if length % block_size:
        tail_codes, tail_scales = quantize_groups(rows[:, full * block_size :], bits)
        codes[:, full * block_size :] = tail_codes
        parts.append(tail_scales.reshape(rows.shape[0], 1))
    scales = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    return BlockQuantized(
        codes=codes.reshape(w16.shape),
        scales=scales.reshape(*w16.shape[:-1], -1),
        bits=bits,
        block_size=block_size,
    )


def quantize_groups(groups: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel: each row of the fp16 matrix ``groups`` is one block. Returns int8 codes of
    the same shape and one float32 scale ``d = 1/s`` per row."""
    check_bits(bits)
    if groups.dtype != np.float16 or groups.ndim != 2:
        raise QuantizationError("quantize_groups takes a 2-D float16 array")
    half = 1 << (bits - 1)
    absmax = np.abs(groups).max(axis=1).astype(np.float32)  # exact: fp16 -> fp32
    nonzero = absmax > 0
    s = np.ones_like(absmax)
    # fp32 division, correctly rounded, as on the GPU; a zero block keeps s = 1.
    np.divide(np.float32(half), absmax, out=s, where=nonzero)
    product = groups.astype(np.float32) * s[:, None]  # fp32 multiply, rounded once
    q = np.clip(np.rint(product), -half, half - 1)  # rint: round half to even
    scales = np.float32(1.0) / s
    return q.astype(np.int8), scales.astype(np.float32)


def to_fp16(weight: np.ndarray) -> np.ndarray:
    """The weight as fp16 (round to nearest even), refusing what fp16 cannot hold."""
    array = np.asarray(weight)
    if array.dtype.kind != "f":
        raise QuantizationError(f"weights must be floating point, got {array.dtype}")
    if not np.isfinite(array).all():
        raise QuantizationError("weight has NaN or infinite values")
    with np.errstate(over="ignore"):
        w16 = array.astype(np.float16)
    if not np.isfinite(w16).all():
        worst = float(np.abs(array).max())
        raise QuantizationError(
            f"weight has values beyond fp16's range (|w| up to {worst:g} > 65504); qwZ reads "
            f"weights as fp16, where they would become infinite"
        )
    return w16


def check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise QuantizationError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")


def check_block_size(block_size: int) -> None:
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size & (block_size - 1):
        raise QuantizationError(
            f"block_size must be a power of two from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}, "
            f"got {block_size}"
        )


# -- DeepSpeed's flat-group layout -----------------------------------------------------------


def deepspeed_group_count(numel: int) -> int:
    """How many groups ``CUDAQuantizer.quantize`` cuts a tensor of ``numel`` elements into.

    Start at ceil(numel / 8000) and grow until ``numel % (8 * groups) == 0``; then double
    while ``numel % (16 * groups) == 0`` and groups are still larger than 8000 elements. The
    result must leave groups under 16000 elements, else DeepSpeed asserts (here: raises).
    """
    if numel < 1:
        raise QuantizationError(f"numel must be positive, got {numel}")
    groups = math.ceil(numel / DEEPSPEED_TARGET_GROUP_SIZE)
    while groups < numel:
        if numel % (8 * groups) == 0:
            break
        groups += 1
    while numel % (8 * groups * 2) == 0 and numel / groups > DEEPSPEED_TARGET_GROUP_SIZE:
        groups *= 2
    if numel % (8 * groups) != 0:
        raise QuantizationError(
            f"DeepSpeed's qwZ needs the element count to be a multiple of 8 * groups; "
            f"{numel} cannot be divided by 8 * {groups}"
        )
    if numel / groups >= DEEPSPEED_MAX_GROUP_SIZE:
        raise QuantizationError(f"{numel} / {groups} is larger than DeepSpeed's 16k group limit")
    if numel <= groups:
        raise QuantizationError(f"no group size for a tensor of {numel} elements")
    return groups


def quantize_flat_groups(
    tensor: np.ndarray, bits: int, groups: int | None = None
) -> BlockQuantized:
    """The tensor flattened and cut into ``groups`` contiguous groups (DeepSpeed's count when
    ``None``), as the qwZ all-gather quantizes a rank's shard. Codes come back flat."""
    w16 = to_fp16(tensor).reshape(-1)
    groups = deepspeed_group_count(w16.size) if groups is None else groups
    if groups < 1 or w16.size % groups:
        raise QuantizationError(f"{w16.size} elements do not split into {groups} equal groups")
    codes, scales = quantize_groups(w16.reshape(groups, -1), bits)
    return BlockQuantized(codes.reshape(-1), scales, bits, w16.size // groups)


# -- packing ---------------------------------------------------------------------------------


def packed_size(count: int, bits: int) -> int:
    """Bytes holding ``count`` codes of ``bits`` bits."""
    return math.ceil(count * bits / 8)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (int8, any shape, row-major order) as the little-endian bit stream of the offset
    codes ``q + 2^(bits-1)``; uint8, ``packed_size(codes.size, bits)`` bytes."""
    check_bits(bits)
    offset = codes.reshape(-1).astype(np.int16) + (1 << (bits - 1))
    if offset.size and (offset.min() < 0 or offset.max() >= 1 << bits):
        raise QuantizationError(f"codes outside the {bits}-bit range")
    if bits == 8:
        return offset.astype(np.uint8)
    count = offset.size
    # Eight codes fill exactly ``bits`` bytes: assemble them in one little-endian uint64 each.
    padded = np.zeros(math.ceil(count / 8) * 8, np.uint64)
    padded[:count] = offset
    eights = padded.reshape(-1, 8)
    words = np.zeros(eights.shape[0], np.uint64)
    for j in range(8):
        words |= eights[:, j] << np.uint64(bits * j)
    stream = words.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :bits].reshape(-1)
    return stream[: packed_size(count, bits)].copy()


def unpack_codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of ``pack_codes``: ``count`` int8 codes. Raises ``QuantizationError`` when the
    byte count is wrong or the padding bits after the last code are not zero."""
    check_bits(bits)
    data = np.asarray(packed, dtype=np.uint8).reshape(-1)
    if data.size != packed_size(count, bits):
        raise QuantizationError(
            f"{count} codes of {bits} bits take {packed_size(count, bits)} bytes, got {data.size}"
        )
    half = 1 << (bits - 1)
    if bits == 8:
        return (data.astype(np.int16) - half).astype(np.int8)
    groups = math.ceil(count / 8)
    stream = np.zeros((groups, 8), np.uint8)
    flat = np.zeros(groups * bits, np.uint8)
    flat[: data.size] = data
    stream[:, :bits] = flat.reshape(groups, bits)
    words = stream.reshape(-1).view("<u8").astype(np.uint64)
    mask = np.uint64((1 << bits) - 1)
    offsets = np.empty((groups, 8), np.uint8)
    for j in range(8):
        offsets[:, j] = (words >> np.uint64(bits * j)) & mask
    unpacked = offsets.reshape(-1)
    if unpacked[count:].any():
        raise QuantizationError("non-zero padding bits after the last code")
    return (unpacked[:count].astype(np.int16) - half).astype(np.int8)


def pack_int4_deepspeed(codes: np.ndarray) -> np.ndarray:
    """4-bit codes in DeepSpeed's byte layout: two's-complement nibbles, ``x[2i]`` in the high
    nibble and ``x[2i+1]`` in the low one (``PackedInt4{high, low}``); an even count only."""
    flat = codes.reshape(-1).astype(np.int16)
    if flat.size % 2 or (flat.size and (flat.min() < -8 or flat.max() > 7)):
        raise QuantizationError("DeepSpeed int4 packing takes an even number of 4-bit codes")
    nibbles = (flat & 0x0F).astype(np.uint8)
    return ((nibbles[0::2] << 4) | nibbles[1::2]).astype(np.uint8)


def unpack_int4_deepspeed(packed: np.ndarray) -> np.ndarray:
    """Inverse of ``pack_int4_deepspeed``."""
    data = np.asarray(packed, dtype=np.uint8).reshape(-1)
    nibbles = np.empty(data.size * 2, np.int16)
    nibbles[0::2] = data >> 4
    nibbles[1::2] = data & 0x0F
    return np.where(nibbles >= 8, nibbles - 16, nibbles).astype(np.int8)
