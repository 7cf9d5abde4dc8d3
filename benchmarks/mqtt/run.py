"""The MQTT benchmark from start to end: the stack up, the two experiments, the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.common import BenchRun, load_average
from benchmarks.mqtt import report
from benchmarks.mqtt.experiments import Recorder, low_load, saturation
from benchmarks.mqtt.plan import FULL, QUICK, Plan, request
from benchmarks.mqtt.stack import open_stack


def run(plan: Plan, out_dir: Path | None, quick: bool) -> Path:
    req = request(np.random.default_rng(0), "bench")
    rec = Recorder()
    record = BenchRun("mqtt", quick, out_dir)
    with record.workdir() as workdir, open_stack(workdir, plan) as stack:
        low_load(stack, plan, req, rec)
        saturation(stack, plan, req, rec)
    record.machine["load_average_at_end"] = load_average()
    summary = report.summarize(plan, rec.results, rec.runs)
    report.print_report(plan, rec.results, summary)
    return record.write(summary=summary, runs=rec.runs, config=report.config(plan))


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir, quick)
    return 0
