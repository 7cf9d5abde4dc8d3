"""The qwZ quantizer against golden vectors worked out by hand (see each test's comment)."""

from __future__ import annotations

import numpy as np
import pytest

from models.quant import (
    SUPPORTED_BITS,
    BlockQuantized,
    QuantizationError,
    deepspeed_group_count,
    pack_codes,
    pack_int4_deepspeed,
    quantize_blocks,
    quantize_flat_groups,
    unpack_codes,
    unpack_int4_deepspeed,
)


def _row(values: list[float], length: int = 16) -> np.ndarray:
    return np.array([[*values, *([0.0] * (length - len(values)))]], np.float32)


def test_eight_bit_ties_clip_and_exact_minimum() -> None:
    # m = 2, s = 128 / 2 = 64 (exact), d = 1/64. w*s, then round half to even:
    # 2 -> 128 clips to 127; -2 -> -128 exactly; 1/128 -> 0.5 -> 0; 3/128 -> 1.5 -> 2;
    # 5/128 -> 2.5 -> 2; -1/128 -> -0.5 -> 0; -3/128 -> -1.5 -> -2; 7/128 -> 3.5 -> 4.
    w = _row([2.0, -2.0, 1 / 128, 3 / 128, 5 / 128, -1 / 128, -3 / 128, 7 / 128, 1.0, -1.0, 0.5])
    q = quantize_blocks(w, 8, 16)
    assert q.codes.tolist() == [[127, -128, 0, 2, 2, 0, -2, 4, 64, -64, 32, 0, 0, 0, 0, 0]]
    assert q.codes.dtype == np.int8 and q.scales.dtype == np.float32
    assert q.scales.tolist() == [[0.015625]]
    assert q.dequantize()[0, :4].tolist() == [1.984375, -2.0, 0.0, 0.03125]


def test_fp32_scale_and_product_rounding() -> None:
    # m = 3: s = fp32(128/3) = 42.666667938232421875 (rounded up), d = fp32(1/s) = 0.0234375
    # (1/s = 0.02343749930..., nearer to 3/128 than to the fp32 below it).
    # 3 * s = 128.0000038 -> fp32 128 -> clips to 127; 1 * s -> 43; 1.5 * s = 64.0000019 -> 64.
    # 3/256 * s = 0.500000015 is 0.5 in fp32, so half-even gives 0 (a float64 product: 1);
    # 15/256 * s = 2.50000007 is 2.5 in fp32 -> 2 (float64: 3); 9/256 * s -> 1.5 -> 2.
    w = _row([3.0, -3.0, 1.0, 1.5, 0.75, 3 / 256, 15 / 256, 9 / 256])
    q = quantize_blocks(w, 8, 16)
    assert q.codes[0, :8].tolist() == [127, -128, 43, 64, 32, 0, 2, 2]
    assert q.scales.tolist() == [[0.0234375]]
    assert q.dequantize()[0, :3].tolist() == [2.9765625, -3.0, 1.0078125]


@pytest.mark.parametrize("bits", [3, 4, 6, 8])
def test_every_width_with_max_two(bits: int) -> None:
    # m = 2: s = 2^(b-1)/2 = 2^(b-2), d = 1/s. With h = 1/(2s) (half a step):
    # 2 -> 2^(b-1) clips to 2^(b-1)-1; -2 -> -2^(b-1); h -> 0.5 -> 0; 3h -> 1.5 -> 2;
    # 5h -> 2.5 -> 2; -7h -> -3.5 -> -4; 1 -> s; 0.5 -> s/2.
    s = 2.0 ** (bits - 2)
    h = 1 / (2 * s)
    q = quantize_blocks(_row([2.0, -2.0, h, 3 * h, 5 * h, -7 * h, 1.0, 0.5]), bits, 16)
    top = 2 ** (bits - 1)
    assert q.codes[0, :8].tolist() == [top - 1, -top, 0, 2, 2, -4, int(s), int(s / 2)]
    assert q.scales.tolist() == [[1 / s]]
    assert q.bits == bits


