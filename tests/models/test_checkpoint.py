"""The checkpoint file: exact round trips, and every kind of damage failing with its name."""

from __future__ import annotations

import json
import pickle
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from models.checkpoint import (
    METADATA_KEY,
    Checkpoint,
    CheckpointError,
    QuantizedTensor,
    content_hash,
    load_checkpoint,
    save_checkpoint,
    sha256_of,
)
from models.checkpoint_summary import summarize
from models.quant import BlockQuantized, quantize_blocks
from models.zoo import SENSOR_MLP, VISION_CNN, init_weights
from models.zoo_checkpoint import (
    QuantParams,
    dequantized_weights,
    to_output_major,
    uniform_policy,
    zoo_checkpoint,
    zoo_params,
)

# The 8-bit golden row of test_quant: m = 2, d = 1/64.
GOLDEN = [2.0, -2.0, 1 / 128, 3 / 128, 5 / 128, -1 / 128, -3 / 128, 7 / 128, 1.0, -1.0, 0.5]
GOLDEN_DEQUANTIZED = [1.984375, -2.0, 0.0, 0.03125, 0.03125, 0.0, -0.03125, 0.0625, 1.0, -1.0, 0.5]


def _quantized(rows: np.ndarray, bits: int, block: int, shape: tuple[int, ...]) -> QuantizedTensor:
    return QuantizedTensor(shape, "float32", quantize_blocks(rows, bits, block))


def _sample() -> Checkpoint:
    golden = np.zeros((2, 16), np.float32)
    golden[0, : len(GOLDEN)] = GOLDEN
    rng = np.random.default_rng(0)
    tensors: dict[str, Any] = {
        "golden": _quantized(golden, 8, 16, (2, 16)),
        "conv": _quantized(rng.standard_normal((4, 27)).astype(np.float32), 4, 16, (4, 3, 3, 3)),
        "bias": np.arange(4, dtype=np.float32),
        "norm": np.ones(3, np.float16),
        "blob": np.frombuffer(b"graph bytes", np.uint8),
    }
    for bits in (2, 3, 6):
        tensors[f"w{bits}"] = _quantized(
            rng.standard_normal((3, 50)).astype(np.float32), bits, 16, (3, 50)
        )
    return Checkpoint({"kind": "test"}, tensors, frozenset({"blob"}))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_checkpoint(_sample(), tmp_path / "model.safetensors")


def test_round_trip_is_exact(saved: Path) -> None:
    original = _sample()
    loaded = load_checkpoint(saved)
    assert dict(loaded.architecture) == {"kind": "test"}
    assert loaded.byte_tensors == {"blob"}
    golden = loaded.tensors["golden"]
    assert isinstance(golden, QuantizedTensor)
    assert golden.dequantize()[0, : len(GOLDEN)].tolist() == GOLDEN_DEQUANTIZED
    assert golden.dequantize()[1].tolist() == [0.0] * 16  # a zero block: d = 1, codes 0
    for name, tensor in original.tensors.items():
        got = loaded.tensors[name]
        if isinstance(tensor, QuantizedTensor):
            assert isinstance(got, QuantizedTensor)
            assert (got.shape, got.dtype, got.data.bits) == (
                tensor.shape,
                "float32",
                tensor.data.bits,
            )
            assert np.array_equal(got.data.codes, tensor.data.codes)
            assert np.array_equal(got.data.scales, tensor.data.scales)
            assert np.array_equal(got.dequantize(), tensor.dequantize())
        else:
            assert isinstance(got, np.ndarray) and got.dtype == tensor.dtype
            assert np.array_equal(got, tensor)


