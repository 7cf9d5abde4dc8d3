"""Where a backend runs (GPU or CPU) and why: the one decision the backends make and
``iotgw doctor`` reports.

Pure functions of what the libraries report (ONNX Runtime's available providers, the providers a
session ended up with, TensorFlow's GPU list), so that every branch, the GPU ones included, is
tested on a machine without a GPU by passing what a GPU machine would report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"
GPU_DEVICE = "cuda:0"
CPU_DEVICE = "cpu"


@dataclass(frozen=True, slots=True)
class Placement:
    """What one runtime instance runs on: ``device`` as the Runtime protocol names it
    (``cuda:0``/``cpu``), ``engine`` in the library's own words (an execution provider, a TF
    device), and ``reason``, the why in one line."""

    device: str
    engine: str
    reason: str

    @property
    def on_gpu(self) -> bool:
        return self.device != CPU_DEVICE


# -- ONNX Runtime ---------------------------------------------------------------------------------


def onnx_providers(available: Sequence[str]) -> list[str]:
    """The providers a session asks for: CUDA first when this onnxruntime build has it, CPU
    always as the fallback (ONNX Runtime falls back to it when CUDA cannot initialise)."""
    if CUDA_PROVIDER in available:
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


def onnx_expected(available: Sequence[str], *, gpu_package: bool) -> Placement:
    """Where a new session will run, before one is opened. ``gpu_package``: whether the
    ``onnxruntime-gpu`` distribution is installed (the reason differs when it is installed yet
    its provider is absent: the CPU wheel was installed over it)."""
    if CUDA_PROVIDER in available:
        return Placement(GPU_DEVICE, CUDA_PROVIDER, f"{CUDA_PROVIDER} available")
    if gpu_package:
        why = (
            "onnxruntime-gpu is installed but the CPU onnxruntime wheel shadows it "
            "(pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu)"
        )
    else:
        why = "onnxruntime-gpu not installed"
    return Placement(CPU_DEVICE, CPU_PROVIDER, f"{CUDA_PROVIDER} not available: {why}")


def onnx_actual(
    expected: Placement, requested: Sequence[str], session_providers: Sequence[str]
) -> Placement:
    """Where an opened session runs, given what ``onnx_expected`` said before it was opened.
    ONNX Runtime drops a provider that fails to initialise (missing CUDA/cuDNN libraries, no
    usable GPU) with only a log line, so a session that asked for CUDA and did not get it is
    reported as a fallback."""
    first = session_providers[0] if session_providers else CPU_PROVIDER
    if first == CUDA_PROVIDER:
        return Placement(GPU_DEVICE, CUDA_PROVIDER, f"{CUDA_PROVIDER} available")
    if CUDA_PROVIDER in requested:
        return Placement(
            CPU_DEVICE,
            first,
            f"{CUDA_PROVIDER} failed to initialise, fell back to CPU (CUDA or cuDNN libraries "
            "missing, or no usable GPU: see ONNX Runtime's log and `iotgw doctor`)",
        )
    return expected


# -- TensorFlow -----------------------------------------------------------------------------------


def tf_expected(gpus: Sequence[object], *, built_with_cuda: bool) -> Placement:
    """Where a TensorFlow session places its ops: the first GPU when TensorFlow sees one (soft
    placement keeps ops without a GPU kernel on the CPU), else the CPU."""
    if gpus:
        return Placement(GPU_DEVICE, "GPU:0", f"{len(gpus)} GPU(s) visible to TensorFlow")
    if not built_with_cuda:
        # iotgw is installed from a checkout (it is on no package index), so the command that
        # works is the checkout's: ``pip install 'iotgw[gpu]'`` would find nothing.
        why = (
            "this TensorFlow build has no CUDA (tensorflow-cpu): install the iotgw[gpu] extra "
            "(pip install -e '.[gpu]' in the iotgw source folder; docs/gpu.md)"
        )
    else:
        why = (
            "TensorFlow sees no GPU (no driver, CUDA libraries missing, or CUDA_VISIBLE_DEVICES "
            "hides them: see TensorFlow's log and `iotgw doctor`)"
        )
    return Placement(CPU_DEVICE, "CPU:0", f"no GPU: {why}")


__all__ = [
    "CPU_DEVICE",
    "CPU_PROVIDER",
    "CUDA_PROVIDER",
    "GPU_DEVICE",
    "Placement",
    "onnx_actual",
    "onnx_expected",
    "onnx_providers",
    "tf_expected",
]
