"""The run: per model, the static grid screened and its finalists measured twice at every load
(the best static and its noise floor), then the agent from every start at every load."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from benchmarks.common import BenchRun, source_commit
from benchmarks.find import measure, report
from benchmarks.find.plan import (
    FULL,
    NAME,
    QUICK,
    SWEEP_CONNECTIONS,
    Load,
    Plan,
    Start,
    static_grid,
)
from benchmarks.tuner.run import build_repo
from models.knobs import Knobs
from models.repository import ModelVersion, scan_repository

MODELS = ("sensor_mlp", "vision_cnn")
# An open load runs at a fraction of the open loop's capacity; when no probe of it held (on a
# busy machine the simulator can fall behind at every rate) that is 0, and the load has no rate
# to run at: its statics and agent runs are left out, and its target reads "missed: no figure".
NO_RATE = "the open loop's capacity probes held at no rate"


def run(plan: Plan, out_dir: Path | None, *, quick: bool, statics_from: Path | None = None) -> Path:
    bench = BenchRun(NAME, quick, out_dir)
    code = source_commit()  # the gateways of the whole run start from this checkout
    runs: list[dict[str, Any]] = []
    with bench.workdir() as tmp:
        repo = build_repo(MODELS, tmp / "repo")
        versions = {v.name: v for v in scan_repository(repo) if isinstance(v, ModelVersion)}
        for model in plan.models:
            config = versions[model].config
            statics = (
                best_statics(plan, bench, repo, tmp, model, config.max_batch_size, config.slo_ms)
                if statics_from is None
                else earlier_statics(statics_from, model)
            )
            runs.append({"model": model, "kind": "static", **statics})
            capacities = {"closed": statics["capacity_rps"], "open": statics["open_capacity_rps"]}
            for load in plan.loads:
                if capacities[load.kind] <= 0:
                    bench.log(f"{model} {load.name}: not run, {NO_RATE}")
                    continue
                for start in plan.starts:
                    for repeat in range(plan.repeats):
                        bench.log(f"{model} {load.name}: agent from {start.name} #{repeat}")
                        result = agent_run(
                            plan,
                            repo,
                            tmp,
                            model,
                            config.slo_ms,
                            load,
                            start,
                            capacities[load.kind],
                            repeat,
                        )
                        best = statics["best"][load.name]["knobs"]
                        if best is not None:
                            result["adjacent_static"] = adjacent_static(
                                plan, repo, tmp, model, load, Knobs(**best), capacities[load.kind]
                            )
                        runs.append({"model": model, "kind": "agent", **result})
    summary = report.summarize(runs)
    report.print_report(summary)
    return bench.write(
        summary=summary,
        runs=runs,
        config={
            "plan": plan_doc(plan),
            "client": "wrk (closed loop, one JSON row per request); iotgw sim (Poisson, HTTP, "
            "JSON) for the open loop, its send lag recorded beside each figure",
            "agent": "the default iotgw serve (tuner on, every setting shipped), a fresh "
            "gateway per run; poor starts set by hand, then the agent resumed",
            # Not the same run: the agent's figures against another run's statics.
            "statics_from": None if statics_from is None else str(statics_from),
            "code": code,
            # Each gateway imports the checkout as it starts: a commit that moved meanwhile
            # makes the run's figures those of two versions.
            "code_at_end": source_commit(),
        },
    )


def best_statics(
    plan: Plan, bench: BenchRun, repo: Path, tmp: Path, model: str, max_batch: int, slo_ms: float
) -> dict[str, Any]:
    """The grid screened at ``plan.screen_at``, the finalists measured twice at every load: the
    closed loops at the capacity wrk measured, the open ones at the open loop's own
    (``measure.open_capacity``, on the fastest configuration screened)."""
    grid = static_grid(max_batch, plan.batches, plan.splits)
    screened: dict[str, list[dict[str, Any]]] = {}
    with measure.gateway(repo, tmp, agent=False, log_name=f"static-{model}.log") as base:
        body = measure.json_body(base, model)
        for c in plan.screen_at:
            bench.log(f"{model}: screening {len(grid)} static configurations at c={c}")
            screened[f"c{c}"] = [
                {
                    "knobs": k.as_dict(),
                    **measure.static_closed(base, model, body, k, c, plan.warmup_s, plan.screen_s),
                }
                for k in grid
            ]
        finalists = report.finalists(screened, plan.finalists)
        top = max(
            (r for r in screened[f"c{max(plan.screen_at)}"] if report.counted(r)),
            key=lambda r: r["rate_per_s"],
        )
        capacity = top["rate_per_s"]
        open_capacity, probes = open_loop_capacity(
            plan, bench, base, model, Knobs(**top["knobs"]), capacity, tmp, slo_ms
        )
        capacities = {"closed": capacity, "open": open_capacity}
        per_load: dict[str, list[dict[str, Any]]] = {}
        for load in plan.loads:
            if capacities[load.kind] <= 0:
                bench.log(f"{model} {load.name}: no static measured, {NO_RATE}")
                per_load[load.name] = []
                continue
            bench.log(f"{model} {load.name}: {len(finalists)} finalists, twice")
            rows = []
            for repeat in range(2):  # the same knobs twice: the noise floor
                for k in finalists:
                    rows.append(
                        {
                            "knobs": k.as_dict(),
                            "repeat": repeat,
                            **static_at(
                                plan, base, model, body, k, load, capacities[load.kind], tmp, repeat
                            ),
                        }
                    )
            per_load[load.name] = rows
    return {
        "grid": len(grid),
        "screened": screened,
        "finalists": [k.as_dict() for k in finalists],
        "capacity_rps": capacity,
        "open_capacity_rps": open_capacity,
        "open_capacity_probes": probes,
        "loads": per_load,
        "best": report.best_per_load(per_load, screened),
    }


def open_loop_capacity(
    plan: Plan,
    bench: BenchRun,
    base: str,
    model: str,
    knobs: Knobs,
    capacity: float,
    tmp: Path,
    slo_ms: float,
) -> tuple[float, list[dict[str, Any]]]:
    """The open loop's own capacity (``measure.open_capacity``), when the plan has open loads."""
    if not any(load.kind == "open" for load in plan.loads):
        return 0.0, []
    bench.log(f"{model}: the open loop's capacity, probed below {capacity:.0f}/s")
    return measure.open_capacity(
        base,
        model,
        knobs,
        capacity,
        plan.warmup_s,
        plan.probe_s,
        tmp / f"probe-{model}",
        slo_ms=slo_ms,
    )


