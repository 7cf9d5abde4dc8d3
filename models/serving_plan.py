"""How each quantized tensor of a checkpoint runs, chosen by cost within a weight-memory budget.

A quantized kernel can run three ways, and which is best depends on the layer, the runtime and
the machine:

- ``packed``: a kernel that reads the packed codes itself (ONNX Runtime's ``MatMulNBits``; a
  convolution as im2col feeding it). Small in memory, and fast where the kernel is.
- ``graph``: the codes are dequantized by the graph on every run and feed an ordinary float op
  (``DequantizeLinear`` + ``Conv``/``Gemm`` on ONNX Runtime, unpack-and-scale ops on TensorFlow).
  Small in memory; every run pays the dequantization, and a convolution whose kernel is computed
  at run time misses the runtime's fastest (pre-packed) convolution.
- ``load``: dequantized once at load to a float32 constant (ONNX Runtime) or variable
  (TensorFlow): as fast as an fp32 model, as large too.

Every way computes with ``fp32(q * d)``, the trained codes times their scales, so the choice
changes speed and memory, never what the model computes (beyond float summation order, and
``MatMulNBits``' int8 activations at ``accuracy_level = 4``).

The costs are measured on this machine when a model loads (``models.plan_onnx``,
``models.plan_tf``: each layer alone, one intra-op thread, at each of ``PLANNED_BATCHES``) and
cached by machine, runtime version, layer shape, bits and batch size (``CostCache``). The choice
is a multiple-choice knapsack: the least total cost whose weight memory (estimated per way)
stays within ``budget`` x the fp32 weights; when even the smallest choice exceeds the budget,
every tensor takes its smallest way. A way's cost is its share of the fastest mix's time at
each planned batch size, weighted (``weigh``), and the plan kept is the one whose worst size is
least over a few weightings (``least_worst``): a kernel that wins at batch 1 can lose at the
batches a busy gateway forms (int4 vision_cnn chosen by its batch-1 times ran 0.93x fp32's time
at batch 1 and 1.24x at batch 32).

A leaf: imports nothing of the project but ``models.machine``. Once chosen, a plan is kept
(``models.plan_decisions``), so every later load on this machine runs the same ways.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from models.machine import cpu_model, usable_cores

Way = Literal["packed", "graph", "load"]
WAYS: dict[Way, str] = {
    "packed": "packed kernel over the codes",
    "graph": "dequantized in the graph on every run",
    "load": "dequantized once at load to fp32",
}
# The ways as the log says them, after a count of layers ("2 run a kernel ...").
_PLAIN: dict[Way, str] = {
    "packed": "on a kernel over their packed codes",
    "graph": "dequantized on every run",
    "load": "dequantized once at load",
}
DEFAULT_WEIGHT_MEMORY_BUDGET = 0.5
PLANNED_BATCHES: tuple[int, ...] = (1, 8, 32)
"""The batch sizes each layer is timed at: a trickle's single rows, and the batches the tuner's
closed loops settle on (8 to 64 rows in ``iotgw bench find``)."""
# Resolution of the knapsack: the budget is cut into this many units, each tensor's bytes
# rounded up to whole units (so a chosen plan never exceeds the budget).
BUDGET_UNITS = 4000
COSTS_FILE = "plan-costs.json"
log = logging.getLogger("models.plan")


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What a plan needs besides the checkpoint: the weight-memory budget (a fraction of the
    fp32 weights) and where measured costs are cached (None: this process only)."""

    budget: float
    cache_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class Option:
    """One way to run a tensor: its measured seconds per call at each of ``PLANNED_BATCHES``
    (in order), the bytes it holds, and ``cost``, what the choice minimises (``weigh``)."""

    way: Way
    seconds: tuple[float, ...]
    held_bytes: int
    cost: float = math.nan


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """A quantized tensor, the ways it can run, and the way chosen."""

    name: str
    layer: int
    shape: tuple[int, ...]
    bits: int
    block_size: int
    options: tuple[Option, ...]
    way: Way

    @property
    def chosen(self) -> Option:
        return next(o for o in self.options if o.way == self.way)

    @property
    def fp32_bytes(self) -> int:
        return 4 * int(np.prod(self.shape))


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """The plan of one model version on one runtime: plain data, shown by ``iotgw inspect``,
    in the model's metadata and once in the log at load."""

    runtime: str
    budget: float  # fraction of the fp32 weight bytes
    fp32_bytes: int  # every weight tensor as float32
    float_bytes: int  # tensors the checkpoint holds in float (biases, float kernels)
    tensors: tuple[TensorPlan, ...]
    measured: int  # costs measured for this plan; the others came from the cache
    kept: bool = False  # the ways were chosen by an earlier load (models.plan_decisions)

    @property
    def held_bytes(self) -> int:
        return self.float_bytes + sum(t.chosen.held_bytes for t in self.tensors)

    @property
    def memory_ratio(self) -> float:
        return self.held_bytes / self.fp32_bytes if self.fp32_bytes else 1.0

    @property
    def within_budget(self) -> bool:
        return self.held_bytes <= self.budget * self.fp32_bytes

    def ways(self) -> dict[int, Way]:
        """Layer index -> way, what the graph builders take."""
        return {t.layer: t.way for t in self.tensors}

    def summary(self) -> str:
        """The plan in plain words: the weights' memory against its limit, how the layers
        run, and whether the choice is new."""
        counts = {w: sum(t.way == w for t in self.tensors) for w in WAYS}
        ways = ", ".join(f"{n} {_PLAIN[w]}" for w, n in counts.items() if n)
        limit = (
            f"within the limit of {self.budget:g}"
            if self.within_budget
            else f"over the limit of {self.budget:g} even with every layer in its smallest form"
        )
        timed = (
            f"{self.measured} layer timing(s) measured now"
            if self.measured
            else "layer timings from the cache"
        )
        chosen = "kept from an earlier load" if self.kept else "chosen now"
        return (
            f"weights take {self.held_bytes / 1e6:.2f} MB, {self.memory_ratio:.2f} of their "
            f"float32 size ({limit}); quantized layers: {ways or 'none'}; {chosen}, {timed}"
        )

    def with_ways(self, ways: Mapping[str, Way]) -> ServingPlan:
        """This plan with each tensor run the way ``ways`` names (an earlier load's choice)."""
        tensors = tuple(dataclasses.replace(t, way=ways[t.name]) for t in self.tensors)
        return dataclasses.replace(self, tensors=tensors, kept=True)

    def as_doc(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "budget": self.budget,
            "fp32_bytes": self.fp32_bytes,
            "held_bytes": self.held_bytes,
            "memory_ratio": round(self.memory_ratio, 4),
            "within_budget": self.within_budget,
            "measured_now": self.measured,
            "kept": self.kept,
            "tensors": [
                {
                    "name": t.name,
                    "layer": t.layer,
                    "shape": list(t.shape),
                    "bits": t.bits,
                    "block_size": t.block_size,
                    "way": t.way,
                    "held_bytes": t.chosen.held_bytes,
                    "fp32_bytes": t.fp32_bytes,
                    "options": {
                        o.way: {
                            "ms": {
                                str(b): round(s * 1e3, 4)
                                for b, s in zip(PLANNED_BATCHES, o.seconds, strict=True)
                            },
                            "cost": round(o.cost, 4),
                            "held_bytes": o.held_bytes,
                        }
                        for o in t.options
                    },
                }
                for t in self.tensors
            ],
        }

    def rows(self) -> list[list[Any]]:
        """One table row per tensor: name, way, held bytes, and each way's measured times at
        the planned batch sizes."""
        out = []
        for t in self.tensors:
            times = {o.way: " / ".join(f"{s * 1e3:.3f}" for s in o.seconds) for o in t.options}
            out.append(
                [t.name, t.way, f"{t.chosen.held_bytes:,}", f"{t.fp32_bytes:,}"]
                + [times.get(w, "-") for w in WAYS]
            )
        return out