def test_zoo_round_trip(tmp_path: Path) -> None:
    weights = init_weights(VISION_CNN)
    path = save_checkpoint(
        zoo_checkpoint(VISION_CNN, weights, uniform_policy(4, 32)), tmp_path / "m.safetensors"
    )
    spec, params = zoo_params(load_checkpoint(path), path)
    assert spec.layers == VISION_CNN.layers and spec.inputs == VISION_CNN.inputs
    for layer, p, w in zip(spec.layers, params, weights, strict=True):
        if w is None:
            assert p is None
            continue
        assert isinstance(p, QuantParams)
        kernel = to_output_major(layer, w.kernel)
        expected = quantize_blocks(kernel.reshape(kernel.shape[0], -1), 4, 32)
        assert np.array_equal(p.kernel.data.codes, expected.codes)
        assert np.array_equal(p.kernel.dequantize(), expected.dequantize().reshape(kernel.shape))
        assert np.array_equal(p.bias, w.bias)
    float_path = save_checkpoint(
        zoo_checkpoint(VISION_CNN, weights, uniform_policy(None, 32)), tmp_path / "f.safetensors"
    )
    _, float_params = zoo_params(load_checkpoint(float_path), float_path)
    for got, w in zip(dequantized_weights(VISION_CNN, float_params), weights, strict=True):
        assert (got is None) == (w is None)
        if got is not None and w is not None:
            assert np.array_equal(got.kernel, w.kernel) and np.array_equal(got.bias, w.bias)


def test_same_checkpoint_same_bytes(tmp_path: Path) -> None:
    a = save_checkpoint(_sample(), tmp_path / "a.safetensors")
    b = save_checkpoint(_sample(), tmp_path / "b.safetensors")
    assert a.read_bytes() == b.read_bytes()


def test_loading_never_unpickles(tmp_path: Path, saved: Path) -> None:
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
            return (Path.touch, (marker,))

    evil = tmp_path / "evil.safetensors"
    evil.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError):
        load_checkpoint(evil)
    assert not marker.exists()
    events: list[str] = []
    sys.addaudithook(lambda event, _args: events.append(event) if "pickle" in event else None)
    load_checkpoint(saved)
    assert events == []


# -- damage ------------------------------------------------------------------------------------


