"""The run: per scenario, measure capacity and service times, replay the trace to find the best
static configurations and the per-phase oracle, run every arm for real, summarize."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from benchmarks.common import machine_info, usable_cores, write_results
from benchmarks.servers import set_knobs
from benchmarks.tuner import arms as arm_runs
from benchmarks.tuner import report
from benchmarks.tuner.scenarios import (
    RAMP_START,
    SCENARIOS,
    Capacity,
    Phase,
    Scenario,
    capacity_from_ramp,
    ramp_phases,
    resolve,
)
from benchmarks.tuner.servicetimes import calibrate, measure_samples
from rrl.replay import Scored, ServiceTimes, request_grid, score
from rrl.space import Config, expert_default

NAME = "tuner_e2e"  # the results file; the command is `iotgw bench tuner`
TIMEOUTS_MS = (0.0, 1.0, 2.0, 4.0, 8.0)
CAPACITY_SEED = 1000  # the ramp's arrivals: not one of the scenario's seeds


@dataclass(frozen=True)
class Options:
    scenarios: tuple[str, ...] = tuple(SCENARIOS)
    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = arm_runs.ARMS
    quick: bool = False
    out_dir: Path | None = None
    keep: Path | None = None
    replay_arms: int = 1
    """How many of the replay's best static configurations run for real (1 or 2)."""

    @property
    def duration_factor(self) -> float:
        return 0.1 if self.quick else 1.0


@dataclass(frozen=True)
class Model:
    name: str
    slo_ms: float
    max_batch_size: int
    configured: Config


def read_model(repo: Path, name: str) -> Model:
    from models.repository import ModelVersion, scan_repository

    (v,) = [v for v in scan_repository(repo) if v.name == name]
    assert isinstance(v, ModelVersion), v
    b = v.config.batching
    configured = Config(
        b.max_batch_size, b.batch_timeout_ms, b.concurrency, b.intra_op_threads, b.inter_op_threads
    )
    return Model(name, v.config.slo_ms, v.config.max_batch_size, configured)


def build_repo(model: str, root: Path) -> Path:
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    (demo,) = [m for m in DEMO_MODELS if m.name == model]
    write_model_version(demo, root / model / str(VERSION))
    return root


def measure_capacity(
    scenario: Scenario, model: Model, expert: Config, repo: Path, workdir: Path, quick: bool
) -> Capacity:
    """The ramp through one gateway, per reference configuration (see ``scenarios``)."""
    server, base = arm_runs.start_gateway(
        repo, workdir, model.name, agent=False, log_name=f"gateway-capacity-{scenario.name}.log"
    )
    rps: dict[str, float] = {}
    ramps: dict[str, list[dict[str, Any]]] = {}
    steps, step_s = (9, 1.0) if quick else (13, 1.5)
    try:
        for ref in sorted(scenario.references, reverse=True):  # max first, then batch1
            knobs = expert.knob_changes()
            if ref == "batch1":
                knobs["max_batch_size"] = 1
            set_knobs(base, model.name, knobs)
            out = workdir / f"ramp-{scenario.name}-{ref}"
            run = arm_runs.Run(
                base,
                ramp_phases(RAMP_START[model.name], steps, step_s),
                CAPACITY_SEED,
                model.slo_ms,
                out,
            )
            served, ramps[ref] = capacity_from_ramp(arm_runs.run_sim(scenario, run), model.slo_ms)
            rps[ref] = max(served, RAMP_START[model.name])
    finally:
        server.stop()
    # Eager batching serves at least what batch 1 does (it runs batch 1 when that keeps up):
    # a lower figure is noise in the max ramp.
    rps["max"] = max(rps.values())
    return Capacity(rps, ramps)


def thread_settings(cores: int, expert: Config) -> list[tuple[int, int]]:
    """A few thread settings: one instance, one per core, two per core, one with every core,
    and the expert default's."""
    wanted = {
        (1, 1),
        (cores, 1),
        (2 * cores, 1),
        (1, cores),
        (expert.concurrency, expert.intra_op_threads),
    }
    return sorted(wanted)


def seeded_trace(
    scenario: Scenario, phases: tuple[Phase, ...], seed: int
) -> tuple[list[float], list[int]]:
    """The arrival times ``iotgw sim --seed`` will send (the same scenario, the same seed)."""
    from device_sim.plan import plan_from_scenario
    from device_sim.scenario import parse_scenario

    doc = {
        "phases": [
            {"name": p.name, "duration_s": p.duration_s, "process": "poisson", "rate": p.rate_per_s}
            for p in phases
        ]
    }
    schedule_seed, _ = np.random.SeedSequence(seed).spawn(2)
    devices = [f"d{i}" for i in range(scenario.devices)]
    plan = plan_from_scenario(
        parse_scenario(doc),
        np.random.default_rng(schedule_seed),
        devices,
        [scenario.model],
        max_requests=1_000_000,
        max_duration_s=3600.0,
    )
    return plan.times.tolist(), plan.phase.tolist()


