"""The bundled demo model repository, built on demand from the zoo with fixed seeds.

Nothing is downloaded: every model is generated from its ``ModelSpec`` and exported for both
backends with the same weights, so ``sensor_mlp`` and ``sensor_mlp_tf`` compute the same function.
The repository follows ``models.repository``'s layout and carries a ``MANIFEST.json`` (written
last) with every file's SHA-256, which is how a finished build is recognised.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from models.atomic_dir import build_once
from models.export_onnx import export_onnx
from models.repository import CONFIG_FILE, BatchingDefaults, ModelConfig, read_config
from models.zoo import SENSOR_FUSION, SENSOR_MLP, VISION_CNN, ModelSpec, init_weights

MANIFEST = "MANIFEST.json"
FORMAT = 1
DEMO_DIR_NAME = "demo-repo-v1"
VERSION = 1
_MODEL_FILE = {"onnxruntime": "model.onnx", "tensorflow": "model.savedmodel"}


@dataclass(frozen=True, slots=True)
class DemoModel:
    """One served model of the demo repository: an architecture, a runtime and its config."""

    name: str
    spec: ModelSpec
    runtime: Literal["onnxruntime", "tensorflow"]
    max_batch_size: int
    slo_ms: float
    batching: BatchingDefaults

    def config(self) -> ModelConfig:
        return ModelConfig(
            runtime=self.runtime,
            path=_MODEL_FILE[self.runtime],
            max_batch_size=self.max_batch_size,
            slo_ms=self.slo_ms,
            description=self.spec.description,
            batching=self.batching,
        )


def _both(
    spec: ModelSpec, max_batch_size: int, slo_ms: float, batching: BatchingDefaults
) -> tuple[DemoModel, DemoModel]:
    return (
        DemoModel(spec.name, spec, "onnxruntime", max_batch_size, slo_ms, batching),
        DemoModel(f"{spec.name}_tf", spec, "tensorflow", max_batch_size, slo_ms, batching),
    )


# Small models batch wide with a short wait (the per-call overhead dominates); the CNN batches
# less and waits longer, since each row is real work and its deadline is looser.
DEMO_MODELS: tuple[DemoModel, ...] = (
    *_both(SENSOR_MLP, 128, 100.0, BatchingDefaults(max_batch_size=32, batch_timeout_ms=1.0)),
    *_both(VISION_CNN, 128, 250.0, BatchingDefaults(max_batch_size=16, batch_timeout_ms=2.0)),
    *_both(SENSOR_FUSION, 128, 100.0, BatchingDefaults(max_batch_size=32, batch_timeout_ms=1.0)),
)


def default_demo_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$IOTGW_CACHE_DIR/demo-repo-v1``, or ``~/.cache/iotgw/demo-repo-v1`` when it is unset."""
    cache = environ.get("IOTGW_CACHE_DIR")
    base = Path(cache) if cache else Path.home() / ".cache" / "iotgw"
    return base / DEMO_DIR_NAME


def ensure_demo_repository(root: Path | None = None) -> Path:
    """The demo repository at ``root`` (default: ``default_demo_root()``), built if incomplete.

    Safe under concurrent first use and crashes: the build happens in a hidden sibling folder
    that is renamed into place only when complete.
    """
    root = default_demo_root() if root is None else root
    return build_once(root, build_demo_repository, is_complete)


def build_demo_repository(dest: Path) -> Path:
    """Write every demo model and then the manifest into ``dest`` (created if missing)."""
    dest.mkdir(parents=True, exist_ok=True)
    for model in DEMO_MODELS:
        write_model_version(model, dest / model.name / str(VERSION))
    write_manifest(dest)
    return dest


def write_model_version(model: DemoModel, directory: Path) -> Path:
    """One ``<model>/<version>`` folder: the exported model and its ``config.toml``."""
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config()
    weights = init_weights(model.spec)
    target = directory / config.path
    if model.runtime == "onnxruntime":
        export_onnx(model.spec, weights, target)
    else:
        # Deferred: importing TensorFlow costs seconds, and only building needs it.
        from models.export_tf import export_savedmodel

        export_savedmodel(model.spec, weights, target)
    cfg_path = directory / CONFIG_FILE
    cfg_path.write_text(config_toml(config), encoding="utf-8")
    if read_config(cfg_path) != config:  # the hand-written TOML must round-trip exactly
        raise AssertionError(f"{cfg_path} does not read back as the intended configuration")
    return directory


def config_toml(config: ModelConfig) -> str:
    """The configuration as TOML (flat keys plus a [batching] table)."""
    top = config.model_dump(exclude={"batching"})
    lines = [f"{key} = {_toml_value(value)}" for key, value in top.items()]
    lines += ["", "[batching]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in config.batching.model_dump().items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    raise TypeError(f"no TOML form for {value!r}")


def recipe_hash() -> str:
    """Identifies what this code would build; a repository built from another recipe is stale."""
    return hashlib.sha256(f"{FORMAT}:{VERSION}:{DEMO_MODELS!r}".encode()).hexdigest()


def _file_hashes(root: Path) -> dict[str, str]:
    hashes = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        hashes[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _content_hash(files: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def write_manifest(root: Path) -> None:
    files = _file_hashes(root)
    manifest = {
        "format": FORMAT,
        "recipe": recipe_hash(),
        "content_hash": _content_hash(files),
        "files": files,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def is_complete(root: Path) -> bool:
    """Whether ``root`` holds a finished build of the current recipe with intact files."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("recipe") != recipe_hash():
        return False
    files = manifest.get("files")
    return (
        isinstance(files, dict)
        and manifest.get("content_hash") == _content_hash(files)
        and _file_hashes(root) == files
    )
