"""The checkpoints (the same weights at every precision), and what is measured in this
process: latency per batch size, and agreement with fp32 and with the NumPy reference."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Repeated
from benchmarks.quant.plan import (
    ACCURACY_LEVEL,
    BATCHES,
    BLOCK_SIZE,
    PRECISIONS,
    WEIGHT_MEMORY_BUDGET,
    Config,
    Plan,
)
from models.checkpoint import QuantizedTensor, load_checkpoint, save_checkpoint
from models.repository import ModelConfig, ModelVersion
from models.runtime import Runtime, Threads
from models.zoo import ModelSpec, init_weights, reference_forward
from models.zoo_checkpoint import dequantized_weights, uniform_policy, zoo_checkpoint, zoo_params

# -- the checkpoints --------------------------------------------------------------------------


def write_checkpoints(plan: Plan, work: Path) -> dict[str, dict[str, Path]]:
    """model -> precision -> checkpoint file, the same weights at every precision."""
    out: dict[str, dict[str, Path]] = {}
    for spec in plan.models:
        weights = init_weights(spec)
        out[spec.name] = {}
        for precision, bits in PRECISIONS:
            checkpoint = zoo_checkpoint(spec, weights, uniform_policy(bits, BLOCK_SIZE))
            out[spec.name][precision] = save_checkpoint(
                checkpoint, work / spec.name / precision / "model.safetensors"
            )
    return out


def version_of(
    path: Path,
    runtime: str,
    name: str,
    plan_cache: Path | None = None,
    budget: float = WEIGHT_MEMORY_BUDGET,
) -> ModelVersion:
    """A checkpoint version at the benchmark's accuracy level and weight-memory budget, its
    serving plan's costs cached in ``plan_cache`` (measured once, in this process, so that the
    memory processes load the plan without measuring)."""
    config = ModelConfig.model_validate(
        {
            "runtime": runtime,
            "path": path.name,
            "format": "checkpoint",
            "accuracy_level": ACCURACY_LEVEL,
            "weight_memory_budget": budget,
        }
    )
    return ModelVersion(name, 1, path.parent, config, plan_cache_dir=plan_cache)


def stored_bytes(path: Path) -> dict[str, int]:
    """File size, and the bytes of codes + scales + float tensors as the checkpoint holds them."""
    checkpoint = load_checkpoint(path)
    held = 0
    for tensor in checkpoint.tensors.values():
        held += tensor.data.packed_nbytes if isinstance(tensor, QuantizedTensor) else tensor.nbytes
    return {"file_bytes": path.stat().st_size, "tensor_bytes": held}


# -- latency --------------------------------------------------------------------------------


def inputs_for(spec: ModelSpec, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal((rows, *i.shape)).astype(np.float32) for i in spec.inputs}


def call_latency(
    runtime: Runtime, feed: dict[str, np.ndarray], run_s: float, min_calls: int
) -> float:
    """Median seconds per call over back-to-back calls for about ``run_s``."""
    runtime.infer(feed)  # warm: first-call allocations and lazy initialisation
    times: list[float] = []
    deadline = time.perf_counter() + run_s
    while len(times) < min_calls or time.perf_counter() < deadline:
        start = time.perf_counter()
        runtime.infer(feed)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_latency(
    plan: Plan, configs: Sequence[Config], specs: dict[str, ModelSpec]
) -> dict[str, dict[int, Repeated]]:
    """label -> batch size -> seconds per call; per round, every configuration in turn."""
    from models.backends import load_runtime

    runtimes = {c.label: load_runtime(c.version, Threads(1, 1)) for c in configs}
    try:
        samples: dict[str, dict[int, list[float]]] = {
            c.label: {b: [] for b in BATCHES} for c in configs
        }
        for round_index in range(plan.rounds):
            for batch in BATCHES:
                for config in configs:  # every configuration in turn, within one round
                    feed = inputs_for(specs[config.model], batch, seed=round_index)
                    seconds = call_latency(runtimes[config.label], feed, plan.run_s, plan.min_calls)
                    samples[config.label][batch].append(seconds)
        return {
            label: {b: Repeated.of(v) for b, v in per_batch.items()}
            for label, per_batch in samples.items()
        }
    finally:
        for runtime in runtimes.values():
            runtime.close()


# -- agreement ------------------------------------------------------------------------------


def _outputs(
    config: Config, spec: ModelSpec, feed: dict[str, np.ndarray], rows: int
) -> tuple[np.ndarray, dict[str, Any] | None]:
    """The configuration's outputs on ``feed``, 32 rows a call, and its serving plan."""
    from models.backends import load_runtime

    runtime = load_runtime(config.version, Threads(1, 1))
    plan = runtime.metadata.serving_plan
    try:
        out = np.concatenate(
            [
                runtime.infer({k: v[i : i + 32] for k, v in feed.items()})[spec.output]
                for i in range(0, rows, 32)
            ]
        )
        return out, None if plan is None else plan.as_doc()
    finally:
        runtime.close()


def agreement(
    plan: Plan, configs: Sequence[Config], specs: dict[str, ModelSpec]
) -> dict[str, dict[str, Any]]:
    """Outputs on a fixed input set, against the same runtime's fp32 and the NumPy reference."""
    outputs: dict[str, np.ndarray] = {}
    references: dict[Path, np.ndarray] = {}
    out: dict[str, dict[str, Any]] = {}
    for config in configs:
        spec = specs[config.model]
        feed = inputs_for(spec, plan.eval_rows, seed=12345)
        got, serving_plan = _outputs(config, spec, feed, plan.eval_rows)
        outputs[config.label] = got
        path = config.version.model_path
        if path not in references:  # both runtimes serve the same file
            _, params = zoo_params(load_checkpoint(path), path)
            references[path] = reference_forward(spec, dequantized_weights(spec, params), feed)
        reference = references[path]
        fp32 = outputs[config.fp32_label]
        out[config.label] = {
            "max_abs_diff_vs_fp32": float(np.abs(got - fp32).max()),
            "mean_abs_diff_vs_fp32": float(np.abs(got - fp32).mean()),
            "argmax_agreement_vs_fp32": float((got.argmax(1) == fp32.argmax(1)).mean()),
            "max_abs_diff_vs_numpy_reference": float(np.abs(got - reference).max()),
            "rows": plan.eval_rows,
            "serving_plan": serving_plan,
        }
    return out
