"""Quantized checkpoints against fp32 on both runtimes (``iotgw bench quant``).

For a model with large fully connected layers (``fc_large``: 1024 -> 4096 -> 4096 -> 1024 -> 10,
25M weights) and for the demo CNN (``vision_cnn``), side by side in one run, the same weights as
an fp32, an int8 and an int4 checkpoint (qwZ blocks of 128 along each kernel's input), each
served by ONNX Runtime (MatMulNBits with ``accuracy_level=4`` for fully connected layers,
blocked DequantizeLinear for convolutions) and by TensorFlow (codes dequantized in the graph:
two per byte at 4 bits, one at 8). The fp32 baseline goes through the same checkpoint path with
float tensors, so the graphs differ only in how the weights are held.

- **Latency** at batch 1, 8 and 32, one intra-op thread: per round, every configuration in
  turn, the median of back-to-back calls; 5 rounds (median, min, max). The int/fp32 ratio is
  taken per round, so both sides of a ratio saw the same moment of a shared machine.
- **Weight memory in the process**: each configuration loaded in a fresh Python process that
  already imported everything and ran a tiny model on the same runtime (one-time allocations
  out of the way); the figure is the growth of the process's anonymous resident memory
  (``RssAnon``, after ``malloc_trim`` so that freed heap pages do not count) from before the
  load to after the load and one batch-1 inference: what the session keeps holding, codes or
  floats plus the runtime's own structures. The extra peak while an inference runs (transient
  dequantized weights, activations) is shown beside it, from ``VmHWM`` reset just before the
  call. File size and the bytes of codes plus scales are listed for comparison. 5 fresh
  processes per configuration (median).
- **Agreement with fp32** on a fixed input set: largest absolute difference of the output
  probabilities and the fraction of rows with the same argmax; and the largest difference from
  the NumPy reference forward of the dequantized weights (how exactly each runtime computes
  what the codes say; ONNX Runtime's accuracy level 4 quantizes activations to int8, which
  shows here).

Summary: ``int4_weight_memory_ratio`` (fc_large, ONNX Runtime, int4 / fp32 weight memory) and
``int4_batch1_latency_ratio`` (fc_large, ONNX Runtime, int4 / fp32 at batch 1), plus the same
figures for the CNN and for TensorFlow. ``--quick`` runs a small fully connected model, one
round and one memory process per runtime, on a small MLP and a small CNN, in seconds. Results:
``benchmarks/results/quant.json`` (``quant.quick.json`` in quick mode, or under ``--out``).

Run with ``iotgw bench quant [--quick] [--out DIR]`` or ``python -m benchmarks.quant``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (
    MIN_FULL_RUNS,
    Repeated,
    fmt_repeated,
    format_table,
    machine_info,
    now_iso,
    python_argv,
    write_results,
)
from models.checkpoint import QuantizedTensor, load_checkpoint, save_checkpoint
from models.repository import ModelConfig, ModelVersion
from models.runtime import Runtime, Threads
from models.zoo import (
    SENSOR_FUSION,
    VISION_CNN,
    Conv2D,
    Dense,
    Flatten,
    Input,
    MaxPool2D,
    ModelSpec,
    init_weights,
    reference_forward,
)
from models.zoo_checkpoint import dequantized_weights, uniform_policy, zoo_checkpoint, zoo_params

NAME = "quant"
RUNTIMES = ("onnxruntime", "tensorflow")
PRECISIONS: tuple[tuple[str, int | None], ...] = (("fp32", None), ("int8", 8), ("int4", 4))
BATCHES = (1, 8, 32)
BLOCK_SIZE = 128
ACCURACY_LEVEL = 4
MEMORY_MARK = "MEMORY "
WARM_CALLS = 3  # batch-1 calls before the memory a session holds is read

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


def version_of(path: Path, runtime: str, name: str) -> ModelVersion:
    config = ModelConfig.model_validate(
        {
            "runtime": runtime,
            "path": path.name,
            "format": "checkpoint",
            "accuracy_level": ACCURACY_LEVEL,
        }
    )
    return ModelVersion(name, 1, path.parent, config)


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


def agreement(
    plan: Plan, configs: Sequence[Config], specs: dict[str, ModelSpec]
) -> dict[str, dict[str, Any]]:
    """Outputs on a fixed input set, against the same runtime's fp32 and the NumPy reference."""
    from models.backends import load_runtime

    outputs: dict[str, np.ndarray] = {}
    references: dict[Path, np.ndarray] = {}
    out: dict[str, dict[str, Any]] = {}
    for config in configs:
        spec = specs[config.model]
        feed = inputs_for(spec, plan.eval_rows, seed=12345)
        runtime = load_runtime(config.version, Threads(1, 1))
        try:
            got = np.concatenate(
                [
                    runtime.infer({k: v[i : i + 32] for k, v in feed.items()})[spec.output]
                    for i in range(0, plan.eval_rows, 32)
                ]
            )
        finally:
            runtime.close()
        outputs[config.label] = got
        path = config.version.model_path
        if path not in references:  # both runtimes serve the same file
            _, params = zoo_params(load_checkpoint(path), path)
            references[path] = reference_forward(spec, dequantized_weights(spec, params), feed)
        reference = references[path]
        fp32 = outputs[f"{config.model}/{config.runtime}/fp32"]
        out[config.label] = {
            "max_abs_diff_vs_fp32": float(np.abs(got - fp32).max()),
            "mean_abs_diff_vs_fp32": float(np.abs(got - fp32).mean()),
            "argmax_agreement_vs_fp32": float((got.argmax(1) == fp32.argmax(1)).mean()),
            "max_abs_diff_vs_numpy_reference": float(np.abs(got - reference).max()),
            "rows": plan.eval_rows,
        }
    return out


