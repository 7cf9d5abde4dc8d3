"""``iotgw profile``: measure the real runtime for every configuration of a grid at several offered
loads, and write the profile table the offline testbed replays.

For each bundled model (``models.demo``), each (concurrency, intra-op, inter-op threads) group gets
its own real sessions (``models.backends.load_runtime``), warmed at every batch size of the grid;
then every (max batch size, batch timeout, offered load) cell of the group is served by the
open-loop harness (``rrl.offline.harness``, the batcher's rule on the wall clock): a warm-up, then
``windows`` measurement windows, each long enough for ``min_requests`` arrivals. The whole grid is
measured ``passes`` times, groups and cells in a new random order each time, so that the windows of
one cell come from moments far apart: on a shared machine a burst of other work then hits one pass
of a cell instead of all of it, and does not line up with neighbouring configurations either. A
window's figures (p50/p95/p99/mean latency, throughput, violations, CPU) are one sample of a short
interval; the spread over a cell's windows is the measured noise.

Grids (the documented subsets):

- ``dense`` (vision_cnn and sensor_mlp, ONNX Runtime): every configuration of
  ``ConfigSpace.for_machine(cores)`` with one inter-op thread: batch 1..128 (8 notches), timeout
  0/1/2/4/8 ms, concurrency 1..2*cores, intra-op threads 1..cores; 320 configurations on 2
  cores, measured with ``LONG_TIMING``. Inter-op threads are left out because they only run
  independent operators side by side and these graphs are chains: on the ``full`` grid of the
  same models (all 640 configurations, 2 inter-op threads included, short windows) the second
  inter-op thread made a configuration slower in 78-89% of the pairs that differ only in it
  (median +52% to +392% per load), and no load's best configuration had a second one.
- ``full``: every configuration of ``ConfigSpace.for_machine(cores)``, inter-op 1..cores too;
  640 configurations on 2 cores (the earlier profiles; kept for other machines' grids).
- ``coarse`` (sensor_fusion and the TensorFlow twins): batch 1/4/16/64, timeout 0/2/8 ms,
  concurrency 1/2/4, intra-op 1..cores, inter-op 1; 72 configurations on 2 cores.
- ``quick`` (tests and CI): 12 configurations of sensor_mlp, two loads, short windows; seconds.

Results: ``rrl/profiles/<model>.json`` (``<model>.quick.json`` in quick mode, or under ``--out``),
written after every group so an interrupted run can ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.machine import usable_cores as _usable_cores
from rrl.offline.harness import ServingHarness, WindowResult, poisson_arrivals
from rrl.tuners.space import ConfigSpace

log = logging.getLogger("rrl.offline.profiling")

FORMAT = 1
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
WINDOW_FIELDS = tuple(WindowResult.__dataclass_fields__)


@dataclass(frozen=True)
class Timing:
    passes: int = 2
    windows: int = 2
    """Windows per pass."""
    min_window_s: float = 0.4
    min_requests: int = 10
    warmup_s: float = 0.2

    def window_s(self, rate: float) -> float:
        return max(self.min_window_s, self.min_requests / rate)


FULL_TIMING = Timing()
# Three passes of one window of at least 30 requests: each cell's windows hold 90+ latencies from
# three moments far apart, so the p95 the testbed replays (pooled over the drawn windows, as a
# decision interval pools its requests) is a 5th-largest of 90, not a 2nd-largest of 10.
LONG_TIMING = Timing(passes=3, windows=1, min_window_s=0.5, min_requests=30, warmup_s=0.2)
QUICK_TIMING = Timing(passes=1, windows=2, min_window_s=0.1, min_requests=4, warmup_s=0.05)


@dataclass(frozen=True)
class ModelPlan:
    model: str
    grid: str  # "full", "dense", "coarse" or "quick"
    rates_per_s: tuple[float, ...]
    rows_per_request: int = 1
    timing: Timing = FULL_TIMING


# Offered loads span a trickle to beyond what the best configuration sustains on 2 cores
# (vision_cnn: ~5.5 ms per image on one thread, so a few hundred images/s at best; the small
# models: tens of microseconds per call, so the per-batch overhead sets the limit). Rates are
# powers of two times a base, so each is a whole workload level apart.
PLANS: dict[str, ModelPlan] = {
    "vision_cnn": ModelPlan("vision_cnn", "dense", (16.0, 64.0, 128.0, 256.0), timing=LONG_TIMING),
    "sensor_mlp": ModelPlan("sensor_mlp", "dense", (256.0, 2048.0, 16384.0), timing=LONG_TIMING),
    "sensor_fusion": ModelPlan("sensor_fusion", "coarse", (256.0, 1024.0, 16384.0)),
    "vision_cnn_tf": ModelPlan("vision_cnn_tf", "coarse", (16.0, 64.0, 256.0)),
    "sensor_mlp_tf": ModelPlan("sensor_mlp_tf", "coarse", (256.0, 1024.0, 16384.0)),
    "sensor_fusion_tf": ModelPlan("sensor_fusion_tf", "coarse", (256.0, 1024.0, 16384.0)),
}
QUICK_PLAN = ModelPlan("sensor_mlp", "quick", (256.0, 2048.0), timing=QUICK_TIMING)


def grid(name: str, cores: int, max_batch_size: int) -> ConfigSpace:
    if name == "full":
        return ConfigSpace.for_machine(cores, max_batch_size=max_batch_size)
    if name == "dense":
        return ConfigSpace.for_machine(cores, max_batch_size=max_batch_size, max_inter_op_threads=1)
    if name == "coarse":
        return ConfigSpace(
            batch_sizes=tuple(b for b in (1, 4, 16, 64) if b <= max_batch_size),
            timeouts_ms=(0.0, 2.0, 8.0),
            concurrency=tuple(c for c in (1, 2, 4) if c <= 2 * cores),
            intra_op_threads=tuple(range(1, cores + 1)),
            inter_op_threads=(1,),
        )
    if name == "quick":
        return ConfigSpace((1, 2, 4), (0.0, 1.0), (1, 2), (1,), (1,))
    raise ValueError(f"unknown grid {name!r}")


def profile_model(
    version: Any,  # models.repository.ModelVersion
    plan: ModelPlan,
    timing: Timing,
    out_path: Path,
    *,
    cores: int,
    seed: int = 0,
    resume: bool = False,
) -> dict[str, Any]:
    """Measure every cell ``timing.passes`` times, each pass at a different moment (groups and
    cells shuffled anew), ``timing.windows`` windows each time, so that a burst of other work on
    the machine lands on one pass of a cell and not on all of its windows."""
    space = grid(plan.grid, cores, version.config.max_batch_size)
    doc = _new_document(version, plan, timing, space, cores)
    done = _resume(out_path, doc, plan.model) if resume else {}
    rng = np.random.default_rng(seed)
    groups = [
        (c, i, o)
        for c in space.concurrency
        for i in space.intra_op_threads
        for o in space.inter_op_threads
    ]
    started = time.monotonic()
    for pass_ in range(timing.passes):
        order = rng.permutation(len(groups))
        for g, index in enumerate(order):
            conc, intra, inter = groups[index]
            cells = [
                (b, t, li)
                for b in space.batch_sizes
                for t in space.timeouts_ms
                for li in range(len(plan.rates_per_s))
                if done.get(_key(b, t, conc, intra, inter, li), {}).get("passes", 0) <= pass_
            ]
            if not cells:
                continue
            rng.shuffle(cells)
            _measure_group(version, plan, timing, space, (conc, intra, inter), cells, done, rng)
            doc["cells"] = [_cell(k, done[k]) for k in sorted(done)]
            doc["load_conditions"]["load_average_by_group"].append(
                {"pass": pass_ + 1, "group": [conc, intra, inter], "load_average": _loadavg()}
            )
            _write(out_path, doc, complete=False)
            elapsed = time.monotonic() - started
            where = f"pass {pass_ + 1}/{timing.passes}, group {g + 1}/{len(groups)}"
            group = f"conc={conc} intra={intra} inter={inter}"
            log.info("%s: %s (%s) done, %.0f s elapsed", plan.model, where, group, elapsed)
    doc["cells"] = [_cell(k, done[k]) for k in sorted(done)]
    doc["load_conditions"]["load_average_at_end"] = _loadavg()
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    _write(out_path, doc, complete=True)
    return doc


Key = tuple[tuple[float, ...], int]


def _resume(out_path: Path, doc: dict[str, Any], model: str) -> dict[Key, dict[str, Any]]:
    """The cells an interrupted run of the same grid and loads measured (and its load record)."""
    if not out_path.exists():
        return {}
    old = json.loads(out_path.read_text())
    if old.get("space") != doc["space"] or old.get("loads") != doc["loads"]:
        return {}
    done = {(tuple(c["config"]), c["load"]): _resumed(c) for c in old["cells"]}
    doc["load_conditions"] = old.get("load_conditions", doc["load_conditions"])
    log.info("%s: resuming with %d cells measured", model, len(done))
    return done


def _key(b: float, t: float, conc: int, intra: int, inter: int, load: int) -> Key:
    return ((float(b), float(t), float(conc), float(intra), float(inter)), load)


def _measure_group(
    version: Any,
    plan: ModelPlan,
    timing: Timing,
    space: ConfigSpace,
    group: tuple[int, int, int],
    cells: list[tuple[int, float, int]],
    done: dict[Key, dict[str, Any]],
    rng: np.random.Generator,
) -> None:
    """One (concurrency, intra, inter) group: build and warm its sessions, serve its cells."""
    from models.backends import load_runtime
    from models.runtime import Threads

    conc, intra, inter = group
    slo_s = version.config.slo_ms / 1000.0
    runtimes = [load_runtime(version, Threads(intra, inter)) for _ in range(conc)]
    try:
        inputs = _inputs(runtimes[0], space.batch_sizes[-1] * plan.rows_per_request, rng)
        for rt in runtimes:  # first calls at each shape allocate: keep them out of the table
            for b in space.batch_sizes:
                rt.infer({k: v[: b * plan.rows_per_request] for k, v in inputs.items()})
        harness = ServingHarness(runtimes, inputs)
        try:
            load_avg = _loadavg()
            for b, t, li in cells:
                windows = _measure(harness, b, t, plan.rates_per_s[li], plan, timing, slo_s, rng)
                entry = done.setdefault(
                    _key(b, t, conc, intra, inter, li),
                    {"windows": [], "samples": [], "passes": 0, "load_average": []},
                )
                entry["windows"] += [
                    [_round(getattr(w, f)) for f in WINDOW_FIELDS] for w in windows
                ]
                entry["samples"] += [latency_record(lat) for lat in harness.window_latencies]
                entry["passes"] += 1
                entry["load_average"].append(load_avg)
        finally:
            harness.close()
    finally:
        for rt in runtimes:
            rt.close()


SAMPLES_PER_WINDOW = 256
"""A window's latencies are kept whole up to this many; beyond, this many evenly spaced
quantiles of them (a window of sensor_mlp at 16384 requests/s holds 8,000: kept whole, its
profile would weigh 50 MB)."""


def latency_record(latencies_ms: np.ndarray) -> list[float]:
    """A window's latencies as the profile stores them (ms, 3 decimals, sorted): all of them,
    or ``SAMPLES_PER_WINDOW`` quantiles at (k + 1/2) / n when there are more. The windows of one
    cell have about as many requests each (same rate, same length), so pooling their records
    weighs them as pooling their requests would, and the p95 of the pool stays the p95 of the
    requests to within a quantile step."""
    values = np.sort(np.asarray(latencies_ms, dtype=float))
    if values.size > SAMPLES_PER_WINDOW:
        levels = (np.arange(SAMPLES_PER_WINDOW) + 0.5) / SAMPLES_PER_WINDOW
        values = np.quantile(values, levels)
    return [round(float(x), 3) for x in values]


def _resumed(cell: dict[str, Any]) -> dict[str, Any]:
    load_avg = cell.get("load_average")
    return {
        "windows": cell["windows"],
        "samples": cell.get("samples", []),
        "passes": cell.get("passes", 1),
        "load_average": load_avg if isinstance(load_avg, list) else [load_avg],
    }


def _measure(
    harness: ServingHarness,
    batch: int,
    timeout_ms: float,
    rate: float,
    plan: ModelPlan,
    timing: Timing,
    slo_s: float,
    rng: np.random.Generator,
) -> list[WindowResult]:
    window = timing.window_s(rate)
    edges = [timing.warmup_s + k * window for k in range(timing.windows + 1)]
    arrivals = poisson_arrivals(rate, edges[-1], rng)
    return harness.run(
        max_batch_size=batch,
        batch_timeout_s=timeout_ms / 1000.0,
        arrivals_s=arrivals,
        rows_per_request=plan.rows_per_request,
        slo_s=slo_s,
        window_edges_s=edges,
    )


def _cell(key: Key, entry: dict[str, Any]) -> dict[str, Any]:
    fields = list(WINDOW_FIELDS)
    rows = np.array(
        [[np.nan if v is None else v for v in w] for w in entry["windows"]], dtype=np.float64
    )
    p95 = rows[:, fields.index("p95_ms")]
    thr = rows[:, fields.index("completed")] / rows[:, fields.index("duration_s")]
    return {
        "config": list(key[0]),
        "load": key[1],
        "passes": entry["passes"],
        "windows": entry["windows"],
        **({"samples": entry["samples"]} if entry.get("samples") else {}),
        "p95_ms": [_round(_nanmean(p95)), _round(_nanstd(p95))],
        "throughput_per_s": [_round(float(thr.mean())), _round(float(thr.std()))],
        "load_average": entry["load_average"],
    }


def _new_document(
    version: Any, plan: ModelPlan, timing: Timing, space: ConfigSpace, cores: int
) -> dict[str, Any]:
    from models.machine import machine_info
    from models.reporting import now_iso

    return {
        "format": FORMAT,
        "model": plan.model,
        "runtime": version.config.runtime,
        "slo_ms": version.config.slo_ms,
        "max_batch_size": version.config.max_batch_size,
        "grid": plan.grid,
        "cores": cores,
        "created": now_iso(),
        "machine": machine_info(),
        "timing": asdict(timing),
        "harness": "rrl.offline.harness.ServingHarness: open-loop Poisson arrivals, the batcher's "
        "rule (rrl.offline.batcher_sim) on the wall clock, one thread per runtime instance, "
        "deadline = SLO",
        "space": space.describe(),
        "loads": [
            {"rate_per_s": r, "rows_per_request": plan.rows_per_request} for r in plan.rates_per_s
        ],
        "window_fields": list(WINDOW_FIELDS),
        "load_conditions": {
            "load_average_at_start": _loadavg(),
            "load_average_by_group": [],
            "note": "1-minute load average of the machine (all processes) when each group "
            "started; the machine is shared, so other work adds noise and slows cells",
        },
        "complete": False,
        "cells": [],
    }


def _inputs(runtime: Any, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for spec in runtime.metadata.inputs:
        shape = (rows, *(d if d > 0 else 1 for d in spec.shape[1:]))
        out[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return out


def _write(path: Path, doc: dict[str, Any], *, complete: bool) -> None:
    doc["complete"] = complete
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {k: v for k, v in doc.items() if k != "cells"}
    # One cell per line: a readable, diffable file of a few hundred kB.
    lines = ",\n".join(json.dumps(c, separators=(",", ":")) for c in doc["cells"])
    text = json.dumps(head, indent=1)[:-2] + ',\n "cells": [\n' + lines + "\n ]\n}\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _round(x: float) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.4g}")


def _nanmean(x: np.ndarray) -> float:
    return float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")


def _nanstd(x: np.ndarray) -> float:
    return float(np.nanstd(x)) if np.isfinite(x).any() else float("nan")


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="iotgw profile",
        description="Measure the runtime for every configuration of a grid at several offered "
        "loads and write the profile tables the offline tuner testbed replays.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        help=f"comma-separated models (default: all bundled: {', '.join(PLANS)})",
    )
    p.add_argument("--quick", action="store_true", help="a few seconds, to check it still works")
    p.add_argument("--out", type=Path, help=f"output directory (default {PROFILES_DIR})")
    p.add_argument("--model-repo", type=Path, help="model repository (default: the demo one)")
    p.add_argument("--resume", action="store_true", help="keep cells already in the output")
    p.add_argument("--cores", type=int, help="cores the grid is built for (default: usable)")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from models.demo import ensure_demo_repository
    from models.repository import ModelVersion, scan_repository

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("models", "tensorflow"):  # a line per session built is noise here
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cores = args.cores or _usable_cores()
    if args.quick:
        names = args.models.split(",") if args.models else [QUICK_PLAN.model]
        plans = [ModelPlan(n, "quick", QUICK_PLAN.rates_per_s, timing=QUICK_TIMING) for n in names]
    else:
        names = args.models.split(",") if args.models else list(PLANS)
        unknown = [n for n in names if n not in PLANS]
        if unknown:
            print(f"iotgw profile: no plan for {unknown}; known: {list(PLANS)}", file=sys.stderr)
            return 2
        plans = [PLANS[n] for n in names]
    repo = args.model_repo or ensure_demo_repository()
    versions = {v.name: v for v in scan_repository(repo) if isinstance(v, ModelVersion)}
    out_dir = args.out or PROFILES_DIR
    for plan in plans:
        if plan.model not in versions:
            print(f"iotgw profile: model {plan.model} is not in {repo}", file=sys.stderr)
            return 2
        path = out_dir / (f"{plan.model}.quick.json" if args.quick else f"{plan.model}.json")
        version = versions[plan.model]
        doc = profile_model(
            version, plan, plan.timing, path, cores=cores, seed=args.seed, resume=args.resume
        )
        print(f"{plan.model}: {len(doc['cells'])} cells in {doc['elapsed_s']} s -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
