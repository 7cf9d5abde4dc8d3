"""The run: per scenario, measure capacity and service times per model, replay the trace to find
the best static per-gateway configurations and the per-phase oracle, run every arm for real,
summarize."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from benchmarks.common import (
    load_average,
    machine_info,
    note_if_quick,
    now_iso,
    results_path,
    source_commit,
    usable_cores,
    write_results,
)
from benchmarks.servers import set_knobs
from benchmarks.tuner import arms as arm_runs
from benchmarks.tuner import report
from benchmarks.tuner.cpu import CONTENDED, CpuUse, Meter
from benchmarks.tuner.scenarios import (
    RAMP_START,
    SCENARIOS,
    Capacity,
    Phase,
    Scenario,
    Stream,
    capacity_from_ramp,
    pinned_capacity,
    ramp_phases,
    resolve,
)
from benchmarks.tuner.search import ModelPlan, prediction, replay_seed
from benchmarks.tuner.servicetimes import calibrate, measure_samples
from models.knobs import Knobs
from rrl.tuners.space import core_share, expert_default

NAME = "tuner_e2e"  # the results file; the command is `iotgw bench tuner`
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
    duration_factor: float | None = None
    """Phase lengths times this (default 1; --quick 0.1)."""
    rates_from: Path | None = None
    """An earlier results file whose capacities set the phase rates (``pinned_capacity``)."""

    @property
    def factor(self) -> float:
        if self.duration_factor is not None:
            return self.duration_factor
        return 0.1 if self.quick else 1.0


@dataclass(frozen=True)
class Model:
    name: str
    slo_ms: float
    max_batch_size: int
    configured: Knobs


def read_model(repo: Path, name: str) -> Model:
    from models.repository import ModelVersion, scan_repository

    (v,) = [v for v in scan_repository(repo) if v.name == name]
    assert isinstance(v, ModelVersion), v
    b = v.config.batching
    configured = Knobs(
        b.max_batch_size, b.batch_timeout_ms, b.concurrency, b.intra_op_threads, b.inter_op_threads
    )
    return Model(name, v.config.slo_ms, v.config.max_batch_size, configured)


def build_repo(models: tuple[str, ...], root: Path) -> Path:
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    for model in models:
        (demo,) = [m for m in DEMO_MODELS if m.name == model]
        write_model_version(demo, root / model / str(VERSION))
    return root


def measure_capacity(
    scenario: Scenario, model: Model, expert: Knobs, repo: Path, workdir: Path, quick: bool
) -> tuple[Capacity, dict[str, CpuUse]]:
    """The ramp through one gateway, the model alone, per reference configuration (see
    ``scenarios``), and where the CPU went on each ramp (``cpu``)."""
    rps: dict[str, float] = {}
    ramps: dict[str, list[dict[str, Any]]] = {}
    cpu: dict[str, CpuUse] = {}
    steps, step_s = (9, 1.0) if quick else (13, 1.5)
    log_name = f"gateway-capacity-{scenario.name}-{model.name}.log"
    with arm_runs.gateway(scenario, repo, workdir, agent=False, log_name=log_name) as target:
        for ref in scenario.references():
            knobs = expert.as_dict()
            if ref == "batch1":
                knobs["max_batch_size"] = 1
            set_knobs(target.base, model.name, knobs)
            load = arm_runs.Load(
                model.name,
                ramp_phases(RAMP_START[model.name], steps, step_s),
                CAPACITY_SEED,
                model.slo_ms,
                workdir / f"ramp-{scenario.name}-{model.name}-{ref}",
            )
            assert target.pid is not None
            meter = Meter(target.base, model.name, target.pid, target.broker_pid)
            meter.start()
            (summary,) = arm_runs.run_sims(scenario, target, [load])
            cpu[ref] = meter.stop(summary["requests"]["sent"])
            served, ramps[ref] = capacity_from_ramp(summary, model.slo_ms)
            rps[ref] = max(served, RAMP_START[model.name])
    # Eager batching serves at least what batch 1 does (it runs batch 1 when that keeps up):
    # a lower figure is noise in the max ramp.
    rps["max"] = max(rps.values())
    return Capacity(rps, ramps), cpu


def thread_settings(cores: int, expert: Knobs) -> list[tuple[int, int]]:
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


def experts(cores: int, models: list[Model]) -> tuple[list[Knobs], list[Knobs]]:
    """(the expert default of the per-gateway arm, which is also what each agent starts from
    by itself (``gateway.tuning``): each model sized to an equal share of the cores; each model's
    expert default alone, with all the cores, for its capacity)."""
    share = core_share(cores, len(models))
    return (
        [expert_default(share, m.max_batch_size) for m in models],
        [expert_default(cores, m.max_batch_size) for m in models],
    )


def run_seed(
    scenario: Scenario,
    plans: list[ModelPlan],
    agent_start: list[Knobs],
    seed: int,
    opts: Options,
    repo: Path,
    workdir: Path,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every arm of one seed for real, after the replay search; (runs, the seed's figures)."""
    cores = usable_cores()
    windows = report.phase_windows([vars(p) for p in plans[0].phases])
    started = time.monotonic()
    scored, best, oracle = replay_seed(scenario, plans, windows, seed, cores, opts.replay_arms)
    replay_s = time.monotonic() - started
    by_configs = {s.configs: s for s in scored}
    arm_plans: dict[str, tuple[tuple[Knobs, ...], arm_runs.Switches | None]] = {
        "configured": (tuple(m.configured for m in plans), None),
        "expert": (tuple(m.expert for m in plans), None),
        **{f"replay-best-{i + 1}": (s.configs, None) for i, s in enumerate(best)},
        "oracle": (oracle[0].configs, _switches(plans, windows, [s.configs for s in oracle])),
        "agent": (tuple(agent_start), None),
        arm_runs.REPEAT_ARM: (tuple(m.expert for m in plans), None),
    }
    runs = []
    for arm in (a for a in opts.arms if a in arm_plans):
        configs, switches = arm_plans[arm]
        out = workdir / f"{scenario.name}-seed{seed}-{arm}"
        loads = [
            arm_runs.Load(
                m.name,
                m.phases,
                arm_runs.stream_seed(seed, k),
                m.slo_ms,
                out if len(plans) == 1 else out / m.name,
            )
            for k, m in enumerate(plans)
        ]
        knobs = {m.name: c.as_dict() for m, c in zip(plans, configs, strict=True)}
        started = time.monotonic()
        result = arm_runs.run_arm(
            arm, scenario, loads, repo, workdir, knobs=knobs, switches=switches
        )
        result.update(scenario=scenario.name, elapsed_s=round(time.monotonic() - started, 1))
        if arm == "oracle":
            result["predicted"] = [prediction(s, plans) for s in oracle]
        elif arm != "agent" and configs in by_configs:
            result["predicted"] = prediction(by_configs[configs], plans)
        _progress(scenario.name, seed, arm, result)
        runs.append(result)
    arms = {r["arm"]: r for r in runs}
    slos = {m.name: m.slo_ms for m in plans}
    figures = report.seed_summary(arms, windows, slos)
    figures.update(seed=seed, replay_s=round(replay_s, 2), replay_configs=len(scored))
    return runs, figures