# -- weight memory (child processes) --------------------------------------------------------


def _status_kib(field: str) -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def _held_bytes() -> int:
    """Anonymous resident bytes, after handing freed heap pages back to the kernel."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    kib = _status_kib("RssAnon")
    if kib is None:
        raise RuntimeError("no RssAnon in /proc/self/status (needs Linux)")
    return kib * 1024


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset VmHWM to the current RSS
        return True
    except OSError:
        return False


def measure_memory_here(jobs: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Run in a fresh process: load each job's checkpoint in turn, measure, close."""
    from models.backends import load_runtime

    for job in jobs:
        version = version_of(Path(job["path"]), job["runtime"], job["model"])
        warm = version_of(Path(job["warmup_path"]), job["runtime"], "warmup")
        spec_inputs = [(i["name"], tuple(i["shape"])) for i in job["inputs"]]
        feed = {n: np.zeros((1, *s), np.float32) for n, s in spec_inputs}
        # One-time costs of the runtime (libraries, thread pools, kernel registries) first.
        warm_rt = load_runtime(warm, Threads(1, 1))
        warm_rt.infer({n: np.zeros((1, *s), np.float32) for n, s in job["warmup_inputs"]})
        warm_rt.close()
        del warm_rt
        before = _held_bytes()
        runtime = load_runtime(version, Threads(1, 1))
        loaded = _held_bytes()
        # The first runs allocate for good (TF optimizes the graph and builds executors, the
        # allocators settle): the figure is the steady state after WARM_CALLS, and the peak
        # is that of the last one.
        for _ in range(WARM_CALLS - 1):
            runtime.infer(feed)
        _held_bytes()
        rss_before_call = (_status_kib("VmRSS") or 0) * 1024
        peak_ok = _reset_peak()
        runtime.infer(feed)
        peak = (_status_kib("VmHWM") or 0) * 1024
        held = _held_bytes()
        runtime.close()
        del runtime
        yield {
            "label": job["label"],
            "load_bytes": loaded - before,
            "held_bytes": held - before,
            "run_peak_extra_bytes": peak - rss_before_call if peak_ok else None,
        }