_AT = "/".join(str(b) for b in PLANNED_BATCHES)
PLAN_HEADERS = ("tensor", "way", "held", "as fp32", *(f"{w} ms at {_AT}" for w in WAYS))


def weigh(
    options: Sequence[Sequence[Option]], weights: Sequence[float] | None = None
) -> list[list[Option]]:
    """``options`` with each one's ``cost``: its seconds at each planned batch size over what
    every tensor's fastest way takes at that size (its share of the fastest mix's time there),
    summed over the sizes, each times its weight (1 without ``weights``). Relative, so that
    batch 32 does not outweigh batch 1 by taking many times its time."""
    if not options:
        return []
    fastest = _fastest_mix(options)
    w = list(weights) if weights is not None else [1.0] * len(fastest)
    return [
        [
            dataclasses.replace(
                o,
                cost=sum(k * s / f for k, s, f in zip(w, o.seconds, fastest, strict=True) if f > 0),
            )
            for o in opts
        ]
        for opts in options
    ]


def _fastest_mix(options: Sequence[Sequence[Option]]) -> list[float]:
    """Seconds at each planned batch size of every tensor run its fastest way there."""
    sizes = len(options[0][0].seconds)
    return [sum(min(o.seconds[i] for o in opts) for opts in options) for i in range(sizes)]


