"""Backends behind the ``Runtime`` protocol, chosen by a version's ``config.runtime``.

Backend modules are imported on first use: importing TensorFlow takes seconds and hundreds of
megabytes, which a gateway serving only ONNX models should never pay.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from models.extras import missing_module_hint
from models.repository import ModelVersion
from models.runtime import ModelLoadError, Runtime, Threads
from models.serving_plan import DEFAULT_WEIGHT_MEMORY_BUDGET, PlanOptions

# config.runtime -> module defining ``load(version, threads) -> Runtime``
_BACKENDS = {
    "onnxruntime": "models.backends.onnx_backend",
    "tensorflow": "models.backends.tf_backend",
}


def load_runtime(version: ModelVersion, threads: Threads) -> Runtime:
    """Open one session of ``version`` with its operation-level threads fixed to ``threads``.

    Raises ``ModelLoadError`` (naming the model, version and file) when it cannot be loaded.
    """
    if threads.intra_op < 1 or threads.inter_op < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    module_name = _BACKENDS.get(version.config.runtime)
    if module_name is None:
        raise ModelLoadError(
            f"{describe(version)}: unknown runtime {version.config.runtime!r} "
            f"(known: {', '.join(sorted(_BACKENDS))})"
        )
    try:
        backend = importlib.import_module(module_name)
        runtime: Runtime = backend.load(version, threads)
    except ImportError as exc:
        # A backend library (TensorFlow) or a package a checkpoint needs at load (onnx) that this
        # install left out: name the extra that brings it. The model is then served UNAVAILABLE
        # with this reason and the others serve.
        why = missing_module_hint(exc) or f"{version.config.runtime} failed to import: {exc}"
        raise ModelLoadError(f"{describe(version)}: {why}") from exc
    return runtime


def describe(version: ModelVersion) -> str:
    """How errors name a model version and its file."""
    return f"model {version.name!r} version {version.version} ({version.model_path})"


@contextlib.contextmanager
def checkpoint_errors(version: ModelVersion) -> Iterator[None]:
    """Re-raise a checkpoint's problems (``models.checkpoint.CheckpointError``, which names the
    file and tensor) as ``ModelLoadError`` naming the model version too."""
    try:
        yield
    except ModelLoadError as exc:
        raise ModelLoadError(f"model {version.name!r} version {version.version}: {exc}") from exc


def plan_options(version: ModelVersion) -> PlanOptions:
    """The serving plan's budget (the version's, else the default) and cost cache folder."""
    budget = version.config.weight_memory_budget
    return PlanOptions(
        DEFAULT_WEIGHT_MEMORY_BUDGET if budget is None else budget, version.plan_cache_dir
    )


__all__ = ["checkpoint_errors", "describe", "load_runtime", "plan_options"]