def earlier_statics(path: Path, model: str) -> dict[str, Any]:
    """The static measurements of ``model`` from an earlier results file (to rerun the agent
    alone; the results say so, since their ratio then spans two runs). The best static of each
    load is chosen again from its rows by today's rule (``report.best_per_load``)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    (static,) = [r for r in doc["runs"] if r["kind"] == "static" and r["model"] == model]
    out = {k: v for k, v in static.items() if k not in ("model", "kind")}
    out["best"] = report.best_per_load(out["loads"], out.get("screened", {}))
    return out


def static_at(
    plan: Plan,
    base: str,
    model: str,
    body: bytes,
    knobs: Knobs,
    load: Load,
    capacity: float,
    tmp: Path,
    repeat: int,
) -> dict[str, Any]:
    if load.kind == "closed":
        c = int(load.level)
        return measure.static_closed(base, model, body, knobs, c, plan.warmup_s, plan.measured_s)
    k = knobs
    split = f"{k.max_batch_size}-{k.batch_timeout_ms:g}-{k.concurrency}x{k.intra_op_threads}"
    out = tmp / f"static-{model}-{load.name}-{repeat}-{split}"
    return measure.static_open(
        base,
        model,
        knobs,
        load.level * capacity,
        plan.warmup_s,
        plan.measured_s,
        out,
        slo_ms=1e6,
        seed=repeat,
    )


def agent_run(
    plan: Plan,
    repo: Path,
    tmp: Path,
    model: str,
    slo_ms: float,
    load: Load,
    start: Start,
    capacity: float,
    repeat: int,
) -> dict[str, Any]:
    """A fresh default gateway, the start, the load for ``plan.run_s``, the last
    ``plan.measured_s`` measured; the slices before say when the agent settled."""
    log_name = f"agent-{model}-{load.name}-{start.name}-{repeat}.log"
    with measure.gateway(repo, tmp, agent=True, log_name=log_name) as base:
        body = measure.json_body(base, model)
        measure.wait_for_agent(base, model)
        if start.knobs is not None:
            measure.start_agent_at(base, model, start.knobs)
        if start.path:
            walk_path(plan, base, model, body, load)
        # What the load meets: in runs 6-41 the agent had replaced every poor start with its
        # own (``ModelAgent.set_by_hand`` has why); the file now shows it.
        at_load = measure.knobs_in_effect(base, model)
        before = plan.run_s - plan.measured_s
        if load.kind == "closed":
            c = int(load.level)
            slices: list[dict[str, Any]] = []
            while sum(s["seconds"] for s in slices) < before - 0.5:
                slices.append(measure.closed(base, model, body, c, plan.slice_s).as_dict())
            final = measure.closed(base, model, body, c, plan.measured_s).as_dict()
            figures: dict[str, Any] = {"slices": slices, "measured": final}
        else:
            out = tmp / f"agent-{model}-{load.name}-{start.name}-{repeat}"
            summary = measure.open_loop(
                base,
                model,
                load.level * capacity,
                [("settle", before), ("measured", plan.measured_s)],
                out,
                slo_ms=slo_ms,
                seed=100 + repeat,
            )
            figures = {
                "measured": measure.phase_figures(summary, "measured"),
                "timeline": [
                    {k: b[k] for k in ("t", "p95_ms", "p99_ms", "ok")} for b in summary["timeline"]
                ],
                "timeline_bin_s": summary["timeline_bin_s"],
                "send_lag_ms": summary.get("send_lag_ms"),
            }
        state = measure.agent_state(base, model)
    return {
        "load": load.name,
        "start": start.name,
        "repeat": repeat,
        "knobs_at_load": at_load,
        **figures,
        **state,
    }


def adjacent_static(
    plan: Plan, repo: Path, tmp: Path, model: str, load: Load, knobs: Knobs, capacity: float
) -> dict[str, Any]:
    """The load's best static measured twice on a fresh ``--no-tuner`` gateway right after an
    agent run: the agent's figure against the static of the same minutes, and the two runs'
    ratio as that comparison's noise floor. On this box a ratio against statics measured a
    quarter of an hour earlier mixes the agent's choice with the machine's drift: the same
    static knobs read 4,088-5,285 answers a second in four 10 s slices of one gateway."""
    with measure.gateway(repo, tmp, agent=False, log_name=f"adjacent-{model}.log") as base:
        body = measure.json_body(base, model)
        runs = [
            static_at(plan, base, model, body, knobs, load, capacity, tmp, 10 + i) for i in range(2)
        ]
    return {"knobs": knobs.as_dict(), "runs": runs}


def walk_path(plan: Plan, base: str, model: str, body: bytes, load: Load) -> None:
    """A user's sweep before the load: a burst of the other model, then each lower closed
    loop of this one (``SWEEP_CONNECTIONS``), ``plan.path_step_s`` each."""
    other = next(m for m in MODELS if m != model)
    measure.closed(base, other, measure.json_body(base, other), 32, plan.path_step_s)
    for c in SWEEP_CONNECTIONS:
        if load.kind == "open" or c < load.level:
            measure.closed(base, model, body, c, plan.path_step_s)


def plan_doc(plan: Plan) -> dict[str, Any]:
    return {
        "models": list(plan.models),
        "loads": [x.name for x in plan.loads],
        "starts": [
            {
                "name": s.name,
                "knobs": None if s.knobs is None else s.knobs.as_dict(),
                "path": s.path,
            }
            for s in plan.starts
        ],
        "screen_at": list(plan.screen_at),
        "finalists": plan.finalists,
        "screen_s": plan.screen_s,
        "point_s": plan.measured_s,
        "run_s": plan.run_s,
        "measured_s": plan.measured_s,
        "slice_s": plan.slice_s,
        "path_step_s": plan.path_step_s,
        "sweep_connections": list(SWEEP_CONNECTIONS),
        "repeats": plan.repeats,
    }


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir, quick=quick)
    return 0


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="iotgw bench find", description=__doc__)
    p.add_argument("--quick", action="store_true", help="seconds, to check it still works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--models", help="comma-separated subset of sensor_mlp,vision_cnn")
    p.add_argument("--loads", help="comma-separated subset of the loads (c1,...,open0.9)")
    p.add_argument("--starts", help="comma-separated subset of the starts")
    p.add_argument("--screen-at", help="comma-separated connections the grid is screened at")
    p.add_argument("--repeats", type=int, help="agent runs per load and start")
    p.add_argument(
        "--statics-from",
        type=Path,
        help="take the best statics from this earlier results file (the agent runs alone)",
    )
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    picks: dict[str, Any] = {}
    if args.models:
        picks["models"] = tuple(args.models.split(","))
    if args.loads:
        wanted = set(args.loads.split(","))
        known = {x.name: x for x in (*FULL.loads, *QUICK.loads)}
        picks["loads"] = tuple(x for name, x in known.items() if name in wanted)
    if args.starts:
        wanted = set(args.starts.split(","))
        picks["starts"] = tuple(s for s in FULL.starts if s.name in wanted)
    if args.screen_at:
        picks["screen_at"] = tuple(int(c) for c in args.screen_at.split(","))
    if args.repeats:
        picks["repeats"] = args.repeats
    if picks:
        plan = dataclasses.replace(plan, **picks)
    run(plan, args.out, quick=args.quick, statics_from=args.statics_from)
    return 0