def slowdowns(options: Sequence[Sequence[Option]], ways: Sequence[Way]) -> list[float]:
    """At each planned batch size, the time of ``ways`` over the fastest mix's."""
    fastest = _fastest_mix(options)
    chosen = [next(o for o in opts if o.way == w) for opts, w in zip(options, ways, strict=True)]
    return [sum(o.seconds[i] for o in chosen) / f if f > 0 else 1.0 for i, f in enumerate(fastest)]


REWEIGHINGS = 12
"""Rounds of ``least_worst``: each leans the weights toward the sizes the last plan slowed most."""


def least_worst(
    options: Sequence[Sequence[Option]], budget_bytes: float
) -> tuple[list[list[Option]], list[Way]]:
    """The ways whose worst slowdown over the planned batch sizes (``slowdowns``) is least among
    the plans ``choose`` makes for ``REWEIGHINGS`` weightings, the first weighing every size
    alike, each next one leaning toward the sizes the last plan slowed most; with the options
    costed by the weighting that chose them. The plan is one for every batch size the gateway
    forms, so it is judged where it is slowest: weighed alike, int4 vision_cnn's plan ran 1.22x
    fp32 at batch 1 to run 1.07x at batch 32, where the batch-1 plan had run 0.93x and 1.24x."""
    if not options:
        return [], []
    weights = [1.0] * len(options[0][0].seconds)
    best: tuple[float, list[list[Option]], list[Way]] | None = None
    for _ in range(REWEIGHINGS):
        weighed = weigh(options, weights)
        ways = choose(weighed, budget_bytes)
        slow = slowdowns(options, ways)
        if best is None or max(slow) < best[0] - 1e-9:
            best = (max(slow), weighed, ways)
        mean = sum(slow) / len(slow)
        weights = [w * math.exp(8.0 * (x - mean)) for w, x in zip(weights, slow, strict=True)]
    assert best is not None
    return best[1], best[2]