def _raw(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _write_raw(path: Path, header: dict[str, Any], payload: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + payload)


def _edit_metadata(path: Path, edit: Callable[[dict[str, Any]], None], *, rehash: bool) -> None:
    header, payload = _raw(path)
    doc = json.loads(header["__metadata__"][METADATA_KEY])
    edit(doc)
    if rehash:
        doc["content_sha256"] = content_hash(doc["architecture"], doc["tensors"])
    header["__metadata__"][METADATA_KEY] = json.dumps(doc)
    _write_raw(path, header, payload)


def _flip(path: Path, stored: str, index: int, mask: int) -> None:
    """XOR one byte of a stored tensor's data (``index`` may be negative)."""
    header, payload = _raw(path)
    begin, end = header[stored]["data_offsets"]
    data = bytearray(payload)
    data[(begin if index >= 0 else end) + index] ^= mask
    _write_raw(path, header, bytes(data))


def _fails(path: Path, *fragments: str, tensor: str | None = None) -> CheckpointError:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert info.value.tensor == tensor, str(info.value)
    assert str(path) in str(info.value)
    return info.value


def test_truncated_data_names_the_first_tensor_cut(saved: Path) -> None:
    header, payload = _raw(saved)
    last = max(
        (name for name in header if name != "__metadata__"),
        key=lambda n: header[n]["data_offsets"][1],
    )
    _write_raw(saved, header, payload[: header[last]["data_offsets"][0] + 1])
    _fails(saved, "truncated", tensor=last)


@pytest.mark.parametrize("keep", [0, 5, 20])
def test_truncated_header(saved: Path, keep: int) -> None:
    saved.write_bytes(saved.read_bytes()[:keep])
    _fails(saved, "truncated")


def test_flipped_byte_in_codes(saved: Path) -> None:
    _flip(saved, "conv.codes", 2, 0x10)
    _fails(saved, "checksum mismatch (conv.codes)", tensor="conv")


def test_flipped_byte_in_a_float_tensor(saved: Path) -> None:
    _flip(saved, "bias", -1, 0x01)
    _fails(saved, "checksum mismatch", tensor="bias")


def test_altered_metadata_fails_its_checksum(saved: Path) -> None:
    _edit_metadata(saved, lambda d: d["tensors"]["conv"].update(block_size=32), rehash=False)
    _fails(saved, "metadata was altered")


def test_consistently_altered_metadata_contradicts_the_data(saved: Path) -> None:
    # bits 4 -> 8 with the checksum recomputed: the packed codes no longer have the right size.
    _edit_metadata(saved, lambda d: d["tensors"]["conv"].update(bits=8), rehash=True)
    _fails(saved, "inconsistent", "'conv.codes' is uint8 [54]", "uint8 [108]", tensor="conv")


def test_dtype_contradicting_the_data(saved: Path) -> None:
    _edit_metadata(saved, lambda d: d["tensors"]["norm"].update(dtype="float32"), rehash=True)
    _fails(saved, "inconsistent", "float16", tensor="norm")


def test_invalid_metadata_values(saved: Path) -> None:
    _edit_metadata(saved, lambda d: d["tensors"]["w6"].update(bits=5), rehash=True)
    _fails(saved, "invalid metadata", "w6", "bits")


def test_newer_format_version(saved: Path) -> None:
    _edit_metadata(saved, lambda d: d.update(format_version=2), rehash=False)
    _fails(saved, "format version 2 is newer")


def test_tensor_missing_from_the_file(saved: Path) -> None:
    header, payload = _raw(saved)
    header["extra"] = header.pop("w3.scales")
    _write_raw(saved, header, payload)
    _fails(saved, "missing", "'w3.scales'", tensor="w3")


def test_tensor_not_described(saved: Path) -> None:
    header, payload = _raw(saved)
    header["stowaway"] = header.pop("blob")
    _edit_metadata_in(header, lambda d: d["tensors"].pop("blob"))
    _write_raw(saved, header, payload)
    _fails(saved, "not described by the metadata", tensor="stowaway")


def _edit_metadata_in(header: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> None:
    doc = json.loads(header["__metadata__"][METADATA_KEY])
    edit(doc)
    doc["content_sha256"] = content_hash(doc["architecture"], doc["tensors"])
    header["__metadata__"][METADATA_KEY] = json.dumps(doc)


def test_codes_that_no_qwz_quantizer_wrote(tmp_path: Path) -> None:
    # Halved codes: no block reaches -2^(b-1) or 2^(b-1)-1 any more, as the block's absmax must.
    good = quantize_blocks(
        np.random.default_rng(4).standard_normal((2, 32)).astype(np.float32), 8, 16
    )
    bad = BlockQuantized((good.codes // 2).astype(np.int8), good.scales, 8, 16)
    path = save_checkpoint(
        Checkpoint({"kind": "test"}, {"w": QuantizedTensor((2, 32), "float32", bad)}),
        tmp_path / "bad.safetensors",
    )
    _fails(path, "inconsistent: block 0 has no code at -2^(b-1) or 2^(b-1)-1", tensor="w")


def test_zero_codes_with_a_scale_other_than_one(tmp_path: Path) -> None:
    data = BlockQuantized(np.zeros((1, 16), np.int8), np.full((1, 1), 0.5, np.float32), 4, 16)
    path = save_checkpoint(
        Checkpoint({"kind": "test"}, {"w": QuantizedTensor((1, 16), "float32", data)}),
        tmp_path / "bad.safetensors",
    )
    _fails(path, "block 0", "zero block with scale 1", tensor="w")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1.0])
def test_bad_scales(tmp_path: Path, value: float) -> None:
    good = quantize_blocks(np.ones((1, 32), np.float32), 8, 16)
    scales = good.scales.copy()
    scales[0, 1] = value
    data = BlockQuantized(good.codes, scales, 8, 16)
    path = save_checkpoint(
        Checkpoint({"kind": "test"}, {"w": QuantizedTensor((1, 32), "float32", data)}),
        tmp_path / "bad.safetensors",
    )
    _fails(path, "scale of block 1", "not a positive number", tensor="w")


def test_padding_bits_must_be_zero(saved: Path) -> None:
    # w3: 150 codes of 3 bits = 450 bits in 57 bytes; the top 6 bits of the last byte are
    # padding. Set one and fix the checksums, as a buggy writer would have.
    _flip(saved, "w3.codes", -1, 0x80)
    header, payload = _raw(saved)
    begin, end = header["w3.codes"]["data_offsets"]
    digest = sha256_of(np.frombuffer(payload[begin:end], np.uint8))
    _edit_metadata_in(header, lambda d: d["tensors"]["w3"]["codes"].update(sha256=digest))
    _write_raw(saved, header, payload)
    _fails(saved, "corrupt codes", "padding", tensor="w3")


def test_not_a_checkpoint(tmp_path: Path) -> None:
    plain = tmp_path / "state_dict.safetensors"
    save_file({"fc.weight": np.ones((2, 2), np.float32)}, str(plain))
    _fails(plain, "not an iotgw checkpoint", "iotgw quantize safetensors")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"{]]}")
    _fails(garbage, "not valid JSON")
    _fails(tmp_path / "absent.safetensors", "does not exist")


def test_zoo_architecture_must_fit_the_tensors(tmp_path: Path) -> None:
    weights = init_weights(SENSOR_MLP)
    good = zoo_checkpoint(SENSOR_MLP, weights, uniform_policy(8, 16))
    tensors = dict(good.tensors)
    tensors["layers.1.bias"] = np.zeros(3, np.float32)
    path = save_checkpoint(Checkpoint(good.architecture, tensors), tmp_path / "a.safetensors")
    with pytest.raises(CheckpointError, match=r"'layers.1.bias'.*shape \[3\].*needs \[64\]"):
        zoo_params(load_checkpoint(path), path)
    tensors = dict(good.tensors)
    del tensors["layers.2.weight"]
    path = save_checkpoint(Checkpoint(good.architecture, tensors), tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match=r"'layers.2.weight': missing"):
        zoo_params(load_checkpoint(path), path)
    tensors = {**good.tensors, "layers.9.weight": np.zeros(2, np.float32)}
    path = save_checkpoint(Checkpoint(good.architecture, tensors), tmp_path / "c.safetensors")
    with pytest.raises(CheckpointError, match=r"'layers.9.weight': not used"):
        zoo_params(load_checkpoint(path), path)
    bad_arch = {"kind": "zoo", "spec": {"name": "x", "inputs": [], "layers": []}}
    path = save_checkpoint(Checkpoint(bad_arch, {}), tmp_path / "d.safetensors")
    with pytest.raises(CheckpointError, match="invalid architecture"):
        zoo_params(load_checkpoint(path), path)


def test_summary_reports_each_tensor(saved: Path) -> None:
    summary = summarize(saved)
    assert summary.ok and summary.format_version == 1
    rows = {t.name: t for t in summary.tensors}
    assert (rows["conv"].kind, rows["conv"].bits, rows["conv"].block_size) == ("quantized", 4, 16)
    assert rows["conv"].shape == (4, 3, 3, 3) and rows["conv"].blocks == 8  # 4 rows x 2 blocks
    assert rows["conv"].stored_bytes == 54 + 8 * 4  # 108 codes of 4 bits, 8 float32 scales
    assert rows["conv"].float32_bytes == 108 * 4
    assert (rows["norm"].kind, rows["norm"].dtype) == ("float", "float16")
    _flip(saved, "w6.scales", 0, 0x01)
    damaged = summarize(saved)
    assert not damaged.ok
    assert [t.name for t in damaged.tensors if t.checksum != "ok"] == ["w6"]
