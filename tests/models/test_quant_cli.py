"""``iotgw quantize`` and ``iotgw inspect``, through the real command-line entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from models.export_onnx import export_onnx
from models.repository import ModelVersion, scan_repository
from models.zoo import SENSOR_MLP, Dense, init_weights
from models.zoo_checkpoint import to_output_major


def _state_dict_source(folder: Path) -> tuple[Path, Path]:
    from safetensors.numpy import save_file

    folder.mkdir()
    state = {}
    mapping: dict[str, Any] = {
        "name": "mlp",
        "inputs": [{"name": "features", "shape": [32]}],
        "layers": [],
    }
    for i, (layer, p) in enumerate(zip(SENSOR_MLP.layers, init_weights(SENSOR_MLP), strict=True)):
        assert p is not None and isinstance(layer, Dense)
        state[f"net.{i}.weight"] = to_output_major(layer, p.kernel)
        state[f"net.{i}.bias"] = p.bias
        mapping["layers"].append(
            {
                "type": "dense",
                "units": int(p.bias.size),
                "activation": layer.activation,
                "weight": f"net.{i}.weight",
                "bias": f"net.{i}.bias",
            }
        )
    save_file(state, str(folder / "model.safetensors"))
    (folder / "mapping.json").write_text(json.dumps(mapping))
    return folder / "model.safetensors", folder / "mapping.json"


def test_quantize_a_state_dict_into_a_served_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, mapping = _state_dict_source(tmp_path / "src")
    out = tmp_path / "repo" / "mlp" / "1" / "model.safetensors"
    argv = ["quantize", "safetensors", str(source), "--mapping", str(mapping), "-o", str(out)]
    assert main([*argv, "--bits", "4", "--block-size", "16", "--config", "tensorflow"]) == 0
    printed = capsys.readouterr().out
    assert "quantized (3):" in printed and "kept in float (3):" in printed
    assert "layers.0.weight (from net.0.weight) [64, 32]: int4" in printed
    assert f"wrote {out}" in printed and "config.toml" in printed
    (version,) = scan_repository(tmp_path / "repo")
    assert isinstance(version, ModelVersion)
    assert (version.config.runtime, version.config.format) == ("tensorflow", "checkpoint")


def test_quantize_onnx_then_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = export_onnx(SENSOR_MLP, init_weights(SENSOR_MLP), tmp_path / "mlp.onnx")
    out = tmp_path / "mlp.safetensors"
    assert main(["quantize", "onnx", str(source), "-o", str(out), "--bits", "8"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "imported ONNX graph, 3 weights rewritten" in text
    assert "checksums: all ok" in text
    assert main(["inspect", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {t["name"]: t for t in doc["tensors"]}
    assert rows["l0_kernel"]["bits"] == 8 and rows["l0_kernel"]["shape"] == [64, 32]
    assert rows["l0_kernel"]["block_size"] == 128 and rows["l0_kernel"]["blocks"] == 64
    assert rows["__onnx_graph__"]["kind"] == "bytes"
    assert doc["ok"] is True
    # damage one tensor: inspect still lists everything, flags it and exits 1
    data = bytearray(out.read_bytes())
    data[-1] ^= 0xFF
    out.write_bytes(bytes(data))
    assert main(["inspect", str(out)]) == 1
    text = capsys.readouterr().out
    assert "checksum mismatch" in text and "1 tensor(s) damaged" in text
    # a file that is no checkpoint at all: exit 2 with the reason on stderr
    out.write_bytes(b"\0" * 4)
    assert main(["inspect", str(out)]) == 2
    assert "truncated" in capsys.readouterr().err


def test_quantize_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.onnx"
    assert main(["quantize", "onnx", str(missing), "-o", str(tmp_path / "o.safetensors")]) == 2
    assert "not a valid ONNX model" in capsys.readouterr().err
    source = export_onnx(SENSOR_MLP, init_weights(SENSOR_MLP), tmp_path / "mlp.onnx")
    argv = ["quantize", "onnx", str(source), "-o", str(tmp_path / "o.safetensors")]
    assert main([*argv, "--block-size", "48"]) == 2
    assert "block_size must be a power of two" in capsys.readouterr().err
    assert main([*argv, "--config", "tensorflow"]) == 2
    assert "onnxruntime only" in capsys.readouterr().err
    assert not (tmp_path / "o.safetensors").exists()


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "quantize" in text and "inspect" in text
    with pytest.raises(SystemExit):
        main(["quantize", "--help"])
    assert "safetensors" in capsys.readouterr().out
