"""The serving plan of a zoo checkpoint (``models.serving_plan``), whichever runtime serves it:
the quantized layers, the bytes each way holds, the measurements through the cost cache, and
the parameters rewritten for the chosen ways.

The runtime modules (``models.plan_onnx``, ``models.plan_tf``) each describe their runtime in a
``PlanRuntime``: which ways it has and how to build one layer alone one way; everything else,
the timing included, is here.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from models.plan_decisions import PlanDecisions
from models.quant import BlockQuantized
from models.serving_plan import (
    PLANNED_BATCHES,
    Candidate,
    CostCache,
    Option,
    ServingPlan,
    Way,
    make_plan,
)
from models.zoo import Layer, ModelSpec, input_shape, layer_shapes
from models.zoo_checkpoint import LayerParams, QuantParams, dequantized_layer

# Timing one layer: its ways side by side, so that each sees the same moment of a shared
# machine: warm-up calls, then ROUNDS rounds in which every way makes back-to-back calls (at
# least CALLS and at least ROUND_S long); a way's figure is the least of its rounds' medians
# (other work on the machine only ever adds time).
WARM_CALLS = 2
ROUNDS = 5
CALLS = 5
ROUND_S = 0.005
UNTIMED_BEYOND = 2.0
"""A way slower per row than this many times the fastest way at one planned batch size is not
timed at the larger ones (``_layer_seconds``)."""


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


def _round(call: Callable[[], object]) -> float:
    """The median of back-to-back calls: at least ``CALLS`` and ``ROUND_S`` long, or one call
    that alone takes longer than ``ROUND_S`` (a large batch: one call is then a fair sample)."""
    times: list[float] = []
    deadline = time.perf_counter() + ROUND_S
    while len(times) < CALLS or time.perf_counter() < deadline:
        if times and times[0] > ROUND_S:
            break
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_side_by_side(calls: Mapping[Way, Callable[[], object]]) -> dict[Way, float]:
    """Seconds per call of each way (see ``ROUNDS``)."""
    for call in calls.values():
        for _ in range(WARM_CALLS):
            call()
    rounds: dict[Way, list[float]] = {way: [] for way in calls}
    for _ in range(ROUNDS):
        for way, call in calls.items():
            rounds[way].append(_round(call))
    return {way: min(values) for way, values in rounds.items()}


# (layer) -> way -> bytes held that way, for the ways this runtime has
Ways = Callable[[QuantLayer], Mapping[Way, int]]
# An input NHWC -> a call running the built layer on it (any batch size)
Bind = Callable[[np.ndarray], Callable[[], object]]
# (layer, its parameters held ``way``, way) -> the layer built alone that way, to bind inputs to
Build = Callable[[QuantLayer, LayerParams, Way], Bind]


@dataclass(frozen=True, slots=True)
class PlanRuntime:
    """What the planner asks of a runtime: its name and version (part of every cost's key), the
    bytes each of its ways holds, and how to build one layer alone one way."""

    name: str
    version: str
    ways: Ways
    build: Build
    # Settings of the runtime a cost also depends on (ONNX Runtime's accuracy level).
    key_extra: Mapping[str, object] = field(default_factory=dict)


def layer_build(runtime: PlanRuntime, q: QuantLayer, way: Way) -> Bind:
    """``q`` built alone ``way`` (a ``load`` kernel dequantized to float, as the runtime would
    hold it), once for every batch size it is timed at."""
    p = dequantized_layer(q.layer, q.params) if way == "load" else q.params
    return runtime.build(q, p, way)


def layer_input(q: QuantLayer, batch: int) -> np.ndarray:
    """A fixed random input of ``batch`` rows for ``q``."""
    return np.random.default_rng(0).standard_normal((batch, *q.in_shape)).astype(np.float32)


def plan_zoo(
    runtime: PlanRuntime,
    spec: ModelSpec,
    params: Sequence[LayerParams],
    *,
    budget: float,
    cache: CostCache,
) -> ServingPlan:
    """The plan for ``spec`` on ``runtime``: each quantized layer's ways timed side by side at
    each planned batch size (or read from ``cache``), then chosen within ``budget``."""
    candidates = []
    before = cache.measured
    for q in quantized_layers(spec, params):
        held = runtime.ways(q)
        seconds = _layer_seconds(runtime, q, list(held), cache)
        data = q.params.kernel.data
        options = tuple(Option(way, tuple(seconds[way]), n) for way, n in held.items())
        shape = tuple(q.params.kernel.shape)
        name = f"layers.{q.index}.weight"
        candidates.append(Candidate(name, q.index, shape, data.bits, data.block_size, options))
    cache.save()
    plan = make_plan(
        runtime.name,
        candidates,
        budget=budget,
        fp32_bytes=fp32_bytes(params),
        float_bytes=float_bytes(params),
        measured=cache.measured - before,
    )
    return _settled(plan, runtime, cache, budget)


def _layer_seconds(
    runtime: PlanRuntime, q: QuantLayer, ways: list[Way], cache: CostCache
) -> dict[Way, list[float]]:
    """Seconds per call of each of ``ways`` at each planned batch size, smallest first, timed side
    by side (or read from ``cache``). At a larger size a way whose time per row at the size
    before was beyond ``UNTIMED_BEYOND`` x the fastest way's is not timed but scaled by rows: it
    cannot win there, and timing it is what costs (vision_cnn's im2col convolutions at batch 32
    took 110-240 ms a call against 14-29 ms dequantized once, and timing every way at every size
    took 31-35 s at its first load)."""
    seconds: dict[Way, list[float]] = {way: [] for way in ways}
    built: dict[Way, Bind] = {}
    for i, batch in enumerate(PLANNED_BATCHES):
        timed = list(ways)
        if i:
            before = PLANNED_BATCHES[i - 1]
            fastest = min(seconds[w][-1] for w in ways)
            timed = [w for w in ways if seconds[w][-1] <= UNTIMED_BEYOND * fastest]
        keys = {way: _cost_key(cache, runtime, q, way, batch) for way in timed}
        missing = {way: key for way, key in keys.items() if cache.get(key) is None}
        if missing:
            x = layer_input(q, batch)
            for way in missing:
                if way not in built:
                    built[way] = layer_build(runtime, q, way)
            measured = time_side_by_side({way: built[way](x) for way in missing})
            for way, key in missing.items():
                cache.put(key, measured[way])
        for way in ways:
            if way in keys:
                seconds[way].append(cache[keys[way]])
            else:
                seconds[way].append(seconds[way][-1] * batch / before)
    return seconds


def _settled(
    plan: ServingPlan,
    runtime: PlanRuntime,
    cache: CostCache,
    budget: float,
) -> ServingPlan:
    """``plan``, or the plan an earlier load chose for this structure (``models.plan_decisions``):
    every session of a model on this machine then computes alike."""
    if not plan.tensors:
        return plan
    structure = [
        {"tensor": t.name, "shape": list(t.shape), "bits": t.bits, "block": t.block_size}
        for t in plan.tensors
    ]
    # The batch sizes too: a choice made by other sizes' costs is not this rule's.
    what = {
        "plan": structure,
        "budget": budget,
        "batches": list(PLANNED_BATCHES),
        **runtime.key_extra,
    }
    key = cache.key(runtime.name, runtime.version, what)
    proposed = {t.name: t.way for t in plan.tensors}
    allowed = {t.name: {o.way for o in t.options} for t in plan.tensors}
    ways, kept = PlanDecisions(cache.folder).settle(key, proposed, allowed)
    return plan.with_ways(cast(dict[str, Way], ways)) if kept else plan


def _cost_key(cache: CostCache, runtime: PlanRuntime, q: QuantLayer, way: Way, batch: int) -> str:
    """The cache key of a layer's cost one way on ``batch`` rows: the machine, the runtime, and
    what the cost depends on besides them."""
    data = q.params.kernel.data
    what = {
        "layer": type(q.layer).__name__,
        "in": list(q.in_shape),
        "kernel": list(q.params.kernel.shape),
        "stride": getattr(q.layer, "stride", 1),
        "bits": data.bits,
        "block": data.block_size,
        "way": way,
        "batch": batch,
        **runtime.key_extra,
    }
    return cache.key(runtime.name, runtime.version, what)


def with_ways(
    spec: ModelSpec, params: Sequence[LayerParams], ways: Mapping[int, Way]
) -> list[LayerParams]:
    """``params`` with the layers planned ``load`` dequantized to float (the others as they
    are: the graph builders read their way from ``ways``)."""
    return [
        dequantized_layer(layer, p) if isinstance(p, QuantParams) and ways.get(i) == "load" else p
        for i, (layer, p) in enumerate(zip(spec.layers, params, strict=True))
    ]
