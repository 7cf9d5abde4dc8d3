"""Does the replay rank configurations as the gateway does? A check short enough to run after
any change to the replay's model, without a full ``iotgw bench tuner``.

For one single-model scenario (default sensor_mlp), shortened to about ``--seconds`` of trace:
measure capacity and where the CPU goes (the bench's ramps), measure service times,
calibrate, then run a few static configurations for real (each a fresh gateway, the same
seeded trace: the bench's own arm runner) and replay the same trace for each. Prints both
orders (by p95 and by the bench's objective) and writes everything measured to a JSON file, so
another model of the replay can be scored on the same measurements.

    python -m benchmarks.tuner.rankcheck --out /tmp/rankcheck.json

Timings are asserted nowhere: this is a measurement, run by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from benchmarks.common import load_average, machine_info, now_iso, usable_cores
from benchmarks.tuner import arms as arm_runs
from benchmarks.tuner import report
from benchmarks.tuner.replay import score
from benchmarks.tuner.run import (
    Model,
    build_repo,
    measure_capacity,
    read_model,
    thread_settings,
)
from benchmarks.tuner.scenarios import SCENARIOS, Phase, Scenario, resolve
from benchmarks.tuner.search import ModelPlan, streams
from benchmarks.tuner.servicetimes import calibrate, measure_samples
from models.knobs import Knobs
from rrl.tuners.space import expert_default

SIZES = [1, 2, 4, 8, 16, 32]


def configs(cores: int, max_batch: int) -> dict[str, Knobs]:
    """The expert default and a few that spread instances and batch sizes differently."""
    return {
        "expert": expert_default(cores, max_batch),
        "4x4": Knobs(4, 0.0, 4, 1, 1),
        "1x32": Knobs(32, 0.0, 1, 1, 1),
        "2x16": Knobs(16, 0.0, 2, 1, 1),
    }


def run_check(
    scenario_name: str, seconds: float, seed: int, rounds: int, workdir: Path, quick_ramp: bool
) -> dict:
    base = SCENARIOS[scenario_name]
    total = sum(s.duration_s for s in base.streams[0].steps)
    scenario = base.scaled(seconds / total)
    (stream,) = scenario.streams
    repo = build_repo(scenario.models, workdir / "repo")
    model = read_model(repo, stream.model)
    cores = usable_cores()
    expert = expert_default(cores, model.max_batch_size)
    # The full ramp reaches overload, where eager batching forms large batches: the loop's
    # cost per batch is told apart from its cost per request only then.
    capacity, cpu = measure_capacity(scenario, model, expert, repo, workdir, quick=quick_ramp)
    phases = resolve(stream, capacity)
    chosen = configs(cores, model.max_batch_size)
    settings = set(thread_settings(cores, expert))
    settings |= {(c.concurrency, c.intra_op_threads) for c in chosen.values()}
    samples = measure_samples(repo, model.name, sorted(settings), SIZES, seconds_per_cell=0.05)
    costs = calibrate(
        samples, cpu, (capacity.rps["batch1"], (expert.concurrency, expert.intra_op_threads))
    )
    plan = ModelPlan(model.name, model.slo_ms, phases, costs, model.configured, expert)
    windows = report.phase_windows([vars(p) for p in phases])
    (lane,) = streams(scenario, [plan], windows, seed)
    replayed = score([lane], [(c,) for c in chosen.values()], len(windows), cores, seed=seed)
    predicted = {
        name: {"p95_ms": s.overall[0].p95_ms, "objective": s.objective([model.slo_ms])}
        for name, s in zip(chosen, replayed, strict=True)
    }
    measured = measure(scenario, model, phases, chosen, seed, rounds, repo, workdir)
    return {
        "scenario": scenario_name,
        "seconds": seconds,
        "seed": seed,
        "slo_ms": model.slo_ms,
        "configs": {n: c.as_dict() for n, c in chosen.items()},
        "capacity_rps": capacity.rps,
        "capacity_cpu": {ref: use.as_dict() for ref, use in cpu.items()},
        "cpu_raw": {ref: vars(use) for ref, use in cpu.items()},
        "samples": {f"{c}x{t}": v for (c, t), v in samples.items()},
        "phases": [vars(p) for p in phases],
        "costs": costs.as_dict(),
        "predicted": predicted,
        "measured": measured,
        "orders": orders(predicted, measured),
    }


def measure(
    scenario: Scenario,
    model: Model,
    phases: tuple[Phase, ...],
    chosen: dict[str, Knobs],
    seed: int,
    rounds: int,
    repo: Path,
    workdir: Path,
) -> dict[str, list[dict[str, Any]]]:
    """Each configuration's figures over the trace, per round, each on a fresh gateway; the
    rounds interleave the configurations, so a slow spell of the machine hits them alike."""
    measured: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    for r in range(rounds):
        for name, config in chosen.items():
            load = arm_runs.Load(
                model.name, phases, seed, model.slo_ms, workdir / f"round{r}-{name}"
            )
            result = arm_runs.run_arm(
                name, scenario, [load], repo, workdir, knobs={model.name: config.as_dict()}
            )
            o = result["overall"]
            measured[name].append(
                {**o, "objective": report.objective(o, model.slo_ms) / model.slo_ms}
            )
            print(
                f"round {r} {name}: p95 {o['p95_ms']} ms, violations {o['slo_violations']}",
                file=sys.stderr,
                flush=True,
            )
    return measured


def orders(
    predicted: dict[str, dict[str, float | None]], measured: dict[str, list[dict[str, Any]]]
) -> dict[str, list[str]]:
    """Configurations best first: the replay's and the gateway's (median over rounds), by p95
    and by objective."""

    def med(name: str, key: str) -> float:
        values = [m[key] for m in measured[name] if m[key] is not None]
        return statistics.median(values) if values else float("inf")

    return {
        "replay_p95": sorted(predicted, key=lambda n: predicted[n]["p95_ms"] or float("inf")),
        "measured_p95": sorted(measured, key=lambda n: med(n, "p95_ms")),
        "replay_objective": sorted(predicted, key=lambda n: predicted[n]["objective"] or 0.0),
        "measured_objective": sorted(measured, key=lambda n: med(n, "objective")),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tuner.rankcheck", description=__doc__)
    p.add_argument("--scenario", default="sensor_mlp", choices=sorted(SCENARIOS))
    p.add_argument("--seconds", type=float, default=10.0, help="trace length per configuration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1, help="runs of every configuration")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    p.add_argument("--quick-ramp", action="store_true", help="the bench's --quick capacity ramp")
    args = p.parse_args(argv)
    if len(SCENARIOS[args.scenario].streams) != 1:
        p.error("one model only")
    started = {"created": now_iso(), "load_average_start": load_average()}
    with TemporaryDirectory(prefix="iotgw-rankcheck-") as tmp:
        doc = run_check(
            args.scenario, args.seconds, args.seed, args.rounds, Path(tmp), args.quick_ramp
        )
    doc.update(started, load_average_end=load_average(), machine=machine_info())
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for key, order in doc["orders"].items():
        print(f"{key:20s} {' < '.join(order)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
