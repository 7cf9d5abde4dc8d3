"""The quantization benchmark from start to end: the checkpoints written, memory, agreement
and latency measured, the results written and printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import BenchRun, print_summary
from benchmarks.quant import report
from benchmarks.quant.measure import (
    agreement,
    measure_latency,
    stored_bytes,
    version_of,
    write_checkpoints,
)
from benchmarks.quant.memory import measure_memory, write_warmups
from benchmarks.quant.plan import FULL, NAME, PRECISIONS, QUICK, RUNTIMES, Config, Plan


def _measure(plan: Plan, work: Path) -> list[dict[str, Any]]:
    """Every configuration measured: its results entries, in configuration order."""
    specs = {s.name: s for s in plan.models}
    files = write_checkpoints(plan, work)
    warmups = write_warmups(work / "warmup")
    configs = [
        Config(
            spec.name,
            precision,
            runtime,
            version_of(files[spec.name][precision], runtime, spec.name, work / "plan-cache"),
        )
        for spec in plan.models
        for runtime in RUNTIMES
        for precision, _ in PRECISIONS
    ]
    sizes = {c.label: stored_bytes(c.version.model_path) for c in configs}
    # Agreement first: its loads measure the serving plans' costs, which the memory processes
    # then read from the cache instead of measuring in the process they measure.
    print("planning, and measuring output agreement...", flush=True)
    agree = agreement(plan, configs, specs)
    print(f"measuring weight memory ({len(configs)} configurations)...", flush=True)
    memory = measure_memory(plan, configs, specs, warmups)
    print(f"measuring latency ({plan.rounds} round(s))...", flush=True)
    latency = measure_latency(plan, configs, specs)
    return [report.entry(c, sizes[c.label], memory, latency, agree[c.label]) for c in configs]


def run(plan: Plan, out_dir: Path | None) -> Path:
    record = BenchRun(NAME, plan.quick, out_dir)
    with record.workdir() as workdir:
        runs = _measure(plan, workdir)
    summary = report.summarize(plan, runs)
    print(report.table(runs))
    print_summary(summary)
    return record.write(summary=summary, runs=runs, config=report.config(plan))


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir)
    return 0
