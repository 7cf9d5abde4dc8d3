"""Experiments 2 and 3, the gateway at saturation: first the knobs it saturates best with
(raw client, N = (concurrency + 1) x batch), then every (client setup, N) at those knobs."""

from __future__ import annotations

from typing import Any

from benchmarks.http.bench import Bench
from benchmarks.http.figures import load_figure, pick
from benchmarks.http.plan import (
    CLOSED_LOOP_SLO_FRACTION,
    KNOB_SWEEP_SETUP,
    MAX_CLOSED_LOOP,
    Setup,
    setup_fields,
)
from benchmarks.http.workload import Model
from benchmarks.servers import set_knobs


def knob_candidates(bench: Bench, model: Model, best: dict[str, Any]) -> list[dict[str, Any]]:
    """Gateway knobs to try: the limit's intra-op threads; its instances, and one more (an
    instance with a batch ready while another waits for the event loop to hand it its next
    batch); the two largest batch sizes within the SLO budget (every batch pays a fixed cost in
    the gateway: the executor crossing and the event-loop round trips)."""
    limit = best["limit"]
    batches = [e["batch_size"] for e in best["fitting"]][-2:]
    out = [
        {
            "max_batch_size": b,
            "batch_timeout_ms": model.default_timeout_ms,
            "concurrency": conc,
            "intra_op_threads": limit["intra_op_threads"],
            "inter_op_threads": 1,
        }
        for conc in dict.fromkeys((limit["instances"], limit["instances"] + 1))
        for b in batches
    ]
    return out[-1:] if bench.plan.quick else out


def closed_loop_cap(model: Model, limit_rate: float) -> int:
    """Requests in flight such that waiting stays under half the SLO at the limit's rate
    (Little's law), at most ``MAX_CLOSED_LOOP``."""
    little = int(CLOSED_LOOP_SLO_FRACTION * model.slo_ms / 1e3 * limit_rate)
    return max(2, min(MAX_CLOSED_LOOP, little))


def closed_loop_sizes(
    bench: Bench, model: Model, knobs: dict[str, Any], limit_rate: float
) -> list[int]:
    """Requests in flight to try: enough that a full batch waits whenever an instance frees
    up ((instances + 1) x batch), and more; capped by ``closed_loop_cap``."""
    b, inst = knobs["max_batch_size"], knobs["concurrency"]
    cap = closed_loop_cap(model, limit_rate)
    sizes = sorted({max(2, min(n, cap)) for n in ((inst + 1) * b, 2 * inst * b, 3 * inst * b)})
    if len(sizes) == 1 and cap >= 8:
        sizes.insert(0, cap // 4)
    return sizes[-1:] if bench.plan.quick else sizes


def _sweep_load(bench: Bench, base: str, m: Model, n: int, setup: Setup) -> dict[str, Any]:
    return bench.load(
        url=m.url(base),
        model=m,
        concurrency=n,
        setup=setup,
        duration_s=bench.plan.gw_sweep_run_s,
        warmup_s=bench.plan.gw_warmup_s,
        server=bench.gateway,
    )


def gateway_knob_sweep(
    bench: Bench, base: str, models: dict[str, Model], best: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """The knobs the gateway saturates best with: per model, as the gateway reports them."""
    chosen: dict[str, dict[str, Any]] = {}
    for m in models.values():
        candidates = knob_candidates(bench, m, best[m.name])
        cap = closed_loop_cap(m, best[m.name]["limit"]["rows_per_s"].median)
        bench.log(f"gateway knob sweep {m.name}: {len(candidates)} configurations")
        results: list[list[dict[str, Any]]] = [[] for _ in candidates]
        applied: list[dict[str, Any]] = [{} for _ in candidates]
        for _ in range(bench.plan.repeats):
            for i, knobs in enumerate(candidates):
                applied[i] = set_knobs(base, m.name, knobs)
                n = _knob_sweep_n(cap, knobs)
                results[i].append(_sweep_load(bench, base, m, n, KNOB_SWEEP_SETUP))
        entries = [
            _knob_entry(bench, m, knobs, rs, cap)
            for knobs, rs in zip(applied, results, strict=True)
        ]
        chosen[m.name] = pick(entries)["knobs"]
        bench.config.setdefault("gateway_saturation_knobs", {})[m.name] = chosen[m.name]
    return chosen


def _knob_sweep_n(cap: int, knobs: dict[str, Any]) -> int:
    """Requests in flight in the knob sweep: (concurrency + 1) x batch, within the cap."""
    return max(2, min(cap, (knobs["concurrency"] + 1) * knobs["max_batch_size"]))


def _knob_entry(
    bench: Bench, m: Model, knobs: dict[str, Any], results: list[dict[str, Any]], cap: int
) -> dict[str, Any]:
    n = _knob_sweep_n(cap, knobs)
    entry = _sweep_entry(bench, "gateway_knob_sweep", m, knobs, KNOB_SWEEP_SETUP, n, results)
    bench.log(
        f"  batch {knobs['max_batch_size']:3d} concurrency {knobs['concurrency']} "
        f"N={n:3d}: {entry['rows_per_s'].median:9,.1f} rows/s  "
        f"p99 {entry['p99_ms'].median:7.2f} ms  lost {entry['lost']}"
    )
    return entry


def gateway_saturation(
    bench: Bench,
    base: str,
    models: dict[str, Model],
    best: dict[str, dict[str, Any]],
    gw_knobs: dict[str, dict[str, Any]],
) -> dict[str, list[dict[str, Any]]]:
    """Every (client setup, N) at the chosen knobs: per model, the sweep entries."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in models.values():
        knobs = set_knobs(base, m.name, gw_knobs[m.name])
        sizes = closed_loop_sizes(bench, m, knobs, best[m.name]["limit"]["rows_per_s"].median)
        combos = [
            (setup, n) for setup in bench.plan.client_setups for n in sizes if n >= max(setup[1], 1)
        ]
        bench.log(f"gateway sweep {m.name}: knobs {knobs}; N in {sizes}")
        results: dict[tuple[Setup, int], list[dict[str, Any]]] = {c: [] for c in combos}
        for _ in range(bench.plan.repeats):
            for setup, n in combos:
                results[setup, n].append(_sweep_load(bench, base, m, n, setup))
        out[m.name] = []
        for (setup, n), rs in results.items():
            offered = f"closed loop, {n} requests in flight"
            entry = _sweep_entry(
                bench, "gateway_saturation_sweep", m, knobs, setup, n, rs, offered=offered
            )
            bench.log(
                f"  {setup[0]:7s} x{max(setup[1], 1)} N={n:3d}: "
                f"{entry['rows_per_s'].median:9,.1f} rows/s  p99 {entry['p99_ms'].median:7.2f} ms"
                f"  lost {entry['lost']}"
            )
            out[m.name].append(entry)
    return out


def _sweep_entry(
    bench: Bench,
    figure: str,
    m: Model,
    knobs: dict[str, Any],
    setup: Setup,
    n: int,
    results: list[dict[str, Any]],
    **described: Any,
) -> dict[str, Any]:
    """One ``runs`` entry of a sweep: the load figure of one (knobs, setup, N) and whether it
    met the SLO with nothing lost."""
    fig = load_figure(results)
    entry: dict[str, Any] = {
        "figure": figure,
        "model": m.name,
        **setup_fields(setup),
        "closed_loop_concurrency": n,
        **described,
        "slo_ms": m.slo_ms,
        "knobs": knobs,
        **fig,
        "meets_slo": fig["lost"] == 0 and fig["p99_ms"].median <= m.slo_ms,
    }
    bench.runs.append(entry)
    return entry
