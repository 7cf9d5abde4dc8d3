"""The evaluation's figures (``iotgw tune --evaluate``, ``rrl.offline.evaluate``): per workload and
pooled over them, measurements to within 5% of the oracle (censored runs kept as such), final gaps,
violations while tuning, the delta trade-off against the Lipschitz loss bound, and the summary
keys of ``benchmarks/results/tuner_eval.json``."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from rrl.offline.eval_plan import EvalPlan
from rrl.offline.testbed import ProfileTable, Testbed
from rrl.tuners.objective import make_objective

FIRST = 100  # "while tuning": violations over the first this many measurements too


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
