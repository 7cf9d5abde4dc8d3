"""The command line of ``iotgw bench tuner`` (``python -m benchmarks.tuner``): which scenarios,
arms and seeds to run, where the results go, and a summary recomputed from a results file."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.tuner import arms as arm_runs
from benchmarks.tuner import report
from benchmarks.tuner.run import Options, run
from benchmarks.tuner.scenarios import SCENARIOS, pinned_capacity


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tuner", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one seed, short phases, to check it works")
    p.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    p.add_argument("--keep", type=Path, help="keep logs, simulator outputs and decision logs here")
    p.add_argument("--scenarios", help=f"comma-separated subset of {','.join(SCENARIOS)}")
    p.add_argument("--arms", help=f"comma-separated subset of {','.join(arm_runs.ARMS)}")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1,2; --quick: 0)")
    p.add_argument(
        "--resummarize",
        type=Path,
        help="recompute the summary of this results file from its runs, then exit",
    )
    p.add_argument(
        "--replay-arms", type=int, choices=[1, 2], default=1, help="replay candidates run for real"
    )
    p.add_argument(
        "--rates-from",
        type=Path,
        help="phase rates from this results file's capacities (replays its very arrivals)",
    )
    p.add_argument(
        "--duration-factor",
        type=float,
        help="phase lengths times this (default 1; --quick 0.1)",
    )
    args = p.parse_args(argv)
    if args.resummarize:
        doc = json.loads(args.resummarize.read_text(encoding="utf-8"))
        doc["summary"] = report.resummarize(doc)
        args.resummarize.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return 0
    scenarios = _subset(p, args.scenarios, tuple(SCENARIOS), "scenarios")
    arms = _subset(p, args.arms, arm_runs.ARMS, "arms")
    seeds = (
        tuple(int(s) for s in args.seeds.split(","))
        if args.seeds
        else ((0,) if args.quick else Options.seeds)
    )
    if args.rates_from is not None:
        _check_rates_from(p, args.rates_from, scenarios)
    run(
        Options(
            scenarios,
            seeds,
            arms,
            args.quick,
            args.out,
            args.keep,
            args.replay_arms,
            args.duration_factor,
            args.rates_from,
        )
    )
    return 0


def _check_rates_from(p: argparse.ArgumentParser, path: Path, scenarios: tuple[str, ...]) -> None:
    """Every stream's capacity is in ``path``: checked before minutes of measuring, not after."""
    try:
        for name in scenarios:
            for stream in SCENARIOS[name].streams:
                pinned_capacity(path, name, stream.model)
    except (OSError, ValueError) as exc:
        p.error(f"--rates-from: {exc}")


def _subset(
    p: argparse.ArgumentParser, given: str | None, known: tuple[str, ...], what: str
) -> tuple[str, ...]:
    if not given:
        return known
    chosen = tuple(x.strip() for x in given.split(",") if x.strip())
    unknown = sorted(set(chosen) - set(known))
    if unknown:
        p.error(f"unknown {what} {unknown}; known: {', '.join(known)}")
    return chosen
