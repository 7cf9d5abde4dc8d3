"""From a loaded checkpoint to each runtime's graph, by architecture kind.

``zoo``: a ``ModelSpec``, rebuilt for either runtime. ``onnx``: an imported ONNX graph
(``models.importers.from_onnx``), which only ONNX Runtime serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from models.checkpoint import Checkpoint, CheckpointError
from models.checkpoint_kinds import ONNX_KIND, ZOO_KIND
from models.zoo import ModelSpec
from models.zoo_checkpoint import zoo_params

if TYPE_CHECKING:
    import onnx

    from models.quant_tf import CheckpointGraph


def onnx_model(checkpoint: Checkpoint, path: Path, accuracy_level: int) -> onnx.ModelProto:
    kind = checkpoint.architecture.get("kind")
    if kind == ZOO_KIND:
        from models.export_onnx import build_onnx

        spec, params = zoo_params(checkpoint, path)
        return build_onnx(spec, params, accuracy_level=accuracy_level)
    if kind == ONNX_KIND:
        from models.importers.from_onnx import rebuild_onnx

        return rebuild_onnx(checkpoint, path, accuracy_level)
    raise CheckpointError(path, f"unknown architecture kind {kind!r} (known: zoo, onnx)")


def tf_graph(checkpoint: Checkpoint, path: Path) -> tuple[ModelSpec, CheckpointGraph]:
    """Build the model in the current default TF graph; returns its spec and graph parts."""
    kind = checkpoint.architecture.get("kind")
    if kind == ONNX_KIND:
        raise CheckpointError(
            path,
            "holds an imported ONNX graph, which only ONNX Runtime serves "
            '(set runtime = "onnxruntime" in config.toml)',
        )
    if kind != ZOO_KIND:
        raise CheckpointError(path, f"unknown architecture kind {kind!r} (known: zoo, onnx)")
    from models.quant_tf import build_graph

    spec, params = zoo_params(checkpoint, path)
    return spec, build_graph(spec, params)
