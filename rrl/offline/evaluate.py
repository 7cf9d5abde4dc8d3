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
import math
import multiprocessing
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from models.machine import usable_cores as _usable_cores
from rrl.offline.episodes import WITHIN, Trace, measurements_to_within, run_shifting, run_static
from rrl.offline.eval_plan import FULL_PLAN, QUICK_PLAN, EvalPlan
from rrl.offline.profiling import PROFILES_DIR
from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.ask_tell import TuningProblem
from rrl.tuners.objective import make_objective
from rrl.tuners.registry import DESCRIPTIONS, TUNERS, build_tuner

NAME = "tuner_eval"
FIRST = 100  # "while tuning": violations over the first this many measurements too


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


def spread(values: Sequence[float | int | None], censor_at: float) -> dict[str, Any]:
    """Median, quartiles, min and max, with None (never reached) counted as ``censor_at`` plus
    one; a statistic that falls on a censored run is reported as None."""
    raw = [censor_at + 1 if v is None else float(v) for v in values]
    arr = np.asarray(raw, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # every run censored at inf: inf - inf in between
        q = np.percentile(arr, [0, 25, 50, 75, 100]) if arr.size else [math.nan] * 5
    censored = sum(v is None for v in values)

    def value(x: float) -> float | None:
        return None if x > censor_at or not math.isfinite(x) else round(float(x), 4)

    return {
        "median": value(q[2]),
        "p25": value(q[1]),
        "p75": value(q[3]),
        "min": value(q[0]),
        "max": value(q[4]),
        "censored": censored,
        "runs": len(values),
    }


def aggregate(results: list[dict[str, Any]], plan: EvalPlan) -> dict[str, Any]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[(r["kind"], r["model"], tuple(r["loads"]), r["tuner"], r["radius"])].append(r)
    scenarios = []
    for (kind, model, loads, tuner, radius), runs in sorted(groups.items(), key=str):
        budget = plan.budget if kind != "shifting" else plan.phase_length * len(loads)
        entry: dict[str, Any] = {
            "kind": kind,
            "model": model,
            "loads": list(loads),
            "tuner": tuner,
            "radius": radius,
            "seeds": len(runs),
            "measurements_to_5pct": spread([r["measurements_to_5pct"] for r in runs], budget),
            "measurements_to_5pct_or_tied": spread(
                [r["measurements_to_5pct_or_tied"] for r in runs], budget
            ),
            "final_tied_fraction": round(float(np.mean([r["final_tied"] for r in runs])), 3),
            "final_gap": spread([r["final_gap"] for r in runs], math.inf),
            "violations": spread([r["violations"] for r in runs], math.inf),
            f"violations_first{FIRST}": spread(
                [r[f"violations_first{FIRST}"] for r in runs], math.inf
            ),
            "mean_p95_ms": spread([r["mean_p95_ms"] for r in runs], math.inf),
            "mean_excess": spread([r["mean_excess"] for r in runs], math.inf),
            "region_phase_measurements": spread(
                [r["region_phase_measurements"] for r in runs], budget
            ),
            "region_phase_gap": spread([r["region_phase_gap"] for r in runs], math.inf),
            "median_gap_curve": _curve(np.median(np.stack([r["gaps"] for r in runs]), axis=0)),
        }
        if kind == "shifting":
            entry["phases"] = [
                {
                    "load": loads[k],
                    "measurements_to_5pct": spread(
                        [r["phases"][k]["measurements_to_5pct"] for r in runs], plan.phase_length
                    ),
                    "final_gap": spread([r["phases"][k]["final_gap"] for r in runs], math.inf),
                    "violations": spread([r["phases"][k]["violations"] for r in runs], math.inf),
                }
                for k in range(len(loads))
            ]
        scenarios.append(entry)
    return {"scenarios": scenarios}


def _curve(values: np.ndarray) -> list[float]:
    return [round(float(v), 4) for v in values]


def pooled(results: list[dict[str, Any]], tuner: str, key: str, budget: float) -> dict[str, Any]:
    values = [r[key] for r in results if r["kind"] == "static" and r["tuner"] == tuner]
    return spread(values, budget)


def lipschitz_check(
    tables: dict[str, ProfileTable], results: list[dict[str, Any]], plan: EvalPlan
) -> list[dict[str, Any]]:
    """Per static workload: the landscape's Lipschitz constants (the steepest slope between any
    two configurations, and the 95th percentile of slopes between grid neighbours), the loss
    bound L * delta they imply as a fraction of the oracle, and RRL's measured gaps when the
    grid is covered and at the end.

    The bound is checked with its noise margin: when the grid is covered, RRL recommends the
    lowest of N single measurements, so next to L * delta its loss may hold the spread of the
    noise across them, about 2 sigma sqrt(2 ln N) for N draws of a relative noise sigma
    (``measurement_noise``: the median over configurations of one decision interval's
    relative spread on the testbed)."""
    out = []
    for model in plan.models:
        table = tables[model]
        objective = make_objective(plan.objective, slo_ms=table.slo_ms, cores=table.cores)
        testbed = Testbed(table, objective, seed=0)
        d = table.space.distances
        for load in plan.loads_of(table):
            truth = testbed.truth(load)
            diff = np.abs(truth[:, None] - truth[None, :])
            with np.errstate(divide="ignore", invalid="ignore"):
                slopes = np.where(d > 0, diff / d, 0.0)
            neighbours = slopes[np.isclose(d, 1.0)]
            l_max = float(slopes.max())
            l_local = float(np.percentile(neighbours, 95))
            best = float(truth.min())
            sigma = measurement_noise(testbed, load)
            bounds = (l_max / best, l_local / best, sigma)
            rows = [
                row
                for r in plan.radii
                if (row := _radius_row(results, model, load, r, bounds)) is not None
            ]
            out.append(
                {
                    "model": model,
                    "load": load,
                    "rate_per_s": table.loads[load].rate_per_s,
                    "oracle": best,
                    "measurement_noise": round(sigma, 4),
                    "lipschitz_max": round(l_max, 4),
                    "lipschitz_local_p95": round(l_local, 4),
                    "radii": rows,
                }
            )
    return out


def _radius_row(
    results: list[dict[str, Any]],
    model: str,
    load: int,
    r: float,
    bounds: tuple[float, float, float],
) -> dict[str, Any] | None:
    """RRL's gaps at radius ``r`` against the bound (relative slopes max and local, noise)."""
    rel_max, rel_local, sigma = bounds
    runs = [
        x
        for x in results
        if x["kind"] == "tradeoff"
        and x["model"] == model
        and tuple(x["loads"]) == (load,)
        and x["radius"] == r
    ]
    if not runs:
        return None
    gaps = [x["final_gap"] for x in runs]
    covered = [x["region_phase_gap"] for x in runs if x["region_phase_gap"] is not None]
    centres = float(np.median([x["region_phase_measurements"] or 1 for x in runs]))
    margin = 2.0 * sigma * math.sqrt(2.0 * math.log(max(centres, 2.0)))
    return {
        "radius": r,
        "bound_max": round(rel_max * r, 4),
        "bound_local": round(rel_local * r, 4),
        "noise_margin": round(margin, 4),
        "region_phase_gap_median": _median_or_none(covered),
        "region_phase_gap_max": round(float(np.max(covered)), 4) if covered else None,
        "final_gap_median": round(float(np.median(gaps)), 4),
        "final_gap_max": round(float(np.max(gaps)), 4),
        # When covered and at the end alike (exploitation only adds measurements).
        "within_bound_max": bool(max(gaps + covered) <= rel_max * r + margin + 1e-9),
        "within_bound_local": float(np.mean(np.array(gaps + covered) <= rel_local * r + margin)),
    }


def measurement_noise(testbed: Testbed, load: int, replays: int = 24) -> float:
    """Relative noise of one decision interval on the testbed: per configuration, the standard
    deviation of ``replays`` replayed measurements over their mean; the median over the grid."""
    replay = testbed.reseeded(7)
    space = testbed.space
    spreads = []
    for flat in range(space.size):
        config = space.at(flat)
        values = [testbed.objective(config, replay.measure(config, load)) for _ in range(replays)]
        mean = float(np.mean(values))
        if mean > 0 and math.isfinite(mean):
            spreads.append(float(np.std(values, ddof=1)) / mean)
    return float(np.median(spreads)) if spreads else 0.0


def _median_or_none(values: list[float]) -> float | None:
    return round(float(np.median(values)), 4) if values else None


def tradeoff_pooled(results: list[dict[str, Any]], plan: EvalPlan) -> list[dict[str, Any]]:
    """RRL per radius, pooled over every static workload: the speed / optimality curve."""
    out = []
    for r in plan.radii:
        runs = [x for x in results if x["kind"] == "tradeoff" and x["radius"] == r]
        if not runs:
            continue
        out.append(
            {
                "radius": r,
                "region_phase_measurements": spread(
                    [x["region_phase_measurements"] for x in runs], plan.budget
                ),
                "measurements_to_5pct": spread(
                    [x["measurements_to_5pct"] for x in runs], plan.budget
                ),
                "measurements_to_5pct_or_tied": spread(
                    [x["measurements_to_5pct_or_tied"] for x in runs], plan.budget
                ),
                "region_phase_gap": spread([x["region_phase_gap"] for x in runs], math.inf),
                "final_gap": spread([x["final_gap"] for x in runs], math.inf),
                "violations": spread([x["violations"] for x in runs], math.inf),
            }
        )
    return out


def summarize(results: list[dict[str, Any]], plan: EvalPlan) -> dict[str, Any]:
    b = plan.budget

    def median(tuner: str, key: str) -> float | None:
        return pooled(results, tuner, key, b if key.startswith("measurements") else math.inf)[
            "median"
        ]

    s: dict[str, Any] = {
        "rrl_measurements_to_5pct": median("rrl", "measurements_to_5pct"),
        "qlearning_measurements_to_5pct": median("qlearning", "measurements_to_5pct"),
        "bo_measurements_to_5pct": median("bo", "measurements_to_5pct"),
        "adaptive_measurements_to_5pct": median("adaptive-rrl", "measurements_to_5pct"),
        "rrl_final_gap": median("rrl", "final_gap"),
        "adaptive_final_gap": median("adaptive-rrl", "final_gap"),
        "bo_final_gap": median("bo", "final_gap"),
        "qlearning_final_gap": median("qlearning", "final_gap"),
    }
    # The same, counting a recommendation the profile cannot tell apart from the oracle (within
    # two standard errors of the oracle's truth) as reached.
    for tuner, key in (
        ("rrl", "rrl"),
        ("qlearning", "qlearning"),
        ("bo", "bo"),
        ("adaptive-rrl", "adaptive"),
    ):
        s[f"{key}_measurements_to_5pct_or_tied"] = median(tuner, "measurements_to_5pct_or_tied")
    rrl, q, bo = (
        s["rrl_measurements_to_5pct"],
        s["qlearning_measurements_to_5pct"],
        s["bo_measurements_to_5pct"],
    )
    s["qlearning_over_rrl_measurements"] = _ratio(q, rrl)
    s["bo_over_rrl_measurements"] = _ratio(bo, rrl)
    # Adaptive RRL is RRL plus BO refinement: the same ratios, for comparison.
    s["qlearning_over_adaptive_measurements"] = _ratio(q, s["adaptive_measurements_to_5pct"])
    s["bo_over_adaptive_measurements"] = _ratio(bo, s["adaptive_measurements_to_5pct"])
    s["targets"] = {
        "rrl_8x_fewer_than_qlearning": None if q is None or rrl is None else q >= 8 * rrl,
        "rrl_fewer_than_bo": None if bo is None or rrl is None else rrl < bo,
        "adaptive_within_2pct": None
        if s["adaptive_final_gap"] is None
        else s["adaptive_final_gap"] <= 0.02,
    }
    return s


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


# -- the command ---------------------------------------------------------------------------


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
