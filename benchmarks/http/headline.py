"""Experiment 4, the throughput ratio: the limit and the gateway measured in turns
(L G L G ... L), for the fastest setup that met the SLO ("headline") and the fastest with the
aiohttp client ("aiohttp"); the ratio is the median over rounds of the gateway's rows/s over
the mean of the two limit runs around it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.common import Repeated
from benchmarks.http.bench import Bench
from benchmarks.http.figures import cpu_efficiency, load_figure, pick, repeated_or_none
from benchmarks.http.plan import setup_fields
from benchmarks.http.runner import InprocessRunner
from benchmarks.http.workload import Model
from benchmarks.servers import set_knobs


@dataclass(slots=True)
class _Rounds:
    """The runs of one model taken in turns: the limit's around every gateway round."""

    limit_rates: list[float] = field(default_factory=list)
    limit_cores: list[float] = field(default_factory=list)
    limit_others: list[float | None] = field(default_factory=list)
    gateway: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add_limit(self, runner: InprocessRunner, inputs: dict[str, np.ndarray], s: float) -> None:
        rate, used, others = runner.rows_per_s(inputs, s)
        self.limit_rates.append(rate)
        self.limit_cores.append(used)
        self.limit_others.append(others)


def paired_headline(
    bench: Bench,
    base: str,
    models: dict[str, Model],
    best: dict[str, dict[str, Any]],
    gw_knobs: dict[str, dict[str, Any]],
    sweeps: dict[str, list[dict[str, Any]]],
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per model and pick ("headline", "aiohttp"; the same entry when they coincide), the
    ratio entry."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for m in models.values():
        limit = best[m.name]["limit"]
        picks = {"headline": pick(sweeps[m.name])}
        aio = pick(sweeps[m.name], "aiohttp")
        if aio is not picks["headline"]:
            picks["aiohttp"] = aio
        knobs = set_knobs(base, m.name, gw_knobs[m.name])
        bench.log(
            f"paired runs {m.name}: "
            + ", ".join(
                f"{k}: {p['client']} N={p['closed_loop_concurrency']}" for k, p in picks.items()
            )
        )
        rounds = _paired_runs(bench, base, m, limit, picks)
        out[m.name] = {
            key: _ratio_entry(bench, m, limit, knobs, key, p, rounds) for key, p in picks.items()
        }
        out[m.name].setdefault("aiohttp", out[m.name]["headline"])
    return out


def _paired_runs(
    bench: Bench, base: str, m: Model, limit: dict[str, Any], picks: dict[str, dict[str, Any]]
) -> _Rounds:
    """Limit, gateway, limit, gateway, ..., limit: each round's limit is the mean of the runs
    just before and just after its gateway runs, so that drifting background load on a shared
    machine hits both sides of every pair alike."""
    plan = bench.plan
    runner = bench.runner(m, limit["intra_op_threads"], limit["instances"])
    inputs = m.inputs(limit["batch_size"])
    rounds = _Rounds(gateway={k: [] for k in picks})
    runner.rows_per_s(inputs, plan.inproc_warmup_s)
    rounds.add_limit(runner, inputs, plan.limit_headline_run_s)
    for _ in range(plan.headline_repeats):
        for key, p in picks.items():
            rounds.gateway[key].append(
                bench.load(
                    url=m.url(base),
                    model=m,
                    concurrency=p["closed_loop_concurrency"],
                    setup=(p["client_kind"], p["client_processes"]),
                    duration_s=plan.gw_headline_run_s,
                    warmup_s=plan.gw_warmup_s,
                    server=bench.gateway,
                )
            )
        rounds.add_limit(runner, inputs, plan.limit_headline_run_s)
    return rounds


def _ratio_entry(
    bench: Bench,
    m: Model,
    limit: dict[str, Any],
    knobs: dict[str, Any],
    key: str,
    p: dict[str, Any],
    rounds: _Rounds,
) -> dict[str, Any]:
    gw_results = rounds.gateway[key]
    round_limit = [(a + b) / 2 for a, b in itertools.pairwise(rounds.limit_rates)]
    lim = Repeated.of(rounds.limit_rates)
    lim_per_core = Repeated.of(
        r / c for r, c in zip(rounds.limit_rates, rounds.limit_cores, strict=True)
    )
    fig = load_figure(gw_results)
    pair_ratios = Repeated.of(
        g["rows_per_s"] / li for g, li in zip(gw_results, round_limit, strict=True)
    )
    entry: dict[str, Any] = {
        "figure": "throughput_ratio",
        "model": m.name,
        "headline": key == "headline",
        "limit": {
            "rows_per_s": lim,
            "batch_size": limit["batch_size"],
            "intra_op_threads": limit["intra_op_threads"],
            "instances": limit["instances"],
            "where": "this process, models.backends.load_runtime, no gateway",
            "cpu_cores": Repeated.of(rounds.limit_cores),
            "rows_per_cpu_s": lim_per_core,
            "other_processes_cpu_cores": repeated_or_none(rounds.limit_others),
        },
        "gateway": {
            **setup_fields((p["client_kind"], p["client_processes"])),
            "closed_loop_concurrency": p["closed_loop_concurrency"],
            "offered": p["offered"],
            "rows_per_request": 1,
            "knobs": knobs,
            "slo_ms": m.slo_ms,
            "setup_met_slo_in_sweep": p["meets_slo"],
            **fig,
        },
        "ratio": pair_ratios.median,
        "ratio_how": "median over rounds of gateway rows/s / the mean of the limit "
        "runs just before and after it",
        "ratio_per_pair": pair_ratios,
        "ratio_of_medians": fig["rows_per_s"].median / lim.median,
        **cpu_efficiency(gw_results, lim_per_core),
    }
    bench.runs.append(entry)
    bench.log(
        f"  {m.name} ({p['client']}): gateway {fig['rows_per_s'].median:,.1f} / "
        f"limit {lim.median:,.1f} rows/s: ratio {pair_ratios.median:.3f} (median of rounds)"
    )
    return entry