def replay_search(
    scored: list[Scored], slo_ms: float, exclude: list[Config], k: int
) -> tuple[list[Scored], list[Scored]]:
    """(the k best static configurations over the whole trace, not among ``exclude``; each
    phase's best)."""
    ranked = sorted(scored, key=lambda s: s.overall.objective(slo_ms))
    best = [s for s in ranked if s.config not in exclude][:k]
    n_phases = len(scored[0].phases)
    oracle = [_best_in_phase(scored, i, slo_ms) for i in range(n_phases)]
    return best, oracle


def _best_in_phase(scored: list[Scored], phase: int, slo_ms: float) -> Scored:
    return min(scored, key=lambda s: s.phases[phase].objective(slo_ms))


def _prediction(s: Scored, slo_ms: float) -> dict[str, Any]:
    return {
        "p95_ms": s.overall.p95_ms,
        "violations": s.overall.violations,
        "objective": round(s.overall.objective(slo_ms), 3),
        "phases_p95_ms": [f.p95_ms for f in s.phases],
    }


def run_seed(
    scenario: Scenario,
    model: Model,
    expert: Config,
    phases: tuple[Phase, ...],
    service: ServiceTimes,
    seed: int,
    opts: Options,
    repo: Path,
    workdir: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every arm of one seed for real, after the replay search; (runs, the seed's figures)."""
    times, phase_of = seeded_trace(scenario, phases, seed)
    grid = request_grid(service.settings(), service.batch_sizes(service.settings()[0]), TIMEOUTS_MS)
    started = time.monotonic()
    scored = score(grid, times, phase_of, len(phases), service, slo_s=model.slo_ms / 1e3, seed=seed)
    replay_s = time.monotonic() - started
    best, oracle = replay_search(
        scored, model.slo_ms, [model.configured, expert], k=opts.replay_arms
    )
    by_config = {s.config: s for s in scored}
    plans: dict[str, tuple[Config, list[tuple[float, dict[str, Any]]] | None]] = {
        "configured": (model.configured, None),
        "expert": (expert, None),
        **{f"replay-best-{i + 1}": (s.config, None) for i, s in enumerate(best)},
        "oracle": (oracle[0].config, _switches(phases, [s.config for s in oracle])),
        "agent": (expert, None),
    }
    runs = []
    for arm in (a for a in opts.arms if a in plans):
        config, switches = plans[arm]
        out = workdir / f"{scenario.name}-seed{seed}-{arm}"
        run = arm_runs.Run("", phases, seed, model.slo_ms, out)
        started = time.monotonic()
        result = arm_runs.run_arm(
            arm, scenario, run, repo, workdir, knobs=config.knob_changes(), switches=switches
        )
        result.update(scenario=scenario.name, elapsed_s=round(time.monotonic() - started, 1))
        if arm == "oracle":
            result["predicted"] = [_prediction(s, model.slo_ms) for s in oracle]
        elif arm != "agent" and config in by_config:
            result["predicted"] = _prediction(by_config[config], model.slo_ms)
        o = result["overall"]
        print(
            f"{scenario.name} seed {seed} {arm}: p95 {o['p95_ms']} ms, "
            f"violations {o['slo_violations']}, lost {o['lost']}",
            file=sys.stderr,
            flush=True,
        )
        runs.append(result)
    arms = {r["arm"]: r for r in runs}
    windows = report.phase_windows([vars(p) for p in phases])
    figures = report.seed_summary(arms, windows, model.slo_ms)
    figures.update(seed=seed, replay_s=round(replay_s, 2), replay_configs=len(scored))
    return runs, figures


def _switches(
    phases: tuple[Phase, ...], configs: list[Config]
) -> list[tuple[float, dict[str, Any]]]:
    """Knob changes at the phase boundaries where the oracle's configuration changes."""
    out = []
    start = 0.0
    for i, p in enumerate(phases):
        if i > 0 and configs[i] != configs[i - 1]:
            out.append((start, configs[i].knob_changes()))
        start += p.duration_s
    return out


def run_scenario(
    scenario: Scenario, opts: Options, workdir: Path
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(runs, summary, config) of one scenario."""
    repo = build_repo(scenario.model, workdir / f"repo-{scenario.name}")
    model = read_model(repo, scenario.model)
    cores = usable_cores()
    expert = expert_default(cores, model.max_batch_size)
    capacity = measure_capacity(scenario, model, expert, repo, workdir, opts.quick)
    phases = resolve(scenario, capacity)
    print(f"{scenario.name}: capacity {capacity.rps}, phases {phases}", file=sys.stderr, flush=True)
    sizes = [2**i for i in range(int(np.log2(min(model.max_batch_size, 128))) + 1)]
    samples = measure_samples(
        repo,
        model.name,
        thread_settings(cores, expert),
        sizes,
        seconds_per_cell=0.05 if opts.quick else 0.3,
    )
    service = calibrate(samples, expert, capacity.rps)
    runs: list[dict[str, Any]] = []
    per_seed = []
    for seed in opts.seeds:
        seed_runs, figures = run_seed(
            scenario, model, expert, phases, service, seed, opts, repo, workdir
        )
        runs += seed_runs
        per_seed.append(figures)
    summary = report.median_summary(per_seed)
    summary["targets"] = report.targets(summary)
    summary["per_seed"] = per_seed
    config = {
        "model": model.name,
        "slo_ms": model.slo_ms,
        "configured": model.configured.knob_changes(),
        "expert_default": expert.knob_changes(),
        "capacity_rps": capacity.rps,
        "capacity_ramps": capacity.ramps,
        "phases": [vars(p) for p in phases],
        "steps": [vars(s) for s in scenario.steps],
        "service_times": service.as_dict(),
        "devices": scenario.devices,
        "transport": scenario.transport,
        "framing": scenario.framing,
    }
    return runs, summary, config


def run(opts: Options) -> Path:
    machine = machine_info()  # with the load average at the start
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    config: dict[str, Any] = {
        "seeds": list(opts.seeds),
        "arms": list(opts.arms),
        "agent_algorithm": arm_runs.AGENT_ALGORITHM,
        "method": METHOD,
        "scenarios": {},
    }
    with TemporaryDirectory(prefix="iotgw-bench-tuner-") as tmp:
        workdir = opts.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in opts.scenarios:
            scenario = SCENARIOS[name].scaled(opts.duration_factor)
            scenario_runs, summary[name], config["scenarios"][name] = run_scenario(
                scenario, opts, workdir
            )
            runs += scenario_runs
            # After each scenario, so a long run that is stopped keeps what it measured.
            path = write_results(
                NAME,
                quick=opts.quick,
                out_dir=opts.out_dir,
                machine=machine,
                summary=summary,
                runs=runs,
                config=config,
            )
    print(report.table(runs))
    for name, s in summary.items():
        print(name, {k: s[k] for k in report.SUMMARY_KEYS})
    return path


METHOD = (
    "Per scenario: capacity measured first with iotgw sim's own Poisson ramp through one gateway "
    "(expert default; and at max batch 1 where a step refers to it); phase rates are fractions of "
    "it. Service times: c ONNX Runtime sessions of t threads calling back to back at once, per "
    "batch size, for a few (c, t); the gateway's per-request and per-batch costs calibrated from "
    "the measured capacities (benchmarks/tuner/servicetimes.py). Replay: the seed's arrival times "
    "(the very ones iotgw sim sends) through rrl.replay's batcher model for the request-level "
    "grid under each thread setting; the best two over the whole trace (objective p95 + 2 x SLO x "
    "violating share, configured and expert excluded) and each phase's best (the oracle) are "
    "then run for real. Each arm a fresh gateway process over HTTP; figures as the devices saw "
    "them (violations = late + errors + lost). Best static in hindsight: the static arm with the "
    "lowest measured objective."
)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(Options(seeds=(0,) if quick else (0, 1, 2), quick=quick, out_dir=out_dir))
    return 0


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tuner", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one seed, short phases, to check it works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--keep", type=Path, help="keep logs, simulator outputs and decision logs here")
    p.add_argument("--scenarios", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--arms", help=f"comma-separated subset of {','.join(arm_runs.ARMS)}")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2; --quick: 0)")
    p.add_argument(
        "--resummarize",
        type=Path,
        help="recompute the summary of this results file from its runs, then exit",
    )
    p.add_argument(
        "--replay-arms", type=int, choices=[1, 2], default=1, help="replay candidates run for real"
    )
    args = p.parse_args(argv)
    if args.resummarize:
        doc = json.loads(args.resummarize.read_text(encoding="utf-8"))
        doc["summary"] = report.resummarize(doc)
        args.resummarize.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return 0
    opts = Options(quick=args.quick, out_dir=args.out, keep=args.keep)
    scenarios = _subset(p, args.scenarios, tuple(SCENARIOS), "scenarios")
    arms = _subset(p, args.arms, arm_runs.ARMS, "arms")
    seeds = (
        tuple(int(s) for s in args.seeds.split(","))
        if args.seeds
        else ((0,) if args.quick else opts.seeds)
    )
    run(Options(scenarios, seeds, arms, args.quick, args.out, args.keep, args.replay_arms))
    return 0


def _subset(
    p: argparse.ArgumentParser, given: str | None, known: tuple[str, ...], what: str
) -> tuple[str, ...]:
    if not given:
        return known
    chosen = tuple(x.strip() for x in given.split(",") if x.strip())
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        p.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return chosen
