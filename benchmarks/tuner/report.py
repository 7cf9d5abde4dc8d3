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

The noise floor (``noise_floor``): the expert default measured twice in a seed (``expert`` and
``expert-again``, the last arm), as the same figures: the worst phase's steady p95 ratio and the
whole trace's p95 ratio, each the larger way round, the violations ratio (more over fewer, one
added to both), and the repeat's own ``settle_s`` and gap to the oracle: what those keys read
for knobs that never change. A ratio between two arms closer to 1 than this floor is below what
the machine could resolve in that run. ``repeat_violations_vs_best_static`` and
``repeat_steady_p95_vs_best_static`` score the repeat exactly as the agent is scored: the floor
of those two keys, the best static arm being the lowest of several noisy arms.

``targets``: each headline key against its target, judged against that floor
(``benchmarks.judging``): "met", "missed", or "unresolved" where the floor cannot tell the
figure from its target, never a pass that rests on noise.

``reachable``: the ``p95_reduction_vs_default`` of the per-phase oracle and of the best static
arm, the most that key could be expected to read in the seed.

``agent_cpu``: the agent arm's model process CPU seconds, and its gateway process's CPU over the
expert arm's (the same start knobs; the agent kept them or not).

With several models (``streams`` in a run) an arm is a per-gateway configuration: its objective
is the sum of each model's objective in SLOs, violations are summed, and each ratio is the
worst over the models (the highest steady ratio, gap and settle time; the lowest reduction).
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.common import format_table
from benchmarks.judging import judge
from benchmarks.tuner.arms import REPEAT_ARM, STATIC_ARMS

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


def streams_of(run: dict[str, Any], slos: dict[str, float]) -> list[tuple[dict[str, Any], float]]:
    """(each model's figures, its SLO) of one arm; a single-model run holds them at the top."""
    if "streams" in run:
        return [(run["streams"][m], slo) for m, slo in slos.items()]
    (slo,) = slos.values()
    return [(run, slo)]


def joint_objective(run: dict[str, Any], slos: dict[str, float]) -> float:
    return sum(objective(s["overall"], slo) / slo for s, slo in streams_of(run, slos))


def best_static(arms: dict[str, dict[str, Any]], slos: dict[str, float]) -> str | None:
    statics = [a for a in STATIC_ARMS if a in arms]
    return min(statics, key=lambda a: joint_objective(arms[a], slos)) if statics else None


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


def _worst(values: list[float | None], pick: Any = max) -> float | None:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def _vs_best(
    mine: list[tuple[dict[str, Any], float]],
    theirs: list[tuple[dict[str, Any], float]],
    phases: list[dict[str, Any]],
) -> dict[str, Any]:
    """Violations and the worst steady phase of ``mine`` against the best static arm's."""
    a_viol = sum(s["overall"]["slo_violations"] or 0 for s, _ in mine)
    b_viol = sum(s["overall"]["slo_violations"] or 0 for s, _ in theirs)
    return {
        # One added to both: a best static arm without violations still gives a figure (56
        # against none reads 57, not "undefined", which a median over seeds would drop).
        "violations_vs_best_static": round((a_viol + 1) / (b_viol + 1), 4),
        "violations": {"agent": a_viol, "best_static": b_viol},
        "steady_p95_vs_best_static": _worst(
            [
                _ratio(steady_p95(a, p["start_s"], p["duration_s"]), steady)
                for (a, _), (b, _) in zip(mine, theirs, strict=True)
                for p in phases
                if (steady := steady_p95(b, p["start_s"], p["duration_s"])) is not None
            ]
        ),
    }


def _reduction(
    mine: list[tuple[dict[str, Any], float]], configured: list[tuple[dict[str, Any], float]]
) -> float | None:
    """1 - p95 / the configured knobs' p95, whole trace; the worst model."""
    return _worst(
        [
            round(1.0 - a["overall"]["p95_ms"] / c["overall"]["p95_ms"], 4)
            if a["overall"]["p95_ms"] and c["overall"]["p95_ms"]
            else None
            for (a, _), (c, _) in zip(mine, configured, strict=True)
        ],
        min,
    )


