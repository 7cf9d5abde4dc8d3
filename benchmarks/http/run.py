"""The HTTP benchmark from start to end: the servers up, the six experiments in order, the
results written and printed, everything stopped whatever happens."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from benchmarks.common import BenchRun
from benchmarks.http import report
from benchmarks.http.bench import Bench
from benchmarks.http.codec_cpu import cpu_per_request
from benchmarks.http.cpu_by_load import cpu_by_load
from benchmarks.http.headline import paired_headline
from benchmarks.http.limit import inprocess_sweep
from benchmarks.http.low_load import low_load
from benchmarks.http.plan import FULL, LOW_LOAD_MODEL, NAME, QUICK, Plan
from benchmarks.http.saturation import gateway_knob_sweep, gateway_saturation
from benchmarks.http.workload import Model, build_repository, check_replies, load_models
from benchmarks.servers import start_gateway, start_http_echo


def _experiments(
    bench: Bench, workdir: Path
) -> tuple[dict[str, Model], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(models, the throughput ratios per model, the low-load entries per client kind, the CPU
    per request entries per workload, the CPU per request by load)."""
    plan, log = bench.plan, bench.log
    repo = build_repository(workdir / "repo")
    models = load_models(repo)
    log(f"starting the gateway (repository {repo})")
    bench.gateway, base = start_gateway(repo, workdir, plan.startup_timeout_s)
    bench.config["gateway"] = {
        "argv": bench.gateway.argv,
        "where": "separate process on the same machine, loopback",
        "repository": "models.demo's sensor_mlp and vision_cnn (ONNX), same weights/config",
    }
    diffs = check_replies(base, models)
    log(f"gateway replies match the runtime (max abs diff {diffs})")
    best = inprocess_sweep(bench, models)
    gw_knobs = gateway_knob_sweep(bench, base, models, best)
    sweeps = gateway_saturation(bench, base, models, best, gw_knobs)
    heads = paired_headline(bench, base, models, best, gw_knobs, sweeps)
    log("low load")
    bench.echo, echo_base = start_http_echo(workdir, plan.startup_timeout_s)
    low = low_load(bench, base, echo_base, models[LOW_LOAD_MODEL])
    codec = cpu_per_request(bench, repo, workdir, models)
    by_load = cpu_by_load(bench, repo, workdir, models)
    return models, heads, low, codec, by_load


def run(plan: Plan, out_dir: Path | None) -> Path:
    record = BenchRun(NAME, plan.quick, out_dir)
    bench = Bench(plan, record.log)
    with record.workdir() as workdir, contextlib.closing(bench):
        models, heads, low, codec, by_load = _experiments(bench, workdir)
    summary = report.summarize(plan, heads, low, codec, by_load, bench.runs)
    bench.config.update(
        {"models": report.models_config(models), **report.METHOD, "wall_s": record.wall_s()}
    )
    report.print_tables(bench.runs, summary)
    return record.write(summary=summary, runs=bench.runs, config=bench.config)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir)
    return 0