def measure_memory(
    plan: Plan, configs: Sequence[Config], specs: dict[str, ModelSpec], warmup: Path
) -> dict[str, dict[str, Repeated]]:
    warm_inputs = [[i.name, list(i.shape)] for i in SENSOR_FUSION.inputs]

    def job(c: Config) -> dict[str, Any]:
        return {
            "label": c.label,
            "model": c.model,
            "path": str(c.version.model_path),
            "runtime": c.runtime,
            "inputs": [{"name": i.name, "shape": list(i.shape)} for i in specs[c.model].inputs],
            "warmup_path": str(warmup),
            "warmup_inputs": warm_inputs,
        }

    if plan.memory_process_per_config:
        batches = [[job(c)] for _ in range(plan.memory_runs) for c in configs]
    else:
        batches = [[job(c) for c in configs if c.runtime == r] for r in RUNTIMES]
    samples: dict[str, dict[str, list[float]]] = {}
    for jobs in batches:
        for result in _memory_child(jobs):
            per = samples.setdefault(result["label"], {})
            for key in ("load_bytes", "held_bytes", "run_peak_extra_bytes"):
                if result[key] is not None:
                    per.setdefault(key, []).append(result[key])
    return {label: {k: Repeated.of(v) for k, v in per.items()} for label, per in samples.items()}


