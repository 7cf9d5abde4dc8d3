"""The demo repository: layout, configs, determinism, idempotence, broken versions."""

from __future__ import annotations

import shutil
from pathlib import Path

from models.demo import (
    DEMO_DIR_NAME,
    DEMO_MODELS,
    FLOAT_DEMO_MODELS,
    MANIFEST,
    QUANTIZED_DEMO_MODELS,
    config_toml,
    default_demo_root,
    ensure_demo_repository,
    is_complete,
    write_model_version,
)
from models.repository import CONFIG_FILE, BrokenVersion, ModelVersion, read_config, scan_repository


def test_scan_lists_every_demo_model(full_demo_repo: Path, demo_repo: Path) -> None:
    found = scan_repository(full_demo_repo)
    assert [(v.name, v.version) for v in found] == sorted((m.name, 1) for m in DEMO_MODELS)
    assert all(isinstance(v, ModelVersion) for v in found)
    by_name = {v.name: v for v in found if isinstance(v, ModelVersion)}
    for model in DEMO_MODELS:
        assert by_name[model.name].config == model.config()
    floats = sorted((v.name, v.version) for v in scan_repository(demo_repo))
    assert floats == sorted((m.name, 1) for m in FLOAT_DEMO_MODELS)


def test_quantized_demo_models() -> None:
    """int8 and int4 of every fp32 model, for both runtimes, from one kind of checkpoint."""
    names = {m.name for m in QUANTIZED_DEMO_MODELS}
    for model in FLOAT_DEMO_MODELS:
        base, tf = (model.name[:-3], "_tf") if model.name.endswith("_tf") else (model.name, "")
        assert {f"{base}_int8{tf}", f"{base}_int4{tf}"} <= names
    for model in QUANTIZED_DEMO_MODELS:
        config = model.config()
        assert (config.format, config.path, config.accuracy_level) == (
            "checkpoint",
            "model.safetensors",
            4,
        )
        assert config.runtime == ("tensorflow" if model.name.endswith("_tf") else "onnxruntime")


def test_demo_configs(demo_repo: Path) -> None:
    mlp = read_config(demo_repo / "sensor_mlp" / "1" / CONFIG_FILE)
    assert (mlp.runtime, mlp.path, mlp.slo_ms) == ("onnxruntime", "model.onnx", 100.0)
    assert (mlp.batching.max_batch_size, mlp.batching.batch_timeout_ms) == (32, 1.0)
    cnn = read_config(demo_repo / "vision_cnn_tf" / "1" / CONFIG_FILE)
    assert (cnn.runtime, cnn.path, cnn.slo_ms) == ("tensorflow", "model.savedmodel", 250.0)
    assert (cnn.batching.max_batch_size, cnn.batching.batch_timeout_ms) == (16, 2.0)
    assert cnn.max_batch_size == 128


def test_broken_config_is_reported_not_fatal(demo_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("sensor_mlp", "sensor_fusion"):
        shutil.copytree(demo_repo / name, repo / name)
    (repo / "sensor_fusion" / "1" / CONFIG_FILE).write_text('runtime = "onnxruntime"\npath = [')
    (repo / "sensor_mlp" / "2").mkdir()
    shutil.copy(demo_repo / "sensor_mlp" / "1" / "model.onnx", repo / "sensor_mlp" / "2")
    (repo / "sensor_mlp" / "2" / CONFIG_FILE).write_text('runtime = "pytorch"\npath = "x"\n')
    found = {(v.name, v.version): v for v in scan_repository(repo)}
    assert isinstance(found["sensor_mlp", 1], ModelVersion)
    fusion = found["sensor_fusion", 1]
    assert isinstance(fusion, BrokenVersion)
    assert "not valid TOML" in fusion.reason
    mlp2 = found["sensor_mlp", 2]
    assert isinstance(mlp2, BrokenVersion)
    assert "runtime" in mlp2.reason


def test_onnx_and_checkpoint_files_are_byte_identical_across_builds(
    full_demo_repo: Path, tmp_path: Path
) -> None:
    for model in DEMO_MODELS:
        if model.runtime != "onnxruntime" and model.bits is None:
            continue  # SavedModels are not byte-reproducible
        file = model.config().path
        rebuilt = write_model_version(model, tmp_path / model.name)
        original = full_demo_repo / model.name / "1"
        assert (rebuilt / file).read_bytes() == (original / file).read_bytes()
        assert (rebuilt / CONFIG_FILE).read_text() == (original / CONFIG_FILE).read_text()


def _file_identities(root: Path) -> dict[str, tuple[int, int, int]]:
    """(inode, mtime, size) of every file under ``root``: a rebuild, even of identical bytes,
    writes new files (a new folder renamed into place) and so changes them."""
    return {
        str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_ensure_is_idempotent(demo_repo: Path) -> None:
    before = _file_identities(demo_repo)
    assert MANIFEST in before
    # A build happens in a sibling folder, created and then renamed or removed: either changes
    # the parent folder's mtime. (The fixture's folder: nothing else writes there.)
    parent_before = demo_repo.parent.stat().st_mtime_ns
    assert ensure_demo_repository(demo_repo, FLOAT_DEMO_MODELS) == demo_repo
    assert _file_identities(demo_repo) == before  # verified, not rebuilt...
    assert demo_repo.parent.stat().st_mtime_ns == parent_before  # ...not even beside it
    assert [p.name for p in demo_repo.parent.iterdir() if p.name.startswith(".")] == []


def test_tampered_copy_is_incomplete(demo_repo: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(demo_repo, copy)
    assert is_complete(copy, FLOAT_DEMO_MODELS)
    assert not is_complete(copy)  # the full recipe has more models
    with (copy / "sensor_mlp" / "1" / "model.onnx").open("ab") as fh:
        fh.write(b"\0")
    assert not is_complete(copy, FLOAT_DEMO_MODELS)
    (copy / MANIFEST).unlink()
    assert not is_complete(copy, FLOAT_DEMO_MODELS)


def test_default_root(tmp_path: Path) -> None:
    assert default_demo_root({"IOTGW_CACHE_DIR": str(tmp_path)}) == tmp_path / DEMO_DIR_NAME
    assert default_demo_root({}) == Path.home() / ".cache" / "iotgw" / DEMO_DIR_NAME


def test_config_toml_round_trips(tmp_path: Path) -> None:
    for model in DEMO_MODELS:
        path = tmp_path / f"{model.name}.toml"
        path.write_text(config_toml(model.config()))
        assert read_config(path) == model.config()
