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

from models.backends import checkpoint_errors, describe
from models.backends.devices import (
    CUDA_PROVIDER,
    Placement,
    onnx_actual,
    onnx_expected,
    onnx_providers,
)
from models.repository import ModelVersion
from models.runtime import InferenceFailed, ModelLoadError, ModelMetadata, TensorSpec, Threads

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


def session_options(threads: Threads, *, checkpoint: bool = False) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads.intra_op
    opts.inter_op_num_threads = threads.inter_op
    # The inter-op pool only exists in parallel mode; sequential mode avoids its overhead when
    # there is a single inter-op thread anyway.
    opts.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if threads.inter_op > 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # No busy-waiting between batches. By default ORT's pool threads spin after each parallel
    # section, which only pays off when nothing else wants the cores. Measured on the 2-core
    # target (vision_cnn, 2 intra-op threads, a batch every 2 ms, one busy Python thread standing
    # in for the event loop; 3 runs): spinning raised median batch-1 latency from 11-14 ms to
    # 13-24 ms and slowed the other thread by 15-65%; two such sessions at once served batch-1
    # requests faster without it (318-392 vs 97-272 img/s). A lone session on idle cores does
    # gain (~1 ms at batch 1), but the gateway always has its event loop and usually more than one
    # instance. With 1 thread there is no pool and the setting has no effect.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    if checkpoint:
        # No memory arena: a checkpoint's graph dequantizes convolution kernels on every run,
        # and the arena would keep the largest such transient float copy for the session's
        # lifetime (measured on vision_cnn int4, batch 1: 6.5 MB held after a run with the
        # arena, 1.0 MB without), undoing what quantization saved. Latency, 7 interleaved
        # rounds: vision_cnn int4 0.89x with the arena off, a 25M-weight MLP int4 1.01x.
        opts.enable_cpu_mem_arena = False
    return opts


def choose_providers() -> list[str]:
    """CUDA first when this onnxruntime build has it, CPU always as the fallback."""
    providers = onnx_providers(ort.get_available_providers())
    if CUDA_PROVIDER in providers:
        _preload_cuda_libraries()
    return providers


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


@functools.cache
def _preload_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries of the nvidia-*-cu12 wheels (what iotgw[gpu] installs)
    before the first CUDA session: the CUDA provider finds them only through the system loader
    otherwise, i.e. only where CUDA is installed system-wide. onnxruntime-gpu >= 1.21 has
    ``preload_dlls``; where it fails, the system's libraries are still tried by the session."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    try:
        preload()
    except Exception as exc:  # the session will say what is missing, if anything
        log.warning("onnxruntime.preload_dlls failed: %s", exc)


class OnnxRuntime:
    """A loaded ONNX model; satisfies ``models.runtime.Runtime``."""

    def __init__(self, version: ModelVersion, threads: Threads) -> None:
        path = version.model_path
        checkpoint = version.config.format == "checkpoint"
        if not checkpoint and not path.is_file():
            raise ModelLoadError(f"{describe(version)}: ONNX file {path} does not exist")
        with contextlib.ExitStack() as stack:
            source = str(path)
            if checkpoint:
                # Through a file, not bytes: InferenceSession keeps the bytes it was given for
                # its whole life (to re-create itself on a provider fallback), which would
                # hold a second copy of every weight. The file is gone once ORT has read it.
                folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="iotgw-")))
                source = str(folder / "model.onnx")
                Path(source).write_bytes(checkpoint_model(version).SerializeToString())
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
        )
        self._output_names = [o.name for o in self._metadata.outputs]
        log.info(
            "loaded %s on %s (%s, intra_op=%d inter_op=%d)",
            self._what,
            self._placement.device,
            self._placement.engine,
            threads.intra_op,
            threads.inter_op,
        )

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    @property
    def threads(self) -> Threads:
        return self._threads

    @property
    def device(self) -> str:
        return self._placement.device

    @property
    def placement(self) -> Placement:
        return self._placement

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


def checkpoint_model(version: ModelVersion) -> onnx.ModelProto:
    """The ONNX graph of a checkpoint version (zoo or imported ONNX architecture)."""
    # Deferred: only checkpoints need the checkpoint reader and the graph builders.
    from models.checkpoint import load_checkpoint
    from models.checkpoint_graphs import onnx_model

    with checkpoint_errors(version):
        checkpoint = load_checkpoint(version.model_path)
        return onnx_model(checkpoint, version.model_path, version.config.accuracy_level)


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
