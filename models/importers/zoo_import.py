"""The last step of the zoo-based importers: float weights in, checkpoint and report out."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from models.checkpoint import Checkpoint
from models.importers.report import QuantOptions, TensorDecision, quantized_detail
from models.zoo import ModelSpec, Weights
from models.zoo_checkpoint import bias_name, weight_name, zoo_checkpoint


def quantize_zoo(
    spec: ModelSpec,
    weights: Weights,
    options: QuantOptions,
    source_names: Mapping[str, str] | None = None,
) -> tuple[Checkpoint, list[TensorDecision]]:
    """The zoo checkpoint of ``weights`` with kernels quantized as ``options`` say; decisions
    name each checkpoint tensor and, when given, the source tensor it came from."""
    source_names = source_names or {}
    decisions: list[TensorDecision] = []

    def label(name: str) -> str:
        source = source_names.get(name)
        return f"{name} (from {source})" if source and source != name else name

    def policy(index: int, kernel: np.ndarray) -> tuple[int, int] | None:
        name = weight_name(index)
        shape = tuple(kernel.shape)
        reason = options.float_reason(name, shape)
        if reason is None and source_names.get(name):
            reason = options.float_reason(source_names[name], shape)
        if reason is not None:
            decisions.append(TensorDecision(label(name), shape, False, reason))
            return None
        detail = quantized_detail(options.bits, options.block_size, shape)
        decisions.append(TensorDecision(label(name), shape, True, detail))
        return options.bits, options.block_size

    checkpoint = zoo_checkpoint(spec, weights, policy)
    for index, p in enumerate(weights):
        if p is not None:
            name = bias_name(index)
            decisions.append(
                TensorDecision(label(name), tuple(p.bias.shape), False, "kept in float: a bias")
            )
    return checkpoint, decisions
