"""The bundled demo model repository, built on demand from the zoo with fixed seeds.

Nothing is downloaded: every model is generated from its ``ModelSpec`` and exported for both
backends with the same weights, so ``sensor_mlp`` and ``sensor_mlp_tf`` compute the same function.
Next to each fp32 model sit its block-quantized versions, ``<model>_int8`` and ``<model>_int4``
(and ``_tf`` twins): one checkpoint file each (``models.checkpoint``), the same weights quantized
with qwZ's rule in blocks of 32 along each kernel's input dimension, served by both runtimes
straight from the codes.
``digits_cnn`` (and its ``_tf``, ``_int8``, ``_int4`` variants) is not generated: it is the model
``iotgw train`` trained on scikit-learn's digits (``models.train.demo_weights``), whose committed
checkpoints are copied as they are (int8, int4: the trainer's own codes and scales, no PTQ) or
exported for both runtimes (fp32). The files' SHA-256 are part of the recipe, so retrained
weights make a cached repository stale.
The repository follows ``models.repository``'s layout and carries a ``MANIFEST.json`` (written
last) with every file's SHA-256, which is how a finished build is recognised.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from models.atomic_dir import build_once
from models.checkpoint import load_checkpoint, save_checkpoint
from models.export_onnx import export_onnx
from models.repository import CONFIG_FILE, BatchingDefaults, ModelConfig, read_config
from models.train.data import DIGITS_CNN
from models.train.demo_weights import TRAINED_FILES, WEIGHTS_DIR
from models.zoo import SENSOR_FUSION, SENSOR_MLP, VISION_CNN, ModelSpec, Weights, init_weights
from models.zoo_checkpoint import dequantized_weights, uniform_policy, zoo_checkpoint, zoo_params

MANIFEST = "MANIFEST.json"
FORMAT = 1
DEMO_DIR_NAME = "demo-repo-v1"
VERSION = 1
_MODEL_FILE = {"onnxruntime": "model.onnx", "tensorflow": "model.savedmodel"}
CHECKPOINT_FILE = "model.safetensors"
QUANT_BLOCK_SIZE = 32
QUANT_BITS = (8, 4)


@dataclass(frozen=True, slots=True)
class DemoModel:
    """One served model of the demo repository: an architecture, a runtime and its config."""

    name: str
    spec: ModelSpec
    runtime: Literal["onnxruntime", "tensorflow"]
    max_batch_size: int
    slo_ms: float
    batching: BatchingDefaults
    bits: int | None = None  # a block-quantized checkpoint at this width; None: fp32 export
    # A trained checkpoint in models/train/weights and its SHA-256 (in the recipe); None: the
    # weights are generated from the spec's seed.
    trained: tuple[str, str] | None = None

    def config(self) -> ModelConfig:
        return ModelConfig(
            runtime=self.runtime,
            path=_MODEL_FILE[self.runtime] if self.bits is None else CHECKPOINT_FILE,
            format="native" if self.bits is None else "checkpoint",
            max_batch_size=self.max_batch_size,
            slo_ms=self.slo_ms,
            description=self.spec.description,
            batching=self.batching,
        )


def _both(
    spec: ModelSpec,
    max_batch_size: int,
    slo_ms: float,
    batching: BatchingDefaults,
    bits: int | None = None,
) -> tuple[DemoModel, DemoModel]:
    name = spec.name if bits is None else f"{spec.name}_int{bits}"
    file = TRAINED_FILES.get((spec.name, bits))
    trained = None if file is None else (file, _sha256(WEIGHTS_DIR / file))
    return (
        DemoModel(name, spec, "onnxruntime", max_batch_size, slo_ms, batching, bits, trained),
        DemoModel(
            f"{name}_tf", spec, "tensorflow", max_batch_size, slo_ms, batching, bits, trained
        ),
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Small models batch wide with a short wait (the per-call overhead dominates); the CNN batches
# less and waits longer, since each row is real work and its deadline is looser.
_SERVING = (
    (SENSOR_MLP, 128, 100.0, BatchingDefaults(max_batch_size=32, batch_timeout_ms=1.0)),
    (VISION_CNN, 128, 250.0, BatchingDefaults(max_batch_size=16, batch_timeout_ms=2.0)),
    (SENSOR_FUSION, 128, 100.0, BatchingDefaults(max_batch_size=32, batch_timeout_ms=1.0)),
)
# The fp32 models, exported as ONNX files and SavedModels.
FLOAT_DEMO_MODELS: tuple[DemoModel, ...] = tuple(m for s in _SERVING for m in _both(*s))
# Their int8 and int4 checkpoints.
QUANTIZED_DEMO_MODELS: tuple[DemoModel, ...] = tuple(
    m for s in _SERVING for bits in QUANT_BITS for m in _both(*s, bits=bits)
)
# Models trained by ``iotgw train`` (not generated from a seed): digits_cnn in fp32 and its
# ZeRO++-trained int8 and int4 checkpoints, each for both runtimes.
_TRAINED = ((DIGITS_CNN, 128, 100.0, BatchingDefaults(max_batch_size=32, batch_timeout_ms=1.0)),)
TRAINED_DEMO_MODELS: tuple[DemoModel, ...] = tuple(
    m for s in _TRAINED for bits in (None, *QUANT_BITS) for m in _both(*s, bits=bits)
)
DEMO_MODELS: tuple[DemoModel, ...] = FLOAT_DEMO_MODELS + QUANTIZED_DEMO_MODELS + TRAINED_DEMO_MODELS


def default_demo_root(environ: Mapping[str, str] = os.environ) -> Path:
    """``$IOTGW_CACHE_DIR/demo-repo-v1``, or ``~/.cache/iotgw/demo-repo-v1`` when it is unset."""
    cache = environ.get("IOTGW_CACHE_DIR")
    base = Path(cache) if cache else Path.home() / ".cache" / "iotgw"
    return base / DEMO_DIR_NAME


def ensure_demo_repository(
    root: Path | None = None, models: tuple[DemoModel, ...] = DEMO_MODELS
) -> Path:
    """The demo repository at ``root`` (default: ``default_demo_root()``), built if incomplete.
    ``models`` narrows it (e.g. ``FLOAT_DEMO_MODELS``); the manifest records which were built.

    Safe under concurrent first use and crashes: the build happens in a hidden sibling folder
    that is renamed into place only when complete.
    """
    root = default_demo_root() if root is None else root
    return build_once(
        root,
        lambda dest: build_demo_repository(dest, models),
        lambda path: is_complete(path, models),
    )


def build_demo_repository(dest: Path, models: tuple[DemoModel, ...] = DEMO_MODELS) -> Path:
    """Write the demo models and then the manifest into ``dest`` (created if missing)."""
    dest.mkdir(parents=True, exist_ok=True)
    for model in models:
        write_model_version(model, dest / model.name / str(VERSION))
    write_manifest(dest, models)
    return dest


def write_model_version(model: DemoModel, directory: Path) -> Path:
    """One ``<model>/<version>`` folder: the exported model and its ``config.toml``."""
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config()
    target = directory / config.path
    if model.trained is not None and model.bits is not None:
        # The trainer's own codes and scales, copied as they are: no PTQ.
        target.write_bytes((WEIGHTS_DIR / model.trained[0]).read_bytes())
    elif model.bits is not None:
        policy = uniform_policy(model.bits, QUANT_BLOCK_SIZE)
        save_checkpoint(zoo_checkpoint(model.spec, model_weights(model), policy), target)
    elif model.runtime == "onnxruntime":
        export_onnx(model.spec, model_weights(model), target)
    else:
        # Deferred: importing TensorFlow costs seconds, and only building needs it.
        from models.export_tf import export_savedmodel

        export_savedmodel(model.spec, model_weights(model), target)
    cfg_path = directory / CONFIG_FILE
    cfg_path.write_text(config_toml(config), encoding="utf-8")
    if read_config(cfg_path) != config:  # the hand-written TOML must round-trip exactly
        raise AssertionError(f"{cfg_path} does not read back as the intended configuration")
    return directory


def model_weights(model: DemoModel) -> Weights:
    """Float weights: the trained fp32 checkpoint's, or generated from the spec's seed."""
    if model.trained is None:
        return init_weights(model.spec)
    source = WEIGHTS_DIR / model.trained[0]
    spec, params = zoo_params(load_checkpoint(source), source)
    if (spec.inputs, spec.layers, spec.output, spec.softmax) != (
        model.spec.inputs,
        model.spec.layers,
        model.spec.output,
        model.spec.softmax,
    ):
        raise AssertionError(f"{source} does not hold the demo's {model.spec.name!r} architecture")
    return dequantized_weights(spec, params)


def config_toml(config: ModelConfig) -> str:
    """The configuration as TOML (flat keys plus a [batching] table)."""
    top = config.model_dump(exclude={"batching"})
    # TOML has no null: a key left unset (None) is written as absent, which reads back the same.
    lines = [f"{key} = {_toml_value(value)}" for key, value in top.items() if value is not None]
    lines += ["", "[batching]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in dataclasses.asdict(config.batching).items()]
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    raise TypeError(f"no TOML form for {value!r}")


def recipe_hash(models: tuple[DemoModel, ...] = DEMO_MODELS) -> str:
    """Identifies what this code would build; a repository built from another recipe is stale."""
    return hashlib.sha256(f"{FORMAT}:{VERSION}:{models!r}".encode()).hexdigest()


def _file_hashes(root: Path) -> dict[str, str]:
    hashes = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST):
        hashes[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _content_hash(files: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def write_manifest(root: Path, models: tuple[DemoModel, ...] = DEMO_MODELS) -> None:
    files = _file_hashes(root)
    manifest = {
        "format": FORMAT,
        "recipe": recipe_hash(models),
        "content_hash": _content_hash(files),
        "files": files,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def is_complete(root: Path, models: tuple[DemoModel, ...] = DEMO_MODELS) -> bool:
    """Whether ``root`` holds a finished build of the current recipe with intact files."""
    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(manifest, dict) or manifest.get("recipe") != recipe_hash(models):
        return False
    files = manifest.get("files")
    return (
        isinstance(files, dict)
        and manifest.get("content_hash") == _content_hash(files)
        and _file_hashes(root) == files
    )