def seed_summary(
    arms: dict[str, dict[str, Any]], phases: list[dict[str, Any]], slos: dict[str, float]
) -> dict[str, Any]:
    """The headline figures of one seed (keys absent arms make impossible are None);
    ``phases``: the report windows (``phase_windows``)."""
    agent, oracle, configured = arms.get("agent"), arms.get("oracle"), arms.get("configured")
    best = best_static(arms, slos)
    out: dict[str, Any] = {"best_static_arm": best, **dict.fromkeys(SUMMARY_KEYS)}
    if agent is None:
        return out
    mine = streams_of(agent, slos)
    if best is not None:
        out.update(_vs_best(mine, streams_of(arms[best], slos), phases))
    if configured is not None:
        out["p95_reduction_vs_default"] = _reduction(mine, streams_of(configured, slos))
    if oracle is not None:
        out.update(_oracle_figures(mine, streams_of(oracle, slos), phases, list(slos)))
    out["noise_floor"] = noise_floor(arms, phases, slos, best)
    out["reachable"] = reachable(arms, slos, best)
    out["agent_cpu"] = agent_cpu(arms)
    return out


def reachable(
    arms: dict[str, dict[str, Any]], slos: dict[str, float], best: str | None
) -> dict[str, float | None]:
    """The most ``p95_reduction_vs_default`` could read in the seed: that of the per-phase
    oracle (the bound no tuner is expected to beat) and of the best static arm ``best``."""
    configured = arms.get("configured")
    return {
        f"{key}_p95_reduction_vs_default": _reduction(
            streams_of(arms[arm], slos), streams_of(configured, slos)
        )
        if configured is not None and arm in arms
        else None
        for key, arm in (("oracle", "oracle"), ("best_static", best))
    }


def _both_ways(a: float | None, b: float | None) -> float | None:
    r = _ratio(a, b)
    return None if r is None or r <= 0 else round(max(r, 1.0 / r), 4)


def noise_floor(
    arms: dict[str, dict[str, Any]],
    phases: list[dict[str, Any]],
    slos: dict[str, float],
    best: str | None,
) -> dict[str, Any] | None:
    """How far the same knobs measured apart in one seed (see the module), ``best`` being the
    seed's best static arm; None without the repeat."""
    if "expert" not in arms or REPEAT_ARM not in arms:
        return None
    first, again = streams_of(arms["expert"], slos), streams_of(arms[REPEAT_ARM], slos)
    pairs = list(zip(first, again, strict=True))
    viol = [sum(s["overall"]["slo_violations"] or 0 for s, _ in x) for x in (first, again)]
    out: dict[str, Any] = {
        "steady_p95_ratio": _worst(
            [
                _both_ways(
                    steady_p95(b, p["start_s"], p["duration_s"]),
                    steady_p95(a, p["start_s"], p["duration_s"]),
                )
                for (a, _), (b, _) in pairs
                for p in phases
            ]
        ),
        "p95_ratio": _worst(
            [_both_ways(b["overall"]["p95_ms"], a["overall"]["p95_ms"]) for (a, _), (b, _) in pairs]
        ),
        "violations_ratio": round((max(viol) + 1) / (min(viol) + 1), 4),
    }
    if best is not None:
        # The repeat scored as the agent is: what the headline keys read for knobs that never
        # change, the best static arm picked (the lowest of several noisy arms) the same way.
        scored = _vs_best(again, streams_of(arms[best], slos), phases)
        out["repeat_violations_vs_best_static"] = scored["violations_vs_best_static"]
        out["repeat_steady_p95_vs_best_static"] = scored["steady_p95_vs_best_static"]
    if "oracle" in arms:
        static = _oracle_figures(again, streams_of(arms["oracle"], slos), phases, list(slos))
        out["settle_s"] = static["settle_s"]
        out["gap_to_oracle_p95"] = static["gap_to_oracle_p95"]
    return out


