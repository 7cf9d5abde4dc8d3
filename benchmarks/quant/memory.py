"""Weight memory, measured in fresh processes: each configuration loaded in a Python process
that already imported everything and ran two small models on the same runtime, a float one
and a small CNN at the configuration's own precision, and on ONNX Runtime the configuration
itself once (one-time allocations out of the way: the kernels a quantized graph runs allocate
once per process too; with a float model alone the first quantized load of vision_cnn on ONNX
Runtime held 0.3-0.4 MB more than the next, 0.05 of fp32). Not the configuration itself on
TensorFlow, whose allocator pool keeps its high-water mark: a second load reuses what the
first grew (vision_cnn's 6.75 MB of float weights then read 3.2-7.2 MB). The figure is the
growth of the process's anonymous resident memory (``RssAnon``, after ``malloc_trim``) from
before the load to after the load and a few batch-1 inferences, and the extra peak of one
inference (``VmHWM`` reset just before it).

The child is ``python -m benchmarks.quant --measure-memory JOBS``: it prints one
``MEMORY {json}`` line per job (``measure_memory_here``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Repeated, python_argv
from benchmarks.quant.measure import version_of
from benchmarks.quant.plan import (
    BLOCK_SIZE,
    CNN_SMALL,
    PRECISIONS,
    RUNTIMES,
    WEIGHT_MEMORY_BUDGET,
    Config,
    Plan,
)
from models.checkpoint import save_checkpoint
from models.repository import ModelVersion
from models.runtime import Threads
from models.zoo import SENSOR_FUSION, ModelSpec, init_weights
from models.zoo_checkpoint import uniform_policy, zoo_checkpoint

MEMORY_MARK = "MEMORY "
WARM_CALLS = 3  # batch-1 calls before the memory a session holds is read
# Runtimes whose configuration is loaded, run and closed once before it is measured: what is
# left of the first load is one-time, and a checkpoint's ONNX Runtime session runs without a
# memory arena, so the second load allocates all it holds afresh (vision_cnn int4 after the
# small CNN alone: 3.75 MB at the first load, 3.54 at the next; in one process, 0.03 MB over
# the plan's estimate, as fp32 is). Not TensorFlow: its pool keeps what the first load grew.
WARMED_ON_ITSELF = frozenset({"onnxruntime"})


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


def _warm_runtime(job: dict[str, Any]) -> None:
    """One-time costs of the runtime (libraries, thread pools, kernel registries) first."""
    cache = job.get("plan_cache")
    for warmup in job["warmups"]:
        warm = version_of(
            Path(warmup["path"]), job["runtime"], "warmup", None if cache is None else Path(cache)
        )
        _run_once(warm, {n: np.zeros((1, *s), np.float32) for n, s in warmup["inputs"]}, 1)


def _run_once(version: ModelVersion, feed: dict[str, np.ndarray], calls: int) -> None:
    """Load ``version``, run it ``calls`` times on ``feed`` and close it."""
    from models.backends import load_runtime

    runtime = load_runtime(version, Threads(1, 1))
    for _ in range(calls):
        runtime.infer(feed)
    runtime.close()


def _measure_one(job: dict[str, Any]) -> dict[str, Any]:
    from models.backends import load_runtime

    cache = job.get("plan_cache")
    version = version_of(
        Path(job["path"]),
        job["runtime"],
        job["model"],
        None if cache is None else Path(cache),
        job.get("weight_memory_budget", WEIGHT_MEMORY_BUDGET),
    )
    feed = {i["name"]: np.zeros((1, *i["shape"]), np.float32) for i in job["inputs"]}
    _warm_runtime(job)
    if job["runtime"] in WARMED_ON_ITSELF:
        _run_once(version, feed, WARM_CALLS)
    before = _held_bytes()
    runtime = load_runtime(version, Threads(1, 1))
    loaded = _held_bytes()
    # The first runs allocate for good (TF optimizes the graph and builds executors, the
    # allocators settle): the figure is the steady state after WARM_CALLS, and the peak is
    # that of the last one.
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
    return {
        "label": job["label"],
        "load_bytes": loaded - before,
        "held_bytes": held - before,
        "run_peak_extra_bytes": peak - rss_before_call if peak_ok else None,
    }


def measure_memory_here(jobs: Sequence[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Run in a fresh process: load each job's checkpoint in turn, measure, close."""
    for job in jobs:
        yield _measure_one(job)


def write_warmups(folder: Path) -> dict[str, list[tuple[Path, ModelSpec]]]:
    """precision -> the checkpoints a memory process runs first (``_warm_runtime``): a float
    ``SENSOR_FUSION`` and ``CNN_SMALL`` at that precision."""
    sensor = zoo_checkpoint(SENSOR_FUSION, init_weights(SENSOR_FUSION), uniform_policy(None, 16))
    floats = save_checkpoint(sensor, folder / "sensor_fusion" / "model.safetensors")
    out: dict[str, list[tuple[Path, ModelSpec]]] = {}
    for precision, bits in PRECISIONS:
        small = zoo_checkpoint(CNN_SMALL, init_weights(CNN_SMALL), uniform_policy(bits, BLOCK_SIZE))
        path = save_checkpoint(small, folder / f"cnn_small_{precision}" / "model.safetensors")
        out[precision] = [(floats, SENSOR_FUSION), (path, CNN_SMALL)]
    return out


def measure_memory(
    plan: Plan,
    configs: Sequence[Config],
    specs: dict[str, ModelSpec],
    warmups: Mapping[str, Sequence[tuple[Path, ModelSpec]]],
) -> dict[str, dict[str, Repeated]]:
    """label -> figure (``load_bytes``, ``held_bytes``, ``run_peak_extra_bytes``)."""

    def inputs(spec: ModelSpec) -> list[list[Any]]:
        return [[i.name, list(i.shape)] for i in spec.inputs]

    def job(c: Config) -> dict[str, Any]:
        cache = c.version.plan_cache_dir
        return {
            "label": c.label,
            "model": c.model,
            "path": str(c.version.model_path),
            "plan_cache": None if cache is None else str(cache),
            "runtime": c.runtime,
            "inputs": [{"name": i.name, "shape": list(i.shape)} for i in specs[c.model].inputs],
            "warmups": [
                {"path": str(path), "inputs": inputs(spec)} for path, spec in warmups[c.precision]
            ],
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
