"""The on-disk model repository: ``<root>/<model>/<version>/config.toml`` plus the model files.

Several models and versions are served at once; a model's highest version is its default.
A version whose configuration cannot be read is listed as unavailable with the reason, so one
broken model never stops the others from being served.

A single checkpoint file given where a repository is expected is served through
``checkpoint_repository``: a one-model repository in the cache folder whose one version links
to the file, so serving a checkpoint needs no folder layout or config.toml written by hand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from models.atomic_dir import build_once
from models.knobs import Knobs

CONFIG_FILE = "config.toml"
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Under the cache folder: the one-model repositories ``checkpoint_repository`` builds.
CHECKPOINT_REPOS = "checkpoint-repos"


@dataclass(frozen=True, slots=True)
class BatchingDefaults(Knobs):
    """A version's ``[batching]`` table: the five knobs' start values, and the bound of its
    request queue (not a knob: the tuner never moves it)."""

    max_queue_size: Annotated[
        int,
        Field(ge=1, le=1_000_000, description="Requests waiting at most; more are refused (503)."),
    ] = 1024

    @property
    def knobs(self) -> Knobs:
        """The start values alone, as the one knob type."""
        return Knobs(*Knobs.as_tuple(self))


class ModelConfig(BaseModel):
    """One version's ``config.toml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: Literal["onnxruntime", "tensorflow"]
    path: str = Field(
        description="Model file (ONNX), SavedModel folder or checkpoint file, in the version dir."
    )
    format: Literal["native", "checkpoint"] = Field(
        "native",
        description="native: the runtime's own model file; checkpoint: a block-quantized "
        "checkpoint (models.checkpoint) from which the runtime builds its graph, codes kept "
        "quantized in memory.",
    )
    accuracy_level: int = Field(
        4,
        ge=0,
        le=4,
        description="ONNX Runtime checkpoints: MatMulNBits accuracy_level (4: int8 activations, "
        "the fast path; 0: fp32 arithmetic).",
    )
    weight_memory_budget: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Checkpoints: the weight memory the serving plan may use, as a fraction of "
        "the fp32 weights; within it each quantized tensor runs the way measured fastest here "
        "(packed kernel, dequantized in the graph, or dequantized once at load). Unset: the "
        "serve setting weight_memory_budget.",
    )
    max_batch_size: int = Field(
        64, ge=1, description="Hard limit on rows per batch; requests with more rows are refused."
    )
    slo_ms: float = Field(100.0, gt=0, description="Default deadline of a request, in ms.")
    allow_nonfinite: bool = Field(
        False, description="Accept NaN and infinities in floating-point inputs."
    )
    required: bool = Field(
        True,
        description="The gateway reports ready only once this version is loaded; false: it may "
        "fail to load (say, its backend is not installed here) without holding readiness back.",
    )
    description: str = ""
    batching: BatchingDefaults = BatchingDefaults()

    @model_validator(mode="after")
    def _batch_within_limit(self) -> ModelConfig:
        if self.batching.max_batch_size > self.max_batch_size:
            raise ValueError(
                f"batching.max_batch_size {self.batching.max_batch_size} exceeds "
                f"max_batch_size {self.max_batch_size}"
            )
        return self


@dataclass(frozen=True, slots=True)
class ModelVersion:
    name: str
    version: int
    directory: Path
    config: ModelConfig
    # Where serving plans cache their measured costs (None: in this process only).
    plan_cache_dir: Path | None = None

    @property
    def model_path(self) -> Path:
        return self.directory / self.config.path


def with_plan_defaults(
    version: ModelVersion, *, weight_memory_budget: float, plan_cache_dir: Path
) -> ModelVersion:
    """``version`` with the server's defaults for its serving plan: the weight-memory budget
    where its ``config.toml`` sets none (the model's own setting wins), and where measured
    costs are cached."""
    config = version.config
    if config.weight_memory_budget is None:
        config = config.model_copy(update={"weight_memory_budget": weight_memory_budget})
    return dataclasses.replace(version, config=config, plan_cache_dir=plan_cache_dir)


@dataclass(frozen=True, slots=True)
class BrokenVersion:
    """A version directory that could not be read; served as UNAVAILABLE with ``reason``."""

    name: str
    version: int
    directory: Path
    reason: str


class RepositoryError(Exception):
    """The repository root itself is unusable."""


