"""Experiment 1, the limit: the same runtime called in this process, no gateway, over
(intra-op threads, instances) x batch sizes, every configuration once per round. The best is
the limit; the batch sizes that fit the SLO budget at its threads are what the gateway may use."""

from __future__ import annotations

from typing import Any

from benchmarks.common import Repeated, usable_cores
from benchmarks.http.bench import Bench
from benchmarks.http.figures import ms
from benchmarks.http.plan import BATCH_SLO_FRACTION, Plan
from benchmarks.http.workload import Model

# (model, intra-op threads, instances, batch size)
Point = tuple[Model, int, int, int]
Key = tuple[str, int, int, int]


def inprocess_sweep(bench: Bench, models: dict[str, Model]) -> dict[str, dict[str, Any]]:
    """Per model: ``limit`` (the fastest sweep entry) and ``fitting`` (the entries at the
    limit's threads and instances whose batch fits the SLO budget, by batch size)."""
    plan = bench.plan
    thread_configs = _thread_configs(plan)
    bench.config["thread_configs"] = thread_configs
    grid = [
        (m, intra, inst, b)
        for m in models.values()
        for intra, inst in thread_configs
        for b in m.batch_sizes(plan)
    ]
    bench.log(f"in-process sweep: {len(grid)} configurations x {plan.repeats} runs")
    rates, used_cores = _measure(bench, grid)
    best: dict[str, dict[str, Any]] = {}
    for m in models.values():
        entries = [
            _entry(key, values, used_cores[key])
            for key, values in rates.items()
            if key[0] == m.name
        ]
        bench.runs.extend(entries)
        best[m.name] = _limit_and_fitting(bench, m, entries)
    return best


def _thread_configs(plan: Plan) -> tuple[tuple[int, int], ...]:
    cores = usable_cores()
    configs = plan.thread_configs or ((1, 1), (cores, 1), (1, cores), (1, cores + 1))
    return tuple(dict.fromkeys(configs))


def _measure(
    bench: Bench, grid: list[Point]
) -> tuple[dict[Key, list[float]], dict[Key, list[float]]]:
    """(rows/s, CPU cores used) of every grid point, per round."""
    plan = bench.plan
    inputs = {(m.name, b): m.inputs(b) for m, _, _, b in grid}
    for m, intra, inst, b in grid:  # warm-up: sessions built, every shape seen once
        bench.runner(m, intra, inst).rows_per_s(inputs[m.name, b], plan.inproc_warmup_s)
    keys = [(m.name, intra, inst, b) for m, intra, inst, b in grid]
    rates: dict[Key, list[float]] = {k: [] for k in keys}
    used_cores: dict[Key, list[float]] = {k: [] for k in keys}
    for _ in range(plan.repeats):  # rounds: every configuration once per round
        for m, intra, inst, b in grid:
            rate, used, _ = bench.runner(m, intra, inst).rows_per_s(
                inputs[m.name, b], plan.inproc_run_s
            )
            rates[m.name, intra, inst, b].append(rate)
            used_cores[m.name, intra, inst, b].append(used)
    return rates, used_cores


def _entry(key: Key, rates: list[float], used_cores: list[float]) -> dict[str, Any]:
    name, intra, inst, b = key
    r = Repeated.of(rates)
    return {
        "figure": "inprocess_limit_sweep",
        "model": name,
        "intra_op_threads": intra,
        "instances": inst,
        "batch_size": b,
        "rows_per_s": r,
        "batch_ms": ms(b * inst / r.median),
        "cpu_cores": Repeated.of(used_cores),
    }


def _limit_and_fitting(bench: Bench, m: Model, entries: list[dict[str, Any]]) -> dict[str, Any]:
    limit = max(entries, key=lambda e: e["rows_per_s"].median)
    # Batch sizes the gateway may use with the limit's threads and instances: those whose batch
    # costs at most a quarter of the SLO (queueing behind one batch and filling the next must
    # fit too).
    same = [
        e
        for e in entries
        if (e["intra_op_threads"], e["instances"])
        == (limit["intra_op_threads"], limit["instances"])
    ]
    budget = BATCH_SLO_FRACTION * m.slo_ms
    fitting = [e for e in same if e["batch_ms"] <= budget] or [
        min(same, key=lambda e: e["batch_ms"])
    ]
    bench.log(
        f"  {m.name}: limit {limit['rows_per_s'].median:,.0f} rows/s at batch "
        f"{limit['batch_size']} (intra {limit['intra_op_threads']}, instances "
        f"{limit['instances']}); batches within {budget:g} ms: "
        f"{[e['batch_size'] for e in fitting]}"
    )
    return {"limit": limit, "fitting": sorted(fitting, key=lambda e: e["batch_size"])}
