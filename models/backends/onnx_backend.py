"""ONNX Runtime backend: one ``InferenceSession`` per runtime instance.

A version is an ONNX file, or a block-quantized checkpoint (``format = "checkpoint"``) whose
graph is built at load: ``MatMulNBits`` and ``DequantizeLinear`` over the
checkpoint's codes (``models.quant_onnx``), so the session holds the codes, not float weights.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from models.backends import checkpoint_errors, describe, plan_options
from models.backends.devices import (
    CUDA_PROVIDER,
    Placement,
    onnx_actual,
    onnx_expected,
)
from models.backends.loaded_runtime import LoadedRuntime
from models.backends.ort_options import session_options
from models.backends.ort_providers import choose_providers
from models.repository import ModelVersion
from models.runtime import InferenceFailed, ModelLoadError, ModelMetadata, TensorSpec, Threads
from models.serving_plan import ServingPlan

if TYPE_CHECKING:
    import onnx

PLATFORM = "onnxruntime_onnx"
log = logging.getLogger("models.onnx")

# ONNX element type (as InferenceSession reports it) -> numpy dtype name
_DTYPES = {
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(float16)": "float16",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}


def expected_placement() -> Placement:
    """Where a session opened now would run, and why (``iotgw doctor``)."""
    return onnx_expected(ort.get_available_providers(), gpu_package=gpu_package_installed())


@functools.cache  # installed distributions do not change while the gateway runs
def gpu_package_installed() -> bool:
    try:
        importlib.metadata.distribution("onnxruntime-gpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


class OnnxRuntime(LoadedRuntime):
    """A loaded ONNX model; satisfies ``models.runtime.Runtime``."""

    def __init__(self, version: ModelVersion, threads: Threads) -> None:
        path = version.model_path
        checkpoint = version.config.format == "checkpoint"
        if not checkpoint and not path.is_file():
            raise ModelLoadError(f"{describe(version)}: ONNX file {path} does not exist")
        plan: ServingPlan | None = None
        with contextlib.ExitStack() as stack:
            source = str(path)
            if checkpoint:
                # Through a file, not bytes: InferenceSession keeps the bytes it was given for
                # its whole life (to re-create itself on a provider fallback), which would
                # hold a second copy of every weight. The file is gone once ORT has read it.
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="iotgw-")))
                source = str(folder / "model.onnx")
                model, plan = checkpoint_model(version)
                Path(source).write_bytes(model.SerializeToString())
                del model
            requested = choose_providers()
            try:
                self._session: ort.InferenceSession | None = ort.InferenceSession(
                    source,
                    sess_options=session_options(threads, checkpoint=checkpoint),
                    providers=requested,
                )
            except Exception as exc:  # ORT raises its own exception types per failure kind
                raise ModelLoadError(
                    f"{describe(version)}: ONNX Runtime cannot load {path}: {exc}"
                ) from exc
        self._what = describe(version)
        self._threads = threads
        self._placement = onnx_actual(
            expected_placement(), requested, self._session.get_providers()
        )
        if CUDA_PROVIDER in requested and not self._placement.on_gpu:
            log.warning("%s: %s", self._what, self._placement.reason)
        self._metadata = ModelMetadata(
            name=version.name,
            version=str(version.version),
            platform=PLATFORM,
            inputs=_specs(self._session.get_inputs(), self._what),
            outputs=_specs(self._session.get_outputs(), self._what),
            serving_plan=plan,
        )
        self._output_names = [o.name for o in self._metadata.outputs]
        self._announce(log, self._placement.engine)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise InferenceFailed(f"{self._what}: runtime is closed")
        try:
            results = session.run(self._output_names, dict(inputs))
        except Exception as exc:
            raise InferenceFailed(f"{self._what}: inference failed: {exc}") from exc
        return dict(zip(self._output_names, results, strict=True))

    def close(self) -> None:
        # Dropping the last reference frees the session (ORT has no explicit close).
        self._session = None


def checkpoint_model(version: ModelVersion) -> tuple[onnx.ModelProto, ServingPlan | None]:
    """The ONNX graph of a checkpoint version (zoo or imported ONNX architecture) and the
    serving plan it follows (None for an imported graph)."""
    # Deferred: only checkpoints need the checkpoint reader and the graph builders.
    from models.checkpoint import load_checkpoint
    from models.checkpoint_graphs import onnx_model

    with checkpoint_errors(version):
        checkpoint = load_checkpoint(version.model_path)
        return onnx_model(
            checkpoint, version.model_path, version.config.accuracy_level, plan_options(version)
        )


def _specs(args: Sequence[Any], what: str) -> tuple[TensorSpec, ...]:
    specs = []
    for arg in args:
        dtype = _DTYPES.get(arg.type)
        if dtype is None:
            raise ModelLoadError(f"{what}: {arg.name} has unsupported type {arg.type}")
        # Symbolic dims come back as strings and unknown ones as None; both vary per request.
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
        specs.append(TensorSpec(arg.name, dtype, shape))
    return tuple(specs)


def load(version: ModelVersion, threads: Threads) -> OnnxRuntime:
    return OnnxRuntime(version, threads)