def read_config(path: Path) -> ModelConfig:
    with path.open("rb") as fh:
        return ModelConfig.model_validate(tomllib.load(fh))


def scan_repository(root: Path) -> list[ModelVersion | BrokenVersion]:
    """Every ``<model>/<version>`` under ``root``, sorted by name then version."""
    if not root.is_dir():
        raise RepositoryError(f"model repository {root} is not a directory")
    found: list[ModelVersion | BrokenVersion] = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if not _MODEL_NAME.match(model_dir.name):
            continue
        for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
            if not version_dir.name.isdigit() or int(version_dir.name) < 1:
                continue
            found.append(_read_version(model_dir.name, int(version_dir.name), version_dir))
    found.sort(key=lambda v: (v.name, v.version))
    return found


def _read_version(name: str, version: int, directory: Path) -> ModelVersion | BrokenVersion:
    cfg_path = directory / CONFIG_FILE
    try:
        config = read_config(cfg_path)
    except FileNotFoundError:
        return BrokenVersion(name, version, directory, f"{CONFIG_FILE} is missing")
    except tomllib.TOMLDecodeError as exc:
        return BrokenVersion(name, version, directory, f"{CONFIG_FILE} is not valid TOML: {exc}")
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return BrokenVersion(name, version, directory, f"{CONFIG_FILE} is invalid: {msgs}")
    mv = ModelVersion(name, version, directory, config)
    if not mv.model_path.exists():
        return BrokenVersion(name, version, directory, f"model file {config.path} is missing")
    if config.format == "native" and _is_safetensors(mv.model_path):
        # Otherwise the runtime tries to parse it as its own format and fails with a protobuf
        # or SavedModel error that does not say what to change.
        return BrokenVersion(
            name,
            version,
            directory,
            f"{config.path} is a block-quantized checkpoint (safetensors): add "
            f'format = "checkpoint" to {directory / CONFIG_FILE}',
        )
    return mv


def _is_safetensors(path: Path) -> bool:
    """A safetensors file: a little-endian u64 header length, then a JSON header."""
    if path.suffix == ".safetensors":
        return True
    if not path.is_file():
        return False
    with path.open("rb") as fh:
        head = fh.read(9)
    return len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 1 << 32


def checkpoint_repository(checkpoint: Path, cache_dir: Path) -> Path:
    """A repository serving the checkpoint file ``checkpoint`` alone, on ONNX Runtime: model
    ``<file stem>``, version 1, the ``config.toml`` defaults otherwise.

    Built once under ``<cache_dir>/checkpoint-repos/``, keyed by the file's absolute path. The
    version folder holds a link to the file, not a copy, so a reload
    (``POST /v2/repository/models/<model>/load``) serves whatever the file holds then. The file's
    own folder is not used as the version folder: reloads fingerprint every file under a
    version folder, and a checkpoint may well lie in a home directory.
    """
    source = checkpoint.resolve()
    if not source.is_file() or not _is_safetensors(source):
        raise RepositoryError(
            f"model repository {checkpoint} is neither a directory nor a block-quantized "
            "checkpoint (safetensors)"
        )
    name = source.name.removesuffix(".safetensors")
    if not _MODEL_NAME.match(name):
        raise RepositoryError(
            f"checkpoint {checkpoint}: {name!r} cannot be a model name (letters, digits, "
            "'_', '.' and '-', starting with a letter or digit): rename the file"
        )
    key = hashlib.sha256(str(source).encode()).hexdigest()[:16]
    root = cache_dir / CHECKPOINT_REPOS / f"{name}-{key}"

    def build(tmp: Path) -> None:
        version = tmp / name / "1"
        version.mkdir(parents=True)
        (version / source.name).symlink_to(source)
        (version / CONFIG_FILE).write_text(_checkpoint_config(source.name), encoding="utf-8")

    def is_complete(folder: Path) -> bool:
        version = folder / name / "1"
        link = version / source.name
        # The config is written last; a link to another file would be another key's folder.
        return (
            (version / CONFIG_FILE).is_file()
            and link.is_symlink()
            and Path(link.readlink()) == source
        )

    return build_once(root, build, is_complete)


def _checkpoint_config(filename: str) -> str:
    # Every other key keeps its default, as in a hand-written config.toml of three lines.
    keys = {"runtime": "onnxruntime", "path": filename, "format": "checkpoint"}
    ModelConfig.model_validate(keys)  # what is written must read back
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items())
