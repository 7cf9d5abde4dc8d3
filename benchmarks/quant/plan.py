"""How much the quantization benchmark measures (``FULL`` for the committed figures, ``QUICK``
for CI), the models it measures, and one configuration: (model, precision, runtime)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import MIN_FULL_RUNS
from models.repository import ModelVersion
from models.serving_plan import DEFAULT_WEIGHT_MEMORY_BUDGET
from models.zoo import VISION_CNN, Conv2D, Dense, Flatten, Input, MaxPool2D, ModelSpec

NAME = "quant"
RUNTIMES = ("onnxruntime", "tensorflow")
PRECISIONS: tuple[tuple[str, int | None], ...] = (("fp32", None), ("int8", 8), ("int4", 4))
BATCHES = (1, 8, 32)
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4
# The serving plan's weight-memory budget (a fraction of fp32), the gateway's default.
WEIGHT_MEMORY_BUDGET = DEFAULT_WEIGHT_MEMORY_BUDGET

FC_LARGE = ModelSpec(
    name="fc_large",
    inputs=(Input("features", (1024,)),),
    layers=(Dense(4096, "relu"), Dense(4096, "relu"), Dense(1024, "relu"), Dense(10)),
    seed=11,
    description="Large fully connected classifier (25M weights).",
)
FC_SMALL = ModelSpec(
    name="fc_small",
    inputs=(Input("features", (256,)),),
    layers=(Dense(512, "relu"), Dense(512, "relu"), Dense(10)),
    seed=11,
    description="Small fully connected classifier (quick mode).",
)
CNN_SMALL = ModelSpec(
    name="cnn_small",
    inputs=(Input("image", (16, 16, 3)),),
    layers=(Conv2D(16, 3), MaxPool2D(2), Conv2D(32, 3), MaxPool2D(2), Flatten(), Dense(10)),
    seed=12,
    description="Small CNN (quick mode).",
)


@dataclass(frozen=True, slots=True)
class Plan:
    """How much to measure: ``FULL`` for the committed figures, ``QUICK`` for CI."""

    quick: bool
    models: tuple[ModelSpec, ...]
    rounds: int
    run_s: float  # time spent calling one configuration at one batch size, per round
    min_calls: int
    memory_runs: int
    memory_process_per_config: bool  # False: one process measures all of a runtime in turn
    eval_rows: int


FULL = Plan(False, (FC_LARGE, VISION_CNN), MIN_FULL_RUNS, 0.4, 5, MIN_FULL_RUNS, True, 128)
QUICK = Plan(True, (FC_SMALL, CNN_SMALL), 1, 0.02, 2, 1, False, 32)


@dataclass(frozen=True, slots=True)
class Config:
    model: str
    precision: str
    runtime: str
    version: ModelVersion

    @property
    def label(self) -> str:
        return f"{self.model}/{self.runtime}/{self.precision}"

    @property
    def fp32_label(self) -> str:
        """The label of the same model and runtime at fp32, what this one is compared with."""
        return f"{self.model}/{self.runtime}/fp32"