def test_two_bits() -> None:
    # m = 2: s = 2/2 = 1, d = 1; codes live in [-2, 1].
    # 2 -> 2 clips to 1; -2 -> -2; 0.5 -> 0; -0.5 -> 0; 1.5 -> 2 clips to 1; -1.5 -> -2;
    # 1 -> 1; -1 -> -1.
    q = quantize_blocks(_row([2.0, -2.0, 0.5, -0.5, 1.5, -1.5, 1.0, -1.0]), 2, 16)
    assert q.codes[0, :8].tolist() == [1, -2, 0, 0, 1, -2, 1, -1]
    assert q.scales.tolist() == [[1.0]]


def test_zero_blocks_use_scale_one() -> None:
    # Two blocks of 16 in one row: the first all zero (s = 1, d = 1, codes 0), the second not.
    w = np.zeros((1, 32), np.float32)
    w[0, 16] = -4.0  # m = 4, s = 32, d = 1/32; -4 -> -128
    q = quantize_blocks(w, 8, 16)
    assert q.scales.tolist() == [[1.0, 0.03125]]
    assert q.codes[0, :16].tolist() == [0] * 16
    assert q.codes[0, 16] == -128
    assert q.dequantize().tolist() == w.tolist()


def test_values_below_fp16_vanish_into_a_zero_block() -> None:
    # 1e-9 is below fp16's smallest subnormal (2^-24 ~ 6e-8): it reads as 0.
    q = quantize_blocks(np.full((1, 16), 1e-9, np.float32), 4, 16)
    assert q.codes.tolist() == [[0] * 16] and q.scales.tolist() == [[1.0]]


def test_subnormal_maximum() -> None:
    # m = 2^-24 (fp16's smallest subnormal): s = 128 / 2^-24 = 2^31, d = 2^-31, both exact.
    # +m -> 128 clips to 127 (dequantized 127 * 2^-31); -m -> -128 -> exactly -2^-24.
    tiny = 2.0**-24
    q = quantize_blocks(_row([tiny, -tiny]), 8, 16)
    assert q.codes[0, :2].tolist() == [127, -128]
    assert q.scales.tolist() == [[2.0**-31]]
    assert q.dequantize()[0, :2].tolist() == [127 * 2.0**-31, -tiny]


def test_huge_values() -> None:
    # 65519 rounds to fp16's largest finite value, 65504 = 2^16 (1 - 2^-11).
    # s = fp32(128 / 65504) = 2^-9 (1 + 2^-11 + 2^-22); d = fp32(1/s) = 511.75 exactly.
    # 65504 * s = 128 (1 - 2^-33) -> fp32 128 -> clips to 127 -> 127 * 511.75 = 64992.25;
    # -65504 -> -128 -> -65504 exactly.
    q = quantize_blocks(_row([65519.0, -65504.0, 511.75]), 8, 16)
    assert q.scales.tolist() == [[511.75]]
    assert q.codes[0, :3].tolist() == [127, -128, 1]
    assert q.dequantize()[0, :2].tolist() == [64992.25, -65504.0]


def test_beyond_fp16_or_not_finite_is_refused() -> None:
    with pytest.raises(QuantizationError, match="fp16"):
        quantize_blocks(_row([70000.0]), 8, 16)
    with pytest.raises(QuantizationError, match="NaN or infinite"):
        quantize_blocks(_row([float("nan")]), 8, 16)
    with pytest.raises(QuantizationError, match="floating point"):
        quantize_blocks(np.ones((1, 16), np.int32), 8, 16)


def test_fp16_input_is_taken_as_is() -> None:
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float16)
    a = quantize_blocks(w, 4, 16)
    b = quantize_blocks(w.astype(np.float32), 4, 16)
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)


