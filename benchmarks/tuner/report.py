"""The headline figures of a scenario, from its arms (per seed, then medians over seeds).

- ``violations_vs_best_static``: (the agent's SLO violations + 1) over (those of the best
  static configuration in hindsight + 1), the best static one being the static arm with the
  lowest objective (p95 + 2 x SLO x violating share) over the whole trace;
- ``steady_p95_vs_best_static``: per phase, the steady p95 (the median of the 1 s bins' p95 over
  the phase's second half) of the agent over the best static one's; the worst phase;
- ``p95_reduction_vs_default``: 1 - agent p95 / the configured knobs' p95, whole trace;
- ``gap_to_oracle_p95``: agent p95 / the per-phase oracle's p95 - 1, whole trace;
- ``settle_s``: per step (every phase after the first), the seconds from the step until the
  agent's p95 (median of 3 consecutive 1 s bins) is within 10% of the oracle's steady p95 of
  that phase and stays there to the phase's end; the worst step (a step that never settles counts
  as its whole phase, and ``settle_censored`` says so).
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import format_table
from benchmarks.tuner.arms import STATIC_ARMS

SETTLE_TOLERANCE = 0.10
SETTLE_BINS = 3
SUMMARY_KEYS = (
    "violations_vs_best_static",
    "steady_p95_vs_best_static",
    "p95_reduction_vs_default",
    "gap_to_oracle_p95",
    "settle_s",
)


def objective(f: dict[str, Any], slo_ms: float) -> float:
    p95 = f["p95_ms"] if f["p95_ms"] is not None else slo_ms
    return float(p95 + 2.0 * slo_ms * (f["violation_fraction"] or 0.0))


def best_static(arms: dict[str, dict[str, Any]], slo_ms: float) -> str | None:
    statics = [a for a in STATIC_ARMS if a in arms]
    return min(statics, key=lambda a: objective(arms[a]["overall"], slo_ms)) if statics else None


def phase_bins(arm: dict[str, Any], start_s: float, duration_s: float) -> list[float | None]:
    bin_s = arm["timeline_bin_s"]
    return [
        b["p95_ms"]
        for b in arm["timeline"]
        if start_s - 1e-9 <= b["t"] and b["t"] + bin_s <= start_s + duration_s + 1e-9
    ]


def steady_p95(arm: dict[str, Any], start_s: float, duration_s: float) -> float | None:
    bins = [p for p in phase_bins(arm, start_s, duration_s) if p is not None]
    half = bins[len(bins) // 2 :]
    return statistics.median(half) if half else None


def settle_s(
    agent: dict[str, Any], target_ms: float, start_s: float, duration_s: float
) -> float | None:
    bins = phase_bins(agent, start_s, duration_s)
    bin_s = agent["timeline_bin_s"]
    smoothed = [
        statistics.median([p for p in bins[i : i + SETTLE_BINS] if p is not None] or [float("inf")])
        for i in range(max(len(bins) - SETTLE_BINS + 1, 0))
    ]
    within = [p <= (1 + SETTLE_TOLERANCE) * target_ms for p in smoothed]
    for i in range(len(within)):
        if all(within[i:]):
            return round(i * bin_s, 3)
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return round(a / b, 4)


def seed_summary(
    arms: dict[str, dict[str, Any]], phases: list[dict[str, Any]], slo_ms: float
) -> dict[str, Any]:
    """The headline figures of one seed (keys absent arms make impossible are None)."""
    agent, oracle, configured = arms.get("agent"), arms.get("oracle"), arms.get("configured")
    best = best_static(arms, slo_ms)
    out: dict[str, Any] = {"best_static_arm": best, **dict.fromkeys(SUMMARY_KEYS)}
    if agent is None:
        return out
    a = agent["overall"]
    if best is not None:
        mine, theirs = a["slo_violations"] or 0, arms[best]["overall"]["slo_violations"] or 0
        # One added to both: a best static arm without violations still gives a figure (56
        # against none reads 57, not "undefined", which a median over seeds would drop).
        out["violations_vs_best_static"] = round((mine + 1) / (theirs + 1), 4)
        out["violations"] = {"agent": mine, "best_static": theirs}
        ratios = [
            _ratio(steady_p95(agent, p["start_s"], p["duration_s"]), steady)
            for p in phases
            if (steady := steady_p95(arms[best], p["start_s"], p["duration_s"])) is not None
        ]
        known = [r for r in ratios if r is not None]
        out["steady_p95_vs_best_static"] = max(known) if known else None
    if configured is not None and a["p95_ms"] and configured["overall"]["p95_ms"]:
        out["p95_reduction_vs_default"] = round(
            1.0 - a["p95_ms"] / configured["overall"]["p95_ms"], 4
        )
    if oracle is not None:
        gap = _ratio(a["p95_ms"], oracle["overall"]["p95_ms"])
        out["gap_to_oracle_p95"] = None if gap is None else round(gap - 1.0, 4)
        steps = []
        for p in phases[1:]:
            target = steady_p95(oracle, p["start_s"], p["duration_s"])
            settled = (
                None if target is None else settle_s(agent, target, p["start_s"], p["duration_s"])
            )
            steps.append({"phase": p["name"], "settle_s": settled, "oracle_steady_p95_ms": target})
        out["settle_steps"] = steps
        # A step never settled counts as the whole phase (censored), so that a median over
        # seeds does not drop the seeds where the agent did worst.
        values = [
            p["duration_s"] if s["settle_s"] is None else s["settle_s"]
            for s, p in zip(steps, phases[1:], strict=True)
        ]
        out["settle_s"] = max(values) if values else None
        out["settle_censored"] = any(s["settle_s"] is None for s in steps)
    return out


def median_summary(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over seeds of every headline key (seeds where it is None left out, and counted)."""
    out: dict[str, Any] = {}
    for key in SUMMARY_KEYS:
        values = [s[key] for s in per_seed if s.get(key) is not None]
        out[key] = round(statistics.median(values), 4) if values else None
        out[f"{key}_seeds"] = len(values)
    return out


