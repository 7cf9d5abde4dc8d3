"""ONNX Runtime on the GPU: a model the gateway serves runs on the CUDA provider (the session's
providers and every node's, from ONNX Runtime's own profile) and answers what the CPU computes;
a block-quantized checkpoint's serving plan is measured on CUDA and its graph runs there."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import numpy as np
import onnxruntime as ort
import pytest

from models.backends import load_runtime, onnx_backend
from models.backends.devices import CPU_PROVIDER, CUDA_PROVIDER
from models.backends.ort_providers import choose_providers
from models.repository import ModelVersion, read_config, with_plan_defaults
from models.runtime import Threads
from models.serving_plan import DEFAULT_WEIGHT_MEMORY_BUDGET
from models.zoo import VISION_CNN, reference_forward
from tests.gateway.helpers import base_url, json_request, make_repo, running_gateway
from tests.gpu.placement import onnx_node_providers

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_onnxruntime")]

# The GPU computes the same float32 model in another order (cuDNN's convolution algorithms).
FLOAT_TOLERANCE = 1e-4
# What the int4 checkpoint may differ from the NumPy forward of its dequantized weights: on the
# CPU MatMulNBits' accuracy level 4 quantizes activations to int8 (tests/models: 3e-2, twice
# that through im2col); CUDA computes in float, which is closer.
INT4_TOLERANCE = 6e-2
# Ops that do the model's arithmetic: each must run on CUDA (reshapes and the like may not).
COMPUTE_OPS = {"Conv", "MatMul", "MatMulNBits", "Gemm", "FusedConv", "FusedMatMul"}


def _version(repo: Path, name: str, plan_cache: Path | None = None) -> ModelVersion:
    directory = repo / name / "1"
    version = ModelVersion(name, 1, directory, read_config(directory / "config.toml"))
    if plan_cache is None:
        return version
    return with_plan_defaults(
        version, weight_memory_budget=DEFAULT_WEIGHT_MEMORY_BUDGET, plan_cache_dir=plan_cache
    )


IMAGE = VISION_CNN.inputs[0].name


def _images(rows: int) -> np.ndarray:
    shape = VISION_CNN.inputs[0].shape
    return np.random.default_rng(7).random((rows, *shape), np.float32)


def _off_cuda(nodes: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    return {n: v for n, v in nodes.items() if v[0] in COMPUTE_OPS and v[1] != CUDA_PROVIDER}


async def test_a_served_model_runs_on_cuda_and_answers_what_the_cpu_computes(
    gpu_repo: Path, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo", gpu_repo, {"vision_cnn": None})
    x = _images(4)
    cpu = ort.InferenceSession(
        str(repo / "vision_cnn" / "1" / "model.onnx"), providers=[CPU_PROVIDER]
    )
    want = cpu.run(None, {IMAGE: x})[0]
    async with running_gateway(repo, tmp_path / "cache") as gw:
        instances = gw.service.registry.host("vision_cnn")._pool._active
        assert instances
        for instance in instances:
            runtime = instance.runtime
            assert isinstance(runtime, onnx_backend.OnnxRuntime)
            assert runtime.device == "cuda:0", runtime.placement.reason
            assert runtime._session is not None
            assert runtime._session.get_providers()[0] == CUDA_PROVIDER
        url = f"{base_url(gw)}/v2/models/vision_cnn/versions/1/infer"
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, json=json_request({IMAGE: x})) as r,
        ):
            assert r.status == 200, await r.text()
            body = await r.json()
    got = np.asarray(body["outputs"][0]["data"], np.float32).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=FLOAT_TOLERANCE)


def test_every_compute_node_of_the_model_runs_on_cuda(gpu_repo: Path) -> None:
    path = str(gpu_repo / "vision_cnn" / "1" / "model.onnx")
    nodes = onnx_node_providers(path, choose_providers(), {IMAGE: _images(2)})
    assert any(op in COMPUTE_OPS for op, _ in nodes.values()), nodes
    assert not _off_cuda(nodes), f"compute nodes off CUDA: {_off_cuda(nodes)}"


def test_the_int4_checkpoint_is_planned_and_served_on_cuda(gpu_repo: Path, tmp_path: Path) -> None:
    """The serving plan's costs are measured with CUDA requested (their cache keys say so), the
    chosen graph's MatMulNBits and convolutions run on CUDA, and the answers are the codes'."""
    version = _version(gpu_repo, "vision_cnn_int4", plan_cache=tmp_path / "plans")
    runtime = load_runtime(version, Threads(1, 1))
    try:
        assert runtime.device == "cuda:0", getattr(runtime, "placement", None)
        plan = runtime.metadata.serving_plan
        assert plan is not None and plan.tensors
        x = _images(8)
        got = runtime.infer({IMAGE: x})[VISION_CNN.output]
    finally:
        runtime.close()
    keys = json.loads((tmp_path / "plans" / "plan-costs.json").read_text())
    assert keys and all(f'"providers": ["{CUDA_PROVIDER}", "{CPU_PROVIDER}"]' in k for k in keys)

    model, _ = onnx_backend.checkpoint_model(version)
    nodes = onnx_node_providers(model.SerializeToString(), choose_providers(), {IMAGE: x})
    assert not _off_cuda(nodes), f"compute nodes off CUDA: {_off_cuda(nodes)}"

    from models.checkpoint import load_checkpoint
    from models.zoo_checkpoint import dequantized_weights, zoo_params

    spec, params = zoo_params(load_checkpoint(version.model_path), version.model_path)
    reference = reference_forward(spec, dequantized_weights(spec, params), {IMAGE: x})
    np.testing.assert_allclose(got, reference, rtol=0, atol=INT4_TOLERANCE)