def test_blocks_along_last_axis_with_a_short_last_block() -> None:
    # Rows of 40 in blocks of 16: blocks of 16, 16 and 8, each with its own maximum.
    w = np.zeros((2, 40), np.float32)
    w[0, 0], w[0, 16], w[0, 39] = 1.0, 2.0, 4.0
    w[1, 5] = -8.0  # row 1: only its first block is non-zero
    q = quantize_blocks(w, 4, 16)
    assert q.codes.shape == (2, 40) and q.scales.shape == (2, 3)
    # d = m / 8 for 4 bits (powers of two: exact); zero blocks keep 1.
    assert q.scales.tolist() == [[0.125, 0.25, 0.5], [1.0, 1.0, 1.0]]
    assert (q.codes[0, 0], q.codes[0, 16], q.codes[0, 39], q.codes[1, 5]) == (7, 7, 7, -8)
    assert q.blocks_per_row == 3 and q.row_length == 40


def test_leading_axes_are_kept() -> None:
    w = np.random.default_rng(1).standard_normal((3, 2, 32)).astype(np.float32)
    q = quantize_blocks(w, 8, 16)
    assert q.codes.shape == (3, 2, 32) and q.scales.shape == (3, 2, 2)
    flat = quantize_blocks(w.reshape(6, 32), 8, 16)
    assert np.array_equal(q.codes.reshape(6, 32), flat.codes)


@pytest.mark.parametrize("size", [8, 24, 8192])
def test_block_size_must_be_a_power_of_two_in_range(size: int) -> None:
    with pytest.raises(QuantizationError, match="block_size"):
        quantize_blocks(np.ones((1, 64), np.float32), 4, size)


@pytest.mark.parametrize("bits", [1, 5, 7, 16])
def test_unsupported_widths(bits: int) -> None:
    with pytest.raises(QuantizationError, match="bits"):
        quantize_blocks(np.ones((1, 16), np.float32), bits, 16)


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
def test_dequantize_is_exactly_codes_times_scale(bits: int) -> None:
    w = np.random.default_rng(bits).standard_normal((5, 100)).astype(np.float32)
    q = quantize_blocks(w, bits, 32)
    expected = q.codes.astype(np.float32) * np.repeat(q.scales, 32, axis=1)[:, :100]
    assert np.array_equal(q.dequantize(), expected)
    # DeepSpeed's all-gather hands out fp16: the fp32 product rounded once more.
    assert np.array_equal(q.dequantize(np.float16), expected.astype(np.float16))
    half = 2 ** (bits - 1)
    assert q.codes.min() >= -half and q.codes.max() <= half - 1


def test_scales_and_codes_must_agree() -> None:
    with pytest.raises(QuantizationError, match="scales have shape"):
        BlockQuantized(np.zeros((2, 32), np.int8), np.ones((2, 3), np.float32), 4, 16)