def targets(summary: dict[str, Any]) -> dict[str, bool | None]:
    def check(key: str, ok: Any) -> bool | None:
        return None if summary.get(key) is None else bool(ok(summary[key]))

    return {
        "violations_vs_best_static_at_most_1": check(
            "violations_vs_best_static", lambda v: v <= 1.0
        ),
        "steady_p95_vs_best_static_at_most_1.05": check(
            "steady_p95_vs_best_static", lambda v: v <= 1.05
        ),
        "p95_reduction_vs_default_at_least_0.5": check(
            "p95_reduction_vs_default", lambda v: v >= 0.5
        ),
        "settle_s_at_most_10": check("settle_s", lambda v: v <= 10.0),
    }


def table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        for name, f in [("overall", r["overall"]), *r["phases"].items()]:
            rows.append(
                [
                    r["scenario"],
                    r["seed"],
                    r["arm"],
                    name,
                    f["requests"],
                    f["p50_ms"],
                    f["p95_ms"],
                    f["slo_violations"],
                    f["lost"],
                ]
            )
    headers = ["scenario", "seed", "arm", "phase", "requests", "p50 ms", "p95 ms", "viol", "lost"]
    return format_table(headers, rows)


def phase_windows(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each phase's name, start and duration (seconds from the trace's start)."""
    out, start = [], 0.0
    for p in phases:
        out.append({"name": p["name"], "start_s": start, "duration_s": p["duration_s"]})
        start += p["duration_s"]
    return out


def scenario_summary(
    runs: list[dict[str, Any]], phases: list[dict[str, Any]], slo_ms: float
) -> dict[str, Any]:
    """Medians over the seeds of ``runs`` (one scenario), the targets and each seed's figures."""
    per_seed = []
    for seed in sorted({r["seed"] for r in runs}):
        arms = {r["arm"]: r for r in runs if r["seed"] == seed}
        figures = seed_summary(arms, phase_windows(phases), slo_ms)
        figures["seed"] = seed
        per_seed.append(figures)
    summary = median_summary(per_seed)
    summary["targets"] = targets(summary)
    summary["per_seed"] = per_seed
    return summary


def resummarize(doc: dict[str, Any]) -> dict[str, Any]:
    """A results document's summary recomputed from its runs (same keys as a fresh run's)."""
    out = {}
    for name, config in doc["config"]["scenarios"].items():
        runs = [r for r in doc["runs"] if r["scenario"] == name]
        out[name] = scenario_summary(runs, config["phases"], config["slo_ms"])
        # What the run measured about its own replay stays.
        replay = {s["seed"]: s for s in doc["summary"].get(name, {}).get("per_seed", [])}
        for s in out[name]["per_seed"]:
            for key in ("replay_s", "replay_configs"):
                if key in replay.get(s["seed"], {}):
                    s[key] = replay[s["seed"]][key]
    return out
