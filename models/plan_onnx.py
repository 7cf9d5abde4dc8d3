"""The serving plan of a zoo checkpoint on ONNX Runtime: each quantized layer timed alone, at
each planned batch size on one intra-op thread, every way it can run (``models.serving_plan``),
on the execution providers the model's own sessions ask for (CUDA first on a GPU build): a
way's cost on the CPU says nothing of its cost on the GPU (``MatMulNBits`` has CUDA kernels for
some widths only, and a node without one runs on the CPU between copies).

Ways: ``packed`` (``MatMulNBits``; a convolution as im2col feeding it) where the codes fit it
(2, 4 or 8 bits, a power-of-two block of at least 16), ``graph`` (``DequantizeLinear`` + the
float op) and ``load`` (float32 constants). Bytes held per way, as the session keeps them:
``load`` 4 per weight; ``graph`` the codes (INT4 up to 4 bits, else INT8) and scales;
``packed`` the codes at their width plus twice the scales (``MatMulNBits`` at accuracy level 4
keeps a per-block sum beside each scale).
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from models.backends.ort_options import session_options
from models.backends.ort_providers import choose_providers
from models.export_onnx import layer_model
from models.plan_zoo import Bind, PlanRuntime, QuantLayer, code_bytes, plan_zoo, scale_bytes
from models.quant_onnx import matmul_nbits_fits
from models.runtime import Threads
from models.serving_plan import CostCache, ServingPlan, Way
from models.zoo import Conv2D, ModelSpec
from models.zoo_checkpoint import LayerParams

RUNTIME = "onnxruntime"


def ways(q: QuantLayer) -> dict[Way, int]:
    data = q.params.kernel.data
    out: dict[Way, int] = {}
    if matmul_nbits_fits(data):
        out["packed"] = code_bytes(data, data.bits) + 2 * scale_bytes(data)
    out["graph"] = code_bytes(data, 4 if data.bits <= 4 else 8) + scale_bytes(data)
    out["load"] = 4 * math.prod(q.params.kernel.shape)
    return out


def build(
    q: QuantLayer,
    p: LayerParams,
    way: Way,
    *,
    accuracy_level: int,
    providers: Sequence[str],
) -> Bind:
    """The layer alone, ``way``, in a session of its own on ``providers``: a call on any input."""
    model = layer_model(q.layer, p, (q.in_shape, q.out_shape), way, accuracy_level)
    nchw = isinstance(q.layer, Conv2D) and way != "packed"
    with tempfile.TemporaryDirectory(prefix="iotgw-plan-") as folder:
        path = Path(folder) / "layer.onnx"
        path.write_bytes(model.SerializeToString())
        session = ort.InferenceSession(
            str(path),
            sess_options=session_options(Threads(1, 1), checkpoint=True),
            providers=list(providers),
        )

    def bind(x: np.ndarray) -> Callable[[], object]:
        # The layout that way reads, made before the timing (a model's own graph never pays it).
        feed = {"x": np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if nchw else x}
        return lambda: session.run(None, feed)

    return bind


def onnx_plan(
    spec: ModelSpec,
    params: Sequence[LayerParams],
    *,
    budget: float,
    accuracy_level: int,
    cache: CostCache,
) -> ServingPlan:
    # The providers a serving session requests, and so part of every cost's key: a cache
    # measured before onnxruntime-gpu was installed (or on another GPU-less machine with the
    # same CPU) never answers for CUDA. (A session whose CUDA fails to initialise falls back to
    # the CPU, as the serving sessions then do too.)
    providers = choose_providers()
    runtime = PlanRuntime(
        RUNTIME,
        ort.__version__,
        ways,
        functools.partial(build, accuracy_level=accuracy_level, providers=providers),
        {"accuracy_level": accuracy_level, "providers": providers},
    )
    return plan_zoo(runtime, spec, params, budget=budget, cache=cache)