# -- DeepSpeed's flat groups ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("numel", "groups"),
    [
        # The Linear(h, h) weights of DeepSpeed's qwZ tests (h = 1024, 2048), whole and as one
        # of 4 ranks' shards: ceil(n / 8000) grows to the next g with n % 8g == 0, a power
        # of two here, giving groups of 4096.
        (1024 * 1024, 256),
        (1024 * 1024 // 4, 64),
        (2048 * 2048, 1024),
        (2048 * 2048 // 4, 256),
        (1024, 1),  # a bias: 1024 % 8 == 0 at g = 1
        (8000, 1),
        # 8008: ceil = 2; 8008 % 16, % 24, % 32, % 40, % 48 are not 0; % 56 is (8008 = 56 * 143)
        (8008, 7),
    ],
)
def test_deepspeed_group_count(numel: int, groups: int) -> None:
    assert deepspeed_group_count(numel) == groups


def test_deepspeed_group_count_refuses_what_deepspeed_asserts_on() -> None:
    with pytest.raises(QuantizationError, match="multiple of 8"):
        deepspeed_group_count(12)  # no g < 12 with 12 % 8g == 0


def test_flat_groups_match_row_blocks_of_the_same_size() -> None:
    shard = np.random.default_rng(3).standard_normal(1024 * 1024 // 4).astype(np.float32)
    flat = quantize_flat_groups(shard, 8)
    assert flat.codes.shape == (262144,) and flat.scales.shape == (64,)
    assert flat.block_size == 4096
    rows = quantize_blocks(shard.reshape(64, 4096), 8, 4096)
    assert np.array_equal(flat.codes, rows.codes.reshape(-1))
    assert np.array_equal(flat.scales, rows.scales.reshape(-1))


def test_flat_groups_with_a_given_count() -> None:
    # Two groups of 8: maxima 1 and 4 -> d = 1/128 and 4/128 at 8 bits.
    x = np.array([1.0, 0.5, 0, 0, 0, 0, 0, 0, -4.0, 2.0, 0, 0, 0, 0, 0, 0], np.float32)
    q = quantize_flat_groups(x, 8, groups=2)
    assert q.scales.tolist() == [1 / 128, 4 / 128]
    assert q.codes[:2].tolist() == [127, 64] and q.codes[8:10].tolist() == [-128, 64]
    with pytest.raises(QuantizationError, match="equal groups"):
        quantize_flat_groups(x, 8, groups=3)


# -- packing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bits", "codes", "packed"),
    [
        # offsets q + 2^(b-1), code i at bits b*i.., bit 0 = the low bit of byte 0
        (8, [-128, 127, 0], [0, 255, 128]),
        (4, [-8, 7, 0, -1], [0x0 | 0xF << 4, 0x8 | 0x7 << 4]),  # first element: low nibble
        (2, [-2, 1, 0, -1], [0 | 3 << 2 | 2 << 4 | 1 << 6]),
        # offsets 0,7,4,5,3,6,1,2: sum u_i << 3i = 0x473B38 -> little-endian bytes
        (3, [-4, 3, 0, 1, -1, 2, -3, -2], [0x38, 0x3B, 0x47]),
        (6, [-32, 31], [0xC0, 0x0F]),  # 0 | 63 << 6 = 0x0FC0
        (4, [7, -8, 1], [0xF | 0x0 << 4, 0x9]),  # odd count: the last byte half used
    ],
)
def test_pack_golden(bits: int, codes: list[int], packed: list[int]) -> None:
    array = np.array(codes, np.int8)
    assert pack_codes(array, bits).tolist() == packed
    assert unpack_codes(np.array(packed, np.uint8), bits, len(codes)).tolist() == codes


def test_deepspeed_int4_order_is_the_other_way_round() -> None:
    # DeepSpeed: x[2i] in the high nibble, two's complement: -8 -> 0x8, 7 -> 0x7, -1 -> 0xF.
    codes = np.array([-8, 7, 0, -1], np.int8)
    assert pack_int4_deepspeed(codes).tolist() == [0x87, 0x0F]
    assert unpack_int4_deepspeed(np.array([0x87, 0x0F], np.uint8)).tolist() == codes.tolist()
    assert pack_codes(codes, 4).tolist() != pack_int4_deepspeed(codes).tolist()


@pytest.mark.parametrize("bits", SUPPORTED_BITS)
@pytest.mark.parametrize("count", [1, 7, 8, 9, 1001])
def test_pack_round_trip(bits: int, count: int) -> None:
    half = 2 ** (bits - 1)
    codes = np.random.default_rng(count).integers(-half, half, count).astype(np.int8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == np.uint8 and packed.size == -(-count * bits // 8)
    assert np.array_equal(unpack_codes(packed, bits, count), codes)


def test_unpack_rejects_wrong_length_and_padding() -> None:
    with pytest.raises(QuantizationError, match="take 2 bytes"):
        unpack_codes(np.zeros(3, np.uint8), 4, 3)
    with pytest.raises(QuantizationError, match="padding"):
        unpack_codes(np.array([0x88, 0xF8], np.uint8), 4, 3)  # high nibble of byte 1 is unused
    with pytest.raises(QuantizationError, match="range"):
        pack_codes(np.array([8], np.int8), 4)