def _progress(scenario: str, seed: int, arm: str, result: dict[str, Any]) -> None:
    streams = result.get("streams") or {"": result}
    for model, st in streams.items():
        o = st["overall"]
        print(
            f"{scenario} seed {seed} {arm} {model}: p95 {o['p95_ms']} ms, "
            f"violations {o['slo_violations']}, lost {o['lost']}",
            file=sys.stderr,
            flush=True,
        )


def _switches(
    plans: list[ModelPlan], windows: list[dict[str, Any]], configs: list[tuple[Knobs, ...]]
) -> arm_runs.Switches:
    """Knob changes at the window boundaries, for the models whose configuration changes."""
    out: arm_runs.Switches = []
    for i in range(1, len(windows)):
        changed = {
            m.name: configs[i][k].as_dict()
            for k, m in enumerate(plans)
            if configs[i][k] != configs[i - 1][k]
        }
        if changed:
            out.append((windows[i]["start_s"], changed))
    return out


def run_scenario(
    scenario: Scenario, opts: Options, workdir: Path
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(runs, summary, config) of one scenario."""
    repo = build_repo(scenario.models, workdir / f"repo-{scenario.name}")
    models = [read_model(repo, name) for name in scenario.models]
    cores = usable_cores()
    expert, alone = experts(cores, models)
    agent_start = expert
    plans: list[ModelPlan] = []
    config: dict[str, Any] = {"models": {}}
    for model, stream, solo in zip(models, scenario.streams, alone, strict=True):
        plan, config["models"][model.name] = _model_plan(
            scenario, stream, model, solo, expert[len(plans)], opts, repo, workdir
        )
        plans.append(plan)
    runs: list[dict[str, Any]] = []
    per_seed = []
    for seed in opts.seeds:
        seed_runs, figures = run_seed(scenario, plans, agent_start, seed, opts, repo, workdir)
        runs += seed_runs
        per_seed.append(figures)
    summary = report.median_summary(per_seed)
    summary["targets"] = report.targets(summary)
    summary["per_seed"] = per_seed
    config.update(
        devices=scenario.devices,
        transport=scenario.transport,
        framing=scenario.framing,
        agent_start={m.name: c.as_dict() for m, c in zip(models, agent_start, strict=True)},
    )
    return runs, summary, config


def _model_plan(
    scenario: Scenario,
    stream: Stream,
    model: Model,
    solo_expert: Knobs,
    expert: Knobs,
    opts: Options,
    repo: Path,
    workdir: Path,
) -> tuple[ModelPlan, dict[str, Any]]:
    """One model's capacity (alone, with the expert default for all the cores), phases and
    calibrated service times."""
    cores = usable_cores()
    capacity, cpu = measure_capacity(scenario, model, solo_expert, repo, workdir, opts.quick)
    contended = {ref: use.steal_share for ref, use in cpu.items() if use.steal_share > CONTENDED}
    if contended:
        print(
            f"{scenario.name} {model.name}: the capacity ramp ran under hypervisor steal "
            f"{contended}: its rates are a contended machine's (pin them with --rates-from)",
            file=sys.stderr,
            flush=True,
        )
    rates = capacity
    if opts.rates_from is not None:
        rates = Capacity(pinned_capacity(opts.rates_from, scenario.name, model.name), {})
    phases: tuple[Phase, ...] = resolve(stream, rates)
    print(
        f"{scenario.name} {model.name}: capacity {capacity.rps}, rates of {rates.rps}, "
        f"phases {phases}",
        file=sys.stderr,
        flush=True,
    )
    sizes = [2**i for i in range(int(np.log2(min(model.max_batch_size, 128))) + 1)]
    settings = sorted(
        set(thread_settings(cores, solo_expert)) | set(thread_settings(cores, expert))
    )
    samples = measure_samples(
        repo, model.name, settings, sizes, seconds_per_cell=0.05 if opts.quick else 0.3
    )
    batch1 = (capacity.rps["batch1"], (solo_expert.concurrency, solo_expert.intra_op_threads))
    service = calibrate(samples, cpu, batch1)
    plan = ModelPlan(model.name, model.slo_ms, phases, service, model.configured, expert)
    config = {
        "slo_ms": model.slo_ms,
        "configured": model.configured.as_dict(),
        "expert_default": expert.as_dict(),
        "capacity_rps": capacity.rps,
        "rates_of_capacity_rps": rates.rps,
        "rates_from": None if opts.rates_from is None else str(opts.rates_from),
        "capacity_ramps": capacity.ramps,
        "capacity_cpu": {ref: use.as_dict() for ref, use in cpu.items()},
        "phases": [vars(p) for p in phases],
        "steps": [vars(s) for s in stream.steps],
        "service_times": service.as_dict(),
    }
    return plan, config


def run(opts: Options) -> Path:
    machine = machine_info()  # with the load average at the start
    runs, summary, scenarios = ([], {}, {}) if opts.quick else _kept(opts)
    config: dict[str, Any] = {
        # The commit every gateway of this run starts from; a scenario kept from an earlier
        # file carries its own in ``measured`` (absent in files written before it was recorded).
        "code": source_commit(),
        "seeds": list(opts.seeds),
        "arms": list(opts.arms),
        "agent_algorithm": arm_runs.AGENT_ALGORITHM,
        "method": METHOD,
        "scenarios": scenarios,
    }
    with TemporaryDirectory(prefix="iotgw-bench-tuner-") as tmp:
        workdir = opts.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in opts.scenarios:
            scenario = SCENARIOS[name].scaled(opts.factor)
            started = {
                "created": now_iso(),
                "code": config["code"],
                "load_average_start": load_average(),
            }
            scenario_runs, summary[name], scenarios[name] = run_scenario(scenario, opts, workdir)
            scenarios[name]["measured"] = {**started, "load_average_end": load_average()}
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
    print(report.table([r for r in runs if r["scenario"] in opts.scenarios]))
    for name in opts.scenarios:
        print(name, {k: summary[name][k] for k in report.SUMMARY_KEYS})
    note_if_quick(opts.quick)
    return path


def _kept(opts: Options) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """A full run of some scenarios keeps the others' figures from the results file it
    rewrites (each scenario's config says when it was measured)."""
    path = results_path(NAME, quick=False, out_dir=opts.out_dir)
    if not path.exists():
        return [], {}, {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    kept = [n for n in doc["config"]["scenarios"] if n not in opts.scenarios]
    scenarios = {n: doc["config"]["scenarios"][n] for n in kept}
    for config in scenarios.values():
        config.setdefault("measured", {"created": doc["created"]})
    return (
        [r for r in doc["runs"] if r["scenario"] in kept],
        {n: doc["summary"][n] for n in kept},
        scenarios,
    )


METHOD = (
    "Per scenario: capacity measured first, per model alone, with iotgw sim's own Poisson ramp "
    "through one gateway (expert default, and at max batch 1); phase rates are fractions of it. "
    "Service times: c ONNX Runtime sessions of t threads calling back to back at once, per batch "
    "size, for a few (c, t); the event loop's CPU per request and per batch from the loop "
    "thread's CPU on the two ramps, the load generator's and broker's CPU per request "
    "(benchmarks/tuner/servicetimes.py, cpu.py). Replay: the seed's arrival times (the very ones "
    "iotgw sim sends) through benchmarks/tuner/replay.py's batcher model, one lane per model, all "
    "lanes on one serial event loop, the loop, the instances' threads and the other processes "
    "sharing the cores; one model: the "
    "request-level grid under each thread setting; several: each model's candidates (per thread "
    "setting, its best alone over the trace and in each phase) and their product searched "
    "exhaustively (benchmarks/tuner/search.py). The best per-gateway configurations over the "
    "whole trace (objective: per model p95 + 2 x SLO x violating share, in SLOs, summed; "
    "configured and expert excluded) and each phase's best (the oracle) are then run for real. "
    "Each arm a fresh gateway process (and a fresh Mosquitto over MQTT), one iotgw sim per model "
    "at once; figures as the devices saw them (violations = late + errors + lost). Best static "
    "in hindsight: the static arm with the lowest measured objective. Noise floor: the expert "
    "arm run again as the seed's last arm (expert-again), compared with the first by the same "
    "ratios. Each arm's CPU: the gateway's loop thread and process, its child processes (the "
    "agent's model process), and the hypervisor's steal, from /proc."
)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(Options(seeds=(0,) if quick else (0, 1, 2), quick=quick, out_dir=out_dir))
    return 0
