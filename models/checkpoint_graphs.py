"""From a loaded checkpoint to each runtime's graph, by architecture kind, with its serving plan.

``zoo``: a ``ModelSpec``, rebuilt for either runtime, each quantized layer run the way its
serving plan chose (``models.serving_plan``). ``onnx``: an imported ONNX graph
(``models.importers.from_onnx``), which only ONNX Runtime serves, its weights the way the
import rewrote them (no plan).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from models.checkpoint import ONNX_KIND, ZOO_KIND, Checkpoint, CheckpointError
from models.plan_zoo import with_ways
from models.serving_plan import CostCache, PlanOptions, ServingPlan
from models.zoo import ModelSpec
from models.zoo_checkpoint import zoo_params

if TYPE_CHECKING:
    import onnx

    from models.quant_tf import CheckpointGraph


def onnx_model(
    checkpoint: Checkpoint, path: Path, accuracy_level: int, options: PlanOptions
) -> tuple[onnx.ModelProto, ServingPlan | None]:
    kind = checkpoint.architecture.get("kind")
    if kind == ZOO_KIND:
        from models.export_onnx import build_onnx
        from models.plan_onnx import onnx_plan

        spec, params = zoo_params(checkpoint, path)
        plan = onnx_plan(
            spec,
            params,
            budget=options.budget,
            accuracy_level=accuracy_level,
            cache=CostCache(options.cache_dir),
        )
        ways = plan.ways()
        model = build_onnx(
            spec, with_ways(spec, params, ways), accuracy_level=accuracy_level, ways=ways
        )
        return model, plan if plan.tensors else None
    if kind == ONNX_KIND:
        from models.importers.from_onnx import rebuild_onnx

        return rebuild_onnx(checkpoint, path, accuracy_level), None
    raise CheckpointError(path, f"unknown architecture kind {kind!r} (known: zoo, onnx)")


def tf_graph(
    checkpoint: Checkpoint, path: Path, options: PlanOptions
) -> tuple[ModelSpec, CheckpointGraph, ServingPlan | None]:
    """Build the model in the current default TF graph; returns its spec, graph parts and
    plan (None when nothing is quantized)."""
    kind = checkpoint.architecture.get("kind")
    if kind == ONNX_KIND:
        raise CheckpointError(
            path,
            "holds an imported ONNX graph, which only ONNX Runtime serves "
            '(set runtime = "onnxruntime" in config.toml)',
        )
    if kind != ZOO_KIND:
        raise CheckpointError(path, f"unknown architecture kind {kind!r} (known: zoo, onnx)")
    from models.plan_tf import tf_plan
    from models.quant_tf import build_graph

    spec, params = zoo_params(checkpoint, path)
    plan = tf_plan(spec, params, budget=options.budget, cache=CostCache(options.cache_dir))
    built = build_graph(spec, with_ways(spec, params, plan.ways()))
    return spec, built, plan if plan.tensors else None