def choose(options: Sequence[Sequence[Option]], budget_bytes: float) -> list[Way]:
    """Per tensor the way that minimises the summed cost (``weigh``) with the summed bytes
    within ``budget_bytes`` (a multiple-choice knapsack, solved exactly on ``BUDGET_UNITS``
    units); every tensor's smallest way when nothing fits."""
    smallest = [min(opts, key=lambda o: (o.held_bytes, o.cost)).way for opts in options]
    if budget_bytes <= 0 or not options:
        return smallest
    unit = budget_bytes / BUDGET_UNITS
    size = BUDGET_UNITS + 1
    best = np.zeros(size)  # best[u]: least time of the tensors so far within u units
    picks: list[np.ndarray] = []
    for opts in options:
        new = np.full(size, np.inf)
        pick = np.full(size, -1, np.int16)
        for index, option in enumerate(opts):
            need = int(np.ceil(option.held_bytes / unit - 1e-9))
            if need >= size:
                continue
            shifted = np.full(size, np.inf)
            shifted[need:] = best[: size - need] + option.cost
            better = shifted < new
            new[better], pick[better] = shifted[better], index
        best = new
        picks.append(pick)
    if not np.isfinite(best[-1]):
        return smallest
    ways: list[Way] = []
    units = BUDGET_UNITS
    for opts, pick in zip(reversed(options), reversed(picks), strict=True):
        option = opts[int(pick[units])]
        ways.append(option.way)
        units -= int(np.ceil(option.held_bytes / unit - 1e-9))
    return ways[::-1]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A quantized tensor before the choice: what ``plan`` needs to know of it."""

    name: str
    layer: int
    shape: tuple[int, ...]
    bits: int
    block_size: int
    options: tuple[Option, ...]


def make_plan(
    runtime: str,
    candidates: Sequence[Candidate],
    *,
    budget: float,
    fp32_bytes: int,
    float_bytes: int,
    measured: int,
) -> ServingPlan:
    room = budget * fp32_bytes - float_bytes
    weighed, ways = least_worst([c.options for c in candidates], room)
    tensors = tuple(
        TensorPlan(c.name, c.layer, c.shape, c.bits, c.block_size, tuple(opts), way)
        for c, opts, way in zip(candidates, weighed, ways, strict=True)
    )
    return ServingPlan(runtime, budget, fp32_bytes, float_bytes, tensors, measured)


class CostCache:
    """Measured seconds by key, in memory and (with a folder) in ``<folder>/plan-costs.json``,
    shared by every model and process of this machine. Keys name the machine (CPU model and
    usable cores) and runtime version, so a copied cache folder never serves another machine's
    figures."""

    _memory: dict[str, float] = {}  # per process: every instance of a model after the first

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.path = None if folder is None else folder / COSTS_FILE
        self.measured = 0
        self._stored = self._read()

    def _read(self) -> dict[str, float]:
        if self.path is None:
            return {}
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # a missing or damaged cache only costs measurements
        if not isinstance(doc, dict):
            return {}
        return {k: float(v) for k, v in doc.items() if isinstance(v, int | float)}

    @staticmethod
    def key(runtime: str, version: str, what: Mapping[str, Any]) -> str:
        machine = f"{cpu_model()}/{usable_cores()} cores"
        return json.dumps([machine, runtime, version, dict(what)], sort_keys=True)

    def get(self, key: str) -> float | None:
        for source in (self._memory, self._stored):
            if key in source:
                return source[key]
        return None

    def __getitem__(self, key: str) -> float:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def put(self, key: str, seconds: float) -> None:
        """A figure just measured (written to the folder by ``save``)."""
        self.measured += 1
        self._memory[key] = seconds
        self._stored[key] = seconds

    def save(self) -> None:
        """Write what this process measured (merged with what others wrote meanwhile)."""
        if self.path is None or not self.measured:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**self._read(), **self._stored}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(merged, sort_keys=True, indent=0))
            tmp.replace(self.path)
        except OSError as exc:  # a read-only cache folder: plans are measured again next time
            log.warning("cannot write the plan cost cache %s: %s", self.path, exc)


_logged: set[tuple[str, str]] = set()


def log_once(what: str, plan: ServingPlan) -> None:
    """The plan at DEBUG the first time this model version loads in the process (instances and
    rebuilds after it load the same plan). Detail: ``iotgw inspect --plan`` and the model's
    metadata show it too."""
    key = (what, json.dumps(plan.ways(), sort_keys=True))
    if key in _logged:
        return
    _logged.add(key)
    log.debug("%s: serving plan: %s", what, plan.summary())
    for t in plan.tensors:
        log.debug("%s: %s %s (%s)", what, t.name, t.way, WAYS[t.way])
