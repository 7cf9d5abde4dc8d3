"""The peers benchmark from start to end: MLServer's environment, both servers up and checked,
every point measured with the arms interleaved, the results written and printed, everything
stopped whatever happens."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common import BenchRun, ServerProcess
from benchmarks.http.workload import Model, build_repository, load_models
from benchmarks.peers import report
from benchmarks.peers.measure import Arm, measure_point
from benchmarks.peers.mlserver_env import (
    MLSERVER_VERSION,
    MLServerEnv,
    MLServerUnavailable,
    ensure_mlserver,
)
from benchmarks.peers.plan import (
    BATCH_TIMEOUT_MS,
    FULL,
    GATEWAY,
    GATEWAY_BINARY,
    MAX_BATCH_SIZE,
    MLSERVER,
    MODELS,
    NAME,
    QUICK,
    Plan,
)
from benchmarks.peers.servers import start_gateway_batching, start_mlserver
from benchmarks.peers.workload import reply_difference


class Peers:
    """What the steps share: the plan, the log, the results being gathered, the servers."""

    def __init__(self, plan: Plan, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.log = log
        self.runs: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {"plan": asdict(plan), **report.METHOD}
        self.mlserver: dict[str, Any] = {}
        self.servers: list[ServerProcess] = []

    def close(self) -> None:
        for server in self.servers:
            server.stop()


def _mlserver_env(peers: Peers) -> MLServerEnv | None:
    """MLServer's environment; None (and the reason recorded) when it cannot be installed and
    the plan allows running without it."""
    try:
        env = ensure_mlserver(log=peers.log)
    except MLServerUnavailable as exc:
        if not peers.plan.mlserver_optional:
            raise
        peers.log(f"MLServer arm skipped: {exc}")
        peers.mlserver["skipped"] = str(exc)
        return None
    peers.mlserver.update(
        {"version": MLSERVER_VERSION, "requirements": list(env.requirements), "venv": str(env.venv)}
    )
    return env


def _start_servers(peers: Peers, workdir: Path, models: dict[str, Model]) -> list[Arm]:
    """Both servers up; the arms, MLServer's first."""
    plan, log = peers.plan, peers.log
    env = _mlserver_env(peers)
    log("starting the gateway")
    repo = workdir / "repo"
    gateway, gw_base, knobs = start_gateway_batching(repo, workdir, models, plan.startup_timeout_s)
    peers.servers.append(gateway)
    peers.config["gateway"] = {"argv": gateway.argv, "knobs": knobs}
    arms = [Arm(GATEWAY, gw_base, gateway, False), Arm(GATEWAY_BINARY, gw_base, gateway, True)]
    if env is not None:
        log(f"starting MLServer {MLSERVER_VERSION} ({env.venv})")
        server, base, settings = start_mlserver(
            env, workdir / "mlserver", models, knobs, plan.startup_timeout_s
        )
        peers.servers.append(server)
        peers.mlserver.update({"argv": server.argv, "settings": settings})
        arms.insert(0, Arm(MLSERVER, base, server, False))
    peers.config["batching"] = {
        "max_batch_size": MAX_BATCH_SIZE,
        "batch_timeout_ms": BATCH_TIMEOUT_MS,
        "note": "the gateway's maximum counts rows, MLServer's counts requests",
    }
    return arms


def _check(peers: Peers, arms: list[Arm], models: dict[str, Model]) -> None:
    """Every arm answers what the runtime computes, at every row count, before any timing."""
    worst: dict[str, float] = {}
    for arm in arms:
        for model in models.values():
            for rows in peers.plan.rows_per_request:
                diff = reply_difference(model.url(arm.base), model, arm.request(model, rows))
                worst[arm.name] = max(worst.get(arm.name, 0.0), diff)
    peers.config["reply_check_max_abs_diff"] = worst
    peers.log(f"every arm answers what the runtime computes (max abs diff {worst})")


def _measure(peers: Peers, arms: list[Arm], models: dict[str, Model]) -> None:
    """Every point, clients in increasing numbers: each point's windows follow from how long
    the slowest arm's clients waited at the point before (``plan.windows``)."""
    plan = peers.plan
    for name in MODELS:
        for rows in plan.rows_per_request:
            slowest: float | None = None  # rows/s of the slowest arm at the last point
            for c in plan.concurrency:
                cycle_s = None if not slowest else c * rows / slowest
                p = measure_point(plan, arms, models[name], rows, c, cycle_s, peers.runs.append)
                peers.points.append(p)
                peers.log(_point_line(p))
                rates = [f["rows_per_s"]["median"] for f in p["arms"].values() if f["rows_per_s"]]
                slowest = min(rates) if rates else None


def _point_line(p: dict[str, Any]) -> str:
    def med(doc: dict[str, Any] | None) -> str:
        return "-" if doc is None else f"{doc['median']:.4g}"

    parts = [
        f"{arm} {med(fig['rows_per_s'])} rows/s p99 {med(fig['p99_ms'])} ms lost {fig['lost']}"
        for arm, fig in p["arms"].items()
    ]
    ratio = p["vs_mlserver"].get(GATEWAY, {}).get("throughput_ratio")
    head = f"{p['model']} rows={p['rows_per_request']} c={p['concurrency']}"
    return f"{head}: {'; '.join(parts)}; x{med(ratio)}"


def run(plan: Plan, out_dir: Path | None) -> Path:
    record = BenchRun(NAME, plan.quick, out_dir)
    peers = Peers(plan, record.log)
    with record.workdir() as workdir, contextlib.closing(peers):
        models = load_models(build_repository(workdir / "repo"))
        arms = _start_servers(peers, workdir, models)
        _check(peers, arms, models)
        _measure(peers, arms, models)
    summary = report.summarize(plan, peers.points, peers.runs, peers.mlserver)
    packages = {**record.machine.get("packages", {}), "mlserver": peers.mlserver.get("version")}
    record.machine["packages"] = packages
    peers.config.update({"mlserver": peers.mlserver, "wall_s": record.wall_s()})
    report.print_tables(peers.points, summary)
    runs = [*peers.points, *peers.runs]
    return record.write(summary=summary, runs=runs, config=peers.config)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir)
    return 0