def _memory_child(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(
        python_argv("benchmarks.quant", "--measure-memory", json.dumps(jobs)),
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"memory measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return [
        json.loads(line[len(MEMORY_MARK) :])
        for line in proc.stdout.splitlines()
        if line.startswith(MEMORY_MARK)
    ]


# -- the run ----------------------------------------------------------------------------------


def run(plan: Plan, out_dir: Path | None) -> Path:
    created = now_iso()
    machine = machine_info()
    specs = {s.name: s for s in plan.models}
    with tempfile.TemporaryDirectory(prefix="iotgw-bench-quant-") as tmp:
        work = Path(tmp)
        files = write_checkpoints(plan, work)
        warm_checkpoint = zoo_checkpoint(
            SENSOR_FUSION, init_weights(SENSOR_FUSION), uniform_policy(None, 16)
        )
        warmup = save_checkpoint(warm_checkpoint, work / "warmup" / "model.safetensors")
        configs = [
            Config(
                spec.name,
                precision,
                runtime,
                version_of(files[spec.name][precision], runtime, spec.name),
            )
            for spec in plan.models
            for runtime in RUNTIMES
            for precision, _ in PRECISIONS
        ]
        sizes = {c.label: stored_bytes(c.version.model_path) for c in configs}
        print(f"measuring weight memory ({len(configs)} configurations)...", flush=True)
        memory = measure_memory(plan, configs, specs, warmup)
        print("measuring output agreement...", flush=True)
        agree = agreement(plan, configs, specs)
        print(f"measuring latency ({plan.rounds} round(s))...", flush=True)
        latency = measure_latency(plan, configs, specs)
    runs = []
    for c in configs:
        base = f"{c.model}/{c.runtime}/fp32"
        row: dict[str, Any] = {
            "figure": "configuration",
            "model": c.model,
            "runtime": c.runtime,
            "precision": c.precision,
            "block_size": None if c.precision == "fp32" else BLOCK_SIZE,
            **sizes[c.label],
            "memory": memory[c.label],
            "weight_memory_ratio_vs_fp32": memory[c.label]["held_bytes"].median
            / memory[base]["held_bytes"].median,
            "latency_s": {str(b): latency[c.label][b] for b in BATCHES},
            "latency_ratio_vs_fp32": {
                str(b): Repeated.of(
                    q / f
                    for q, f in zip(
                        latency[c.label][b].values, latency[base][b].values, strict=True
                    )
                )
                for b in BATCHES
            },
            "agreement": agree[c.label],
        }
        runs.append(row)
    summary = _summary(plan, runs)
    config = {
        "models": [s.name for s in plan.models],
        "block_size": BLOCK_SIZE,
        "accuracy_level": ACCURACY_LEVEL,
        "batches": list(BATCHES),
        "intra_op_threads": 1,
        "inter_op_threads": 1,
        "rounds": plan.rounds,
        "memory_runs": plan.memory_runs,
        "memory_method": "RssAnon growth (after malloc_trim) from before the load to after the "
        "load and one batch-1 inference, in a fresh process that had already run a tiny model "
        "on the same runtime",
        "target_int4_weight_memory_ratio": 0.17,
        "target_int4_batch1_latency_ratio": 1.0,
    }
    path = write_results(
        NAME,
        quick=plan.quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=runs,
        config=config,
        created=created,
    )
    print(_table(runs))
    print()
    print("Summary")
    print(format_table(["figure", "value"], [[k, v] for k, v in summary.items()]))
    print(f"\nwrote {path}")
    return path


def _row(
    runs: Sequence[dict[str, Any]], model: str, runtime: str, precision: str
) -> dict[str, Any]:
    return next(
        r for r in runs if (r["model"], r["runtime"], r["precision"]) == (model, runtime, precision)
    )


def _summary(plan: Plan, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    fc, cnn = plan.models[0].name, plan.models[1].name
    out: dict[str, Any] = {}
    for tag, model in (("", fc), ("_cnn", cnn)):
        for runtime, suffix in (("onnxruntime", ""), ("tensorflow", "_tf")):
            for precision in ("int4", "int8"):
                row = _row(runs, model, runtime, precision)
                out[f"{precision}_weight_memory_ratio{tag}{suffix}"] = round(
                    row["weight_memory_ratio_vs_fp32"], 4
                )
                out[f"{precision}_batch1_latency_ratio{tag}{suffix}"] = round(
                    row["latency_ratio_vs_fp32"]["1"].median, 4
                )
    out["fc_model"] = fc
    out["int4_weight_memory_target_met"] = out["int4_weight_memory_ratio"] <= 0.17
    out["int4_batch1_latency_target_met"] = out["int4_batch1_latency_ratio"] <= 1.0
    head = _row(runs, fc, "onnxruntime", "fp32")
    out["fc_fp32_weight_memory_mb"] = round(head["memory"]["held_bytes"].median / 1e6, 2)
    out["fc_fp32_batch1_ms"] = round(head["latency_s"]["1"].median * 1e3, 3)
    return out


def _table(runs: Sequence[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        mem = r["memory"]
        peak = mem.get("run_peak_extra_bytes")
        rows.append(
            [
                r["model"],
                r["runtime"],
                r["precision"],
                round(r["file_bytes"] / 1e6, 2),
                fmt_repeated(mem["held_bytes"], 1e-6),
                round(r["weight_memory_ratio_vs_fp32"], 3),
                "-" if peak is None else round(peak.median / 1e6, 2),
                *(fmt_repeated(r["latency_s"][str(b)], 1e3) for b in BATCHES),
                round(r["latency_ratio_vs_fp32"]["1"].median, 3),
                round(r["agreement"]["argmax_agreement_vs_fp32"], 3),
                f"{r['agreement']['max_abs_diff_vs_fp32']:.1e}",
                f"{r['agreement']['max_abs_diff_vs_numpy_reference']:.1e}",
            ]
        )
    headers = [
        "model",
        "runtime",
        "prec",
        "file MB",
        "held MB",
        "mem ratio",
        "run peak+ MB",
        *(f"b{b} ms" for b in BATCHES),
        "b1 ratio",
        "argmax=fp32",
        "max|d| fp32",
        "max|d| ref",
    ]
    return format_table(headers, rows)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir)
    return 0


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quant", description=__doc__)
    p.add_argument("--quick", action="store_true", help="seconds, to check it still works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--measure-memory", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure_memory:
        for result in measure_memory_here(json.loads(args.measure_memory)):
            print(MEMORY_MARK + json.dumps(result), flush=True)
        return 0
    return main(quick=args.quick, out_dir=args.out)


if __name__ == "__main__":
    sys.exit(_cli())
