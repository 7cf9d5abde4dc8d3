"""The execution providers every ONNX Runtime session here asks for: the gateway's runtime
instances and the serving plan's measurements (``models.plan_onnx``) alike.

A leaf beside the backend (as ``tf_config`` is for TensorFlow), so the plan can open sessions on
the same providers without importing the backend, which imports the plan.
"""

from __future__ import annotations

import functools
import logging

import onnxruntime as ort

from models.backends.devices import CUDA_PROVIDER, onnx_providers

log = logging.getLogger("models.onnx")


def choose_providers() -> list[str]:
    """CUDA first when this onnxruntime build has it, CPU always as the fallback."""
    providers = onnx_providers(ort.get_available_providers())
    if CUDA_PROVIDER in providers:
        _preload_cuda_libraries()
    return providers


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
