"""``iotgw tune --evaluate``: every tuner x seeds on the testbed, for static and shifting workloads.

For each profiled model (``rrl/profiles/<model>.json``):

- static: each offered load of the profile on its own, every tuner from a cold start for
  ``budget`` measurements;
- shifting: trickle -> burst -> sustained high -> back to trickle (the profile's lowest, highest,
  second-highest and lowest load), ``phase_length`` measurements each, with the workload state
  coming from the change detector;
- the delta trade-off: RRL at several radii on the static workloads, against the Lipschitz bound.

Reported (JSON at ``benchmarks/results/tuner_eval.json``, a Markdown table beside it, PNG plots in
``benchmarks/results/tuner_eval/``): measurements needed to come within 5% of the oracle and stay
there (median and spread; runs that never do are counted as censored), the final gap to the
oracle, SLO violations and latency accumulated while tuning, and per shift the same again.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from models.machine import usable_cores as _usable_cores
from rrl.offline.episodes import WITHIN, Trace, measurements_to_within, run_shifting, run_static
from rrl.offline.eval_plan import FULL_PLAN, QUICK_PLAN, EvalPlan
from rrl.offline.eval_summary import (
    FIRST,
    aggregate,
    lipschitz_check,
    summarize,
    tradeoff_pooled,
)
from rrl.offline.profiling import PROFILES_DIR
from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.ask_tell import TuningProblem
from rrl.tuners.objective import make_objective
from rrl.tuners.registry import DESCRIPTIONS, TUNERS, build_tuner

NAME = "tuner_eval"


@dataclass(frozen=True)
class Task:
    kind: str  # "static", "shifting" or "tradeoff"
    model: str
    loads: tuple[int, ...]  # one load (static, tradeoff) or the phases (shifting)
    tuner: str
    seed: int
    radius: float | None = None


# -- running -------------------------------------------------------------------------------

_TABLES: dict[str, ProfileTable] = {}
_TESTBEDS: dict[str, Testbed] = {}  # per model: truths computed once per worker
_PROFILE_DIR: Path = PROFILES_DIR
_PLAN: EvalPlan = FULL_PLAN


def _init_worker(profile_dir: Path, plan: EvalPlan, *, single_threaded: bool = False) -> None:
    global _PROFILE_DIR, _PLAN
    _PROFILE_DIR, _PLAN = profile_dir, plan
    _TESTBEDS.clear()
    if single_threaded:
        # One worker per core: a BLAS pool per worker (the GP fits) would oversubscribe them.
        threadpool_limits(1)


def _table(model: str) -> ProfileTable:
    if model not in _TABLES:
        _TABLES[model] = ProfileTable.load(_PROFILE_DIR / f"{model}.json")
    return _TABLES[model]


def run_task(task: Task) -> dict[str, Any]:
    plan = _PLAN
    table = _table(task.model)
    objective = make_objective(plan.objective, slo_ms=table.slo_ms, cores=table.cores)
    problem = TuningProblem(table.space, objective, cores=table.cores, seed=task.seed)
    tuner = build_tuner(task.tuner, problem, radius=task.radius)
    if task.model not in _TESTBEDS:
        _TESTBEDS[task.model] = Testbed(table, objective, seed=0, interval_s=plan.interval_s)
    testbed = _TESTBEDS[task.model].reseeded(task.seed + 1_000_003)
    started = time.process_time()
    if task.kind == "shifting":
        trace = run_shifting(
            tuner,
            testbed,
            list(task.loads),
            plan.phase_length,
            interval_s=plan.interval_s,
            seed=task.seed,
        )
    else:
        trace = run_static(tuner, testbed, task.loads[0], plan.budget, interval_s=plan.interval_s)
    result = {**asdict(task), "cpu_s": round(time.process_time() - started, 3)}
    result.update(_metrics(trace, task, plan))
    result["gaps"] = trace.gaps().astype(np.float32)
    return result


def _metrics(trace: Trace, task: Task, plan: EvalPlan) -> dict[str, Any]:
    gaps = trace.gaps()
    out: dict[str, Any] = {
        "measurements_to_5pct": measurements_to_within(gaps),
        "measurements_to_5pct_or_tied": measurements_to_within(trace.gaps_or_tied()),
        "final_gap": float(gaps[-1]),
        "final_tied": bool(trace.tied[-1]),
        "violations": float(np.sum(trace.violations)),
        f"violations_first{FIRST}": float(np.sum(trace.violations[:FIRST])),
        "mean_p95_ms": float(np.nanmean(trace.p95_ms)),
        "mean_excess": float(np.mean(np.asarray(trace.measured) / np.asarray(trace.oracle) - 1)),
    }
    explored = [i for i, p in enumerate(trace.phase_of_tuner) if p in ("exploit", "refine")]
    out["region_phase_measurements"] = explored[0] + 1 if explored else None
    # Where the Lipschitz bound speaks directly: the recommendation once every configuration is
    # covered (the best region centre), before exploitation improves on it.
    out["region_phase_gap"] = float(gaps[explored[0]]) if explored else None
    if task.kind == "shifting":
        phases = []
        n = plan.phase_length
        for k, load in enumerate(task.loads):
            part = slice(k * n, (k + 1) * n)
            phases.append(
                {
                    "load": load,
                    "measurements_to_5pct": measurements_to_within(gaps[part]),
                    "final_gap": float(gaps[part][-1]),
                    "violations": float(np.sum(trace.violations[part])),
                    "mean_p95_ms": float(np.nanmean(trace.p95_ms[part])),
                }
            )
        out["phases"] = phases
    return out


def tasks_for(plan: EvalPlan, tables: dict[str, ProfileTable]) -> list[Task]:
    tasks: list[Task] = []
    for model in plan.models:
        for load in plan.loads_of(tables[model]):
            for tuner in plan.tuners:
                tasks += [Task("static", model, (load,), tuner, s) for s in range(plan.seeds)]
            for r in plan.radii:
                tasks += [
                    Task("tradeoff", model, (load,), "rrl", s, r)
                    for s in range(plan.tradeoff_seeds)
                ]
        phases = shifting_phases(tables[model])
        for tuner in plan.tuners:
            tasks += [Task("shifting", model, phases, tuner, s) for s in range(plan.seeds)]
    return tasks


def shifting_phases(table: ProfileTable) -> tuple[int, ...]:
    """Trickle, burst, sustained high, back to trickle: lowest, highest, second-highest, lowest
    offered load of the profile."""
    order = np.argsort([x.rate_per_s for x in table.loads])
    low, high = int(order[0]), int(order[-1])
    sustained = int(order[-2]) if len(order) > 2 else high
    return (low, high, sustained, low)


# -- aggregation ---------------------------------------------------------------------------


def evaluate(
    plan: EvalPlan, *, profile_dir: Path, out_dir: Path | None, quick: bool, workers: int
) -> Path:
    from models.machine import machine_info
    from models.reporting import now_iso, write_results
    from rrl.offline.report import write_report

    created = now_iso()
    machine = machine_info()
    tables = {m: ProfileTable.load(profile_dir / f"{m}.json") for m in plan.models}
    tasks = tasks_for(plan, tables)
    started = time.monotonic()
    results = _run_tasks(tasks, plan, profile_dir, workers)
    elapsed = time.monotonic() - started
    aggregated = aggregate(results, plan)
    summary = summarize(results, plan)
    lipschitz = lipschitz_check(tables, results, plan)
    tradeoff = tradeoff_pooled(results, plan)
    runs = [{k: v for k, v in r.items() if k != "gaps"} for r in results]
    runs.sort(
        key=lambda r: (r["kind"], r["model"], r["loads"], r["tuner"], r["radius"] or 0, r["seed"])
    )
    profiles = {m: _profile_entry(profile_dir, m, t) for m, t in tables.items()}
    path = write_results(
        NAME,
        quick=quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=runs,
        config={
            "plan": asdict(plan),
            "within": WITHIN,
            "tuners": {t: DESCRIPTIONS[t] for t in plan.tuners},
            "profiles": profiles,
        },
        created=created,
        scenarios=aggregated["scenarios"],
        lipschitz=lipschitz,
        delta_tradeoff=tradeoff,
        elapsed_s=round(elapsed, 1),
    )
    write_report(
        path, summary, aggregated["scenarios"], lipschitz, tradeoff, plan, tables, quick=quick
    )
    return path


def _run_tasks(
    tasks: list[Task], plan: EvalPlan, profile_dir: Path, workers: int
) -> list[dict[str, Any]]:
    if workers <= 1:
        _init_worker(profile_dir, plan)
        return [run_task(t) for t in tasks]
    ctx = multiprocessing.get_context("fork")
    init = functools.partial(_init_worker, single_threaded=True)
    with ctx.Pool(workers, initializer=init, initargs=(profile_dir, plan)) as pool:
        return list(pool.imap_unordered(run_task, tasks, chunksize=4))


def _profile_entry(profile_dir: Path, model: str, t: ProfileTable) -> dict[str, Any]:
    """What the results file says of each profile the evaluation replayed."""
    return {
        "file": str((profile_dir / f"{model}.json").resolve()),
        "created": t.doc.get("created"),
        "slo_ms": t.slo_ms,
        "loads": [asdict(x) for x in t.loads],
        "configurations": t.space.size,
        "space": t.space.describe(),
        "load_conditions": t.doc.get("load_conditions"),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--evaluate", action="store_true", help="run the offline evaluation")
    p.add_argument("--quick", action="store_true", help="a few seconds, to check it still works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--profile-dir", type=Path, help=f"profile tables (default {PROFILES_DIR})")
    p.add_argument("--seeds", type=int, help="seeds per tuner and workload")
    p.add_argument("--models", help="comma-separated profiled models to evaluate on")
    p.add_argument("--tuners", help=f"comma-separated tuners (default all: {', '.join(TUNERS)})")
    p.add_argument("--objective", choices=["latency", "cost"], help="what the tuners minimize")
    p.add_argument("--workers", type=int, help="processes (default: usable cores)")


def run(args: argparse.Namespace) -> int:
    if not args.evaluate:
        print(
            "iotgw tune: only --evaluate (the offline testbed) is available here; the online "
            "agent runs inside iotgw serve",
            file=sys.stderr,
        )
        return 2
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    changes: dict[str, Any] = {}
    if args.seeds:
        changes["seeds"] = args.seeds
        changes["tradeoff_seeds"] = args.seeds
    if args.models:
        changes["models"] = tuple(args.models.split(","))
    if args.tuners:
        unknown = [t for t in args.tuners.split(",") if t not in TUNERS]
        if unknown:
            print(f"iotgw tune: unknown tuner(s) {unknown}; known: {list(TUNERS)}", file=sys.stderr)
            return 2
        changes["tuners"] = tuple(args.tuners.split(","))
    if args.objective:
        changes["objective"] = args.objective
    plan = EvalPlan(**{**asdict(plan), **changes})
    profile_dir = args.profile_dir or PROFILES_DIR
    missing = [m for m in plan.models if not (profile_dir / f"{m}.json").exists()]
    if missing:
        print(
            f"iotgw tune: no profile for {missing} in {profile_dir} (run iotgw profile)",
            file=sys.stderr,
        )
        return 2
    workers = args.workers or _usable_cores()
    path = evaluate(
        plan, profile_dir=profile_dir, out_dir=args.out, quick=args.quick, workers=workers
    )
    print_summary(path)
    return 0


def print_summary(path: Path) -> None:
    """The static results and the headline figures as text tables (benchmarks.md)."""
    import json

    from models.reporting import format_table

    doc = json.loads(path.read_text())
    rows = []
    for s in doc["scenarios"]:
        if s["kind"] == "static":
            m, t = s["measurements_to_5pct"], s["measurements_to_5pct_or_tied"]
            rows.append(
                [
                    s["model"],
                    s["loads"][0],
                    s["tuner"],
                    "never" if m["median"] is None else m["median"],
                    f"{m['censored']}/{m['runs']}",
                    "never" if t["median"] is None else t["median"],
                    s["final_gap"]["median"],
                    s["violations"]["median"],
                ]
            )
    headers = ["model", "load", "tuner", "to 5%", "never", "5% or tied", "final gap", "violations"]
    print(format_table(headers, rows))
    print("\nSummary")
    summary = [[k, "-" if v is None else v] for k, v in doc["summary"].items() if k != "targets"]
    print(format_table(["figure", "value"], summary))
    for target, met in doc["summary"]["targets"].items():
        verdict = "not measurable" if met is None else ("met" if met else "missed")
        print(f"target {target}: {verdict}")
    print(f"results: {path} (with {path.name.removesuffix('.json')}.md and its plots)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iotgw tune", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