def agent_cpu(arms: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    agent, expert = arms.get("agent"), arms.get("expert")
    if agent is None or not agent.get("cpu"):
        return None
    mine = agent["cpu"]
    theirs = (expert or {}).get("cpu") or {}
    return {
        "model_process_s": mine["model_process_s"],
        "gateway_s": mine["gateway_s"],
        "gateway_s_vs_expert": _ratio(mine["gateway_s"], theirs.get("gateway_s")),
        "steal_share": mine["steal_share"],
    }


def _oracle_figures(
    mine: list[tuple[dict[str, Any], float]],
    oracle: list[tuple[dict[str, Any], float]],
    phases: list[dict[str, Any]],
    models: list[str],
) -> dict[str, Any]:
    gaps = [
        _ratio(a["overall"]["p95_ms"], o["overall"]["p95_ms"])
        for (a, _), (o, _) in zip(mine, oracle, strict=True)
    ]
    gap = _worst(gaps)
    steps = []
    values = []
    for model, (a, _), (o, _) in zip(models, mine, oracle, strict=True):
        for p in phases[1:]:
            target = steady_p95(o, p["start_s"], p["duration_s"])
            settled = None if target is None else settle_s(a, target, p["start_s"], p["duration_s"])
            steps.append(
                {
                    "model": model,
                    "phase": p["name"],
                    "settle_s": settled,
                    "oracle_steady_p95_ms": target,
                }
            )
            # A step never settled counts as the whole phase (censored), so that a median over
            # seeds does not drop the seeds where the agent did worst.
            values.append(p["duration_s"] if settled is None else settled)
    return {
        "gap_to_oracle_p95": None if gap is None else round(gap - 1.0, 4),
        "settle_steps": steps,
        "settle_s": max(values) if values else None,
        "settle_censored": any(s["settle_s"] is None for s in steps),
    }


def _median(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def median_summary(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over seeds of every headline key (seeds where it is None left out, and counted),
    and of the noise floor's and the reachable bounds' keys."""
    out: dict[str, Any] = {}
    for key in SUMMARY_KEYS:
        out[key] = _median([s.get(key) for s in per_seed])
        out[f"{key}_seeds"] = sum(s.get(key) is not None for s in per_seed)
    floors = [s["noise_floor"] for s in per_seed if s.get("noise_floor")]
    out["noise_floor"] = (
        {k: _median([f.get(k) for f in floors]) for k in floors[0]} if floors else None
    )
    bounds = [s["reachable"] for s in per_seed if s.get("reachable")]
    out["reachable"] = (
        {k: _median([b.get(k) for b in bounds]) for k in bounds[0]} if bounds else None
    )
    return out


SETTLED_WITHIN = 1.10
"""``settle_s`` counts a step settled within 10% of the oracle's steady p95."""


def targets(summary: dict[str, Any]) -> dict[str, str]:
    """Each target judged against the noise floor of the same run (``benchmarks.judging``):
    the violations and steady-p95 ratios against the floor's own ratios (the same knobs twice);
    the p95 reduction as the ratio to the configured knobs it implies, against the floor's p95
    ratio; the settle time only where the same knobs' steady p95 repeats within the 10% band
    that defines "settled" (beyond it, a settle time is the noise's, not the agent's)."""
    floor = summary.get("noise_floor") or {}
    reduction = summary.get("p95_reduction_vs_default")
    steady_floor = floor.get("steady_p95_ratio")
    settle = judge(summary.get("settle_s"), 10.0, 1.0, at_least=False)
    if steady_floor is None:
        settle = "unresolved: no noise floor measured"
    elif steady_floor > SETTLED_WITHIN and settle != "missed: no figure":
        settle = (
            f"unresolved: the same knobs' steady p95 repeats only within {steady_floor:.3f}x, "
            f"wider than the {SETTLED_WITHIN:g}x band that defines settled"
        )
    return {
        "violations_vs_best_static_at_most_1": judge(
            summary.get("violations_vs_best_static"),
            1.0,
            floor.get("violations_ratio"),
            at_least=False,
        ),
        "steady_p95_vs_best_static_at_most_1.05": judge(
            summary.get("steady_p95_vs_best_static"), 1.05, steady_floor, at_least=False
        ),
        # A reduction r is the ratio 1 - r to the configured knobs' p95, at most 0.5.
        "p95_reduction_vs_default_at_least_0.5": judge(
            None if reduction is None else 1.0 - reduction,
            0.5,
            floor.get("p95_ratio"),
            at_least=False,
        ),
        "settle_s_at_most_10": settle,
    }


def table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for r in runs:
        streams = r.get("streams") or {"": r}
        for model, st in streams.items():
            for name, f in [("overall", st["overall"]), *st["phases"].items()]:
                rows.append(
                    [
                        r["scenario"],
                        r["seed"],
                        r["arm"],
                        model,
                        name,
                        f["requests"],
                        f["p50_ms"],
                        f["p95_ms"],
                        f["slo_violations"],
                        f["lost"],
                    ]
                )
    headers = [
        "scenario",
        "seed",
        "arm",
        "model",
        "phase",
        "requests",
        "p50 ms",
        "p95 ms",
        "viol",
        "lost",
    ]
    return format_table(headers, rows)


def phase_windows(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The report phases (seconds from the trace's start): consecutive steps that name the same
    ``window`` (the diurnal day's quarters) merged into one."""
    out: list[dict[str, Any]] = []
    start = 0.0
    for i, p in enumerate(phases):
        name = p.get("window") or p["name"]
        if out and out[-1]["name"] == name:
            out[-1]["duration_s"] = round(out[-1]["duration_s"] + p["duration_s"], 6)
            out[-1]["steps"].append(i)
        else:
            out.append(
                {"name": name, "start_s": start, "duration_s": p["duration_s"], "steps": [i]}
            )
        start = round(start + p["duration_s"], 6)
    return out


def scenario_summary(
    runs: list[dict[str, Any]], phases: list[dict[str, Any]], slos: dict[str, float]
) -> dict[str, Any]:
    """Medians over the seeds of ``runs`` (one scenario), the targets and each seed's figures."""
    per_seed = []
    for seed in sorted({r["seed"] for r in runs}):
        arms = {r["arm"]: r for r in runs if r["seed"] == seed}
        figures = seed_summary(arms, phase_windows(phases), slos)
        figures["seed"] = seed
        per_seed.append(figures)
    summary = median_summary(per_seed)
    summary["targets"] = targets(summary)
    summary["per_seed"] = per_seed
    return summary


def scenario_shape(config: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(the phases, the SLO per model) of a scenario's config, in either results layout (one
    model at the top, or ``models``)."""
    if "models" in config:
        models = config["models"]
        first = next(iter(models.values()))
        return first["phases"], {m: c["slo_ms"] for m, c in models.items()}
    return config["phases"], {config["model"]: config["slo_ms"]}


def resummarize(doc: dict[str, Any]) -> dict[str, Any]:
    """A results document's summary recomputed from its runs (same keys as a fresh run's)."""
    out = {}
    for name, config in doc["config"]["scenarios"].items():
        runs = [r for r in doc["runs"] if r["scenario"] == name]
        phases, slos = scenario_shape(config)
        out[name] = scenario_summary(runs, phases, slos)
        # What the run measured about its own replay stays.
        replay = {s["seed"]: s for s in doc["summary"].get(name, {}).get("per_seed", [])}
        for s in out[name]["per_seed"]:
            for key in ("replay_s", "replay_configs"):
                if key in replay.get(s["seed"], {}):
                    s[key] = replay[s["seed"]][key]
    return out
