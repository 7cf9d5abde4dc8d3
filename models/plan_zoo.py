"""The serving plan of a zoo checkpoint (``models.serving_plan``), whichever runtime serves it:
the quantized layers, the bytes each way holds, the measurements through the cost cache, and
the parameters rewritten for the chosen ways.

The runtime modules (``models.plan_onnx``, ``models.plan_tf``) say which ways they have and how
to time one layer run one way; everything else is here.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from models.quant import BlockQuantized
from models.serving_plan import (
    Candidate,
    CostCache,
    Option,
    ServingPlan,
    Way,
    make_plan,
)
from models.zoo import Layer, ModelSpec, input_shape, layer_shapes
from models.zoo_checkpoint import LayerParams, QuantParams, dequantized_layer

# Timing one layer: warm-up calls, then rounds of back-to-back calls (at least CALLS each and
# at least ROUND_S long); the figure is the median of the rounds' medians.
WARM_CALLS = 2
ROUNDS = 3
CALLS = 5
ROUND_S = 0.01


@dataclass(frozen=True, slots=True)
class QuantLayer:
    """A layer with a quantized kernel, where it stands in the model."""

    index: int
    layer: Layer
    params: QuantParams
    in_shape: tuple[int, ...]  # one example, NHWC for feature maps
    out_shape: tuple[int, ...]


def quantized_layers(spec: ModelSpec, params: Sequence[LayerParams]) -> Iterator[QuantLayer]:
    shape = input_shape(spec)
    for index, (layer, p, out_shape) in enumerate(
        zip(spec.layers, params, layer_shapes(spec), strict=True)
    ):
        if isinstance(p, QuantParams):
            yield QuantLayer(index, layer, p, tuple(shape), tuple(out_shape))
        shape = out_shape


def code_bytes(data: BlockQuantized, bits_held: int) -> int:
    """Codes padded to whole blocks at ``bits_held`` bits each."""
    rows = data.codes.shape[0]
    return math.ceil(rows * data.blocks_per_row * data.block_size * bits_held / 8)


def scale_bytes(data: BlockQuantized) -> int:
    return 4 * data.scales.size


def fp32_bytes(params: Sequence[LayerParams]) -> int:
    total = 0
    for p in params:
        if isinstance(p, QuantParams):
            total += 4 * math.prod(p.kernel.shape) + 4 * p.bias.size
        elif p is not None:
            total += 4 * (p.kernel.size + p.bias.size)
    return total


def float_bytes(params: Sequence[LayerParams]) -> int:
    """What the tensors kept in float hold: every bias, and kernels the checkpoint keeps float."""
    total = 0
    for p in params:
        if isinstance(p, QuantParams):
            total += 4 * p.bias.size
        elif p is not None:
            total += 4 * (p.kernel.size + p.bias.size)
    return total


def time_calls(call: Callable[[], object]) -> float:
    """Seconds per call (see ``ROUNDS``)."""
    for _ in range(WARM_CALLS):
        call()
    medians = []
    for _ in range(ROUNDS):
        times: list[float] = []
        deadline = time.perf_counter() + ROUND_S
        while len(times) < CALLS or time.perf_counter() < deadline:
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return statistics.median(medians)


# (layer, way) -> seconds of one batch-1 run of that layer alone
Measure = Callable[[QuantLayer, Way], float]
# (layer) -> way -> bytes held that way, for the ways this runtime has
Ways = Callable[[QuantLayer], Mapping[Way, int]]


def plan_zoo(
    runtime: tuple[str, str],
    spec: ModelSpec,
    params: Sequence[LayerParams],
    *,
    budget: float,
    cache: CostCache,
    ways: Ways,
    measure: Measure,
    key_extra: Mapping[str, object] | None = None,
) -> ServingPlan:
    """The plan for ``spec`` on ``runtime`` (name, version): each quantized layer's ways timed
    (or read from ``cache``), then chosen within ``budget``."""
    candidates = []
    before = cache.measured
    for q in quantized_layers(spec, params):
        data = q.params.kernel.data
        options = []
        for way, held in ways(q).items():
            what = {
                "layer": type(q.layer).__name__,
                "in": list(q.in_shape),
                "kernel": list(q.params.kernel.shape),
                "stride": getattr(q.layer, "stride", 1),
                "bits": data.bits,
                "block": data.block_size,
                "way": way,
                **(key_extra or {}),
            }
            key = cache.key(*runtime, what)
            seconds = cache.seconds(key, functools.partial(measure, q, way))
            options.append(Option(way, seconds, held))
        candidates.append(
            Candidate(
                f"layers.{q.index}.weight",
                q.index,
                tuple(q.params.kernel.shape),
                data.bits,
                data.block_size,
                tuple(options),
            )
        )
    cache.save()
    return make_plan(
        runtime[0],
        candidates,
        budget=budget,
        fp32_bytes=fp32_bytes(params),
        float_bytes=float_bytes(params),
        measured=cache.measured - before,
    )


def with_ways(
    spec: ModelSpec, params: Sequence[LayerParams], ways: Mapping[int, Way]
) -> list[LayerParams]:
    """``params`` with the layers planned ``load`` dequantized to float (the others as they
    are: the graph builders read their way from ``ways``)."""
    return [
        dequantized_layer(layer, p) if isinstance(p, QuantParams) and ways.get(i) == "load" else p
        for i, (layer, p) in enumerate(zip(spec.layers, params, strict=True))
    ]
