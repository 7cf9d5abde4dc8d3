"""The peers benchmark from start to end: the peers' environments, every server up and checked,
every point measured with the arms interleaved (the project's client, then wrk, then the open
loop's capacity), the results written and printed, everything stopped whatever happens."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common import BenchRun, ServerProcess
from benchmarks.http.workload import Model, build_repository, load_models
from benchmarks.peers import report
from benchmarks.peers.capacity import arm_capacity
from benchmarks.peers.grpc_points import (
    GATEWAY_COUNTER,
    TRITON_COUNTER,
    GrpcArm,
    SuccessCounter,
    gateway_target,
    grpc_point,
)
from benchmarks.peers.grpc_points import reply_difference as grpc_reply_difference
from benchmarks.peers.measure import Arm, measure_point, rotated
from benchmarks.peers.peer_env import (
    MLSERVER_VERSION,
    PYTRITON_VERSION,
    PeerEnv,
    PeerUnavailable,
    ensure_mlserver,
    ensure_triton,
)
from benchmarks.peers.plan import (
    FULL,
    GATEWAY,
    GATEWAY_BINARY,
    GATEWAY_GRPC,
    GATEWAY_STATIC,
    GATEWAY_STATIC_GRPC,
    JSON_ARMS,
    MLSERVER,
    MODELS,
    NAME,
    QUICK,
    TRITON,
    TRITON_GRPC,
    Plan,
)
from benchmarks.peers.servers import (
    start_gateway_agent,
    start_gateway_static,
    start_mlserver,
    start_triton,
)
from benchmarks.peers.workload import reply_difference
from benchmarks.peers.wrk_points import wrk_point


class Peers:
    """What the steps share: the plan, the log, the results being gathered, the servers."""

    def __init__(self, plan: Plan, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.log = log
        self.runs: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.wrk_points: list[dict[str, Any]] = []
        self.grpc_points: list[dict[str, Any]] = []
        self.capacity: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {"plan": asdict(plan), **report.METHOD}
        self.peers: dict[str, dict[str, Any]] = {MLSERVER: {}, TRITON: {}}
        self.servers: list[ServerProcess] = []

    def close(self) -> None:
        for server in self.servers:
            server.stop()


def _peer_env(
    peers: Peers, arm: str, version: str, ensure: Callable[..., PeerEnv]
) -> PeerEnv | None:
    """A peer's environment; None (and the reason recorded) when it cannot be installed and
    the plan allows running without it."""
    try:
        env = ensure(log=peers.log)
    except PeerUnavailable as exc:
        if not peers.plan.peers_optional:
            raise
        peers.log(f"{arm} arm skipped: {exc}")
        peers.peers[arm]["skipped"] = str(exc)
        return None
    info = {"version": version, "requirements": list(env.requirements), "venv": str(env.venv)}
    peers.peers[arm].update(info)
    return env


def _start_servers(peers: Peers, workdir: Path, models: dict[str, Model]) -> list[Arm]:
    """Every server up; the arms, the peers' first."""
    plan, log = peers.plan, peers.log
    mlserver_env = _peer_env(peers, MLSERVER, MLSERVER_VERSION, ensure_mlserver)
    triton_env = _peer_env(peers, TRITON, PYTRITON_VERSION, ensure_triton)
    repo, timeout_s = workdir / "repo", plan.startup_timeout_s
    log("starting the gateway (--no-tuner, the best static configuration)")
    static, static_base, knobs = start_gateway_static(repo, workdir, models, timeout_s)
    peers.servers.append(static)
    log("starting the gateway (the default iotgw serve, agent on)")
    agent, agent_base = start_gateway_agent(repo, workdir, timeout_s)
    peers.servers.append(agent)
    peers.config["gateway"] = {"argv": agent.argv, "agent": True}
    peers.config["gateway_static"] = {"argv": static.argv, "knobs": knobs}
    arms = [
        Arm(GATEWAY, agent_base, agent, False),
        Arm(GATEWAY_STATIC, static_base, static, False),
        Arm(GATEWAY_BINARY, static_base, static, True),
    ]
    if triton_env is not None:
        log(f"starting Triton (PyTriton {PYTRITON_VERSION}, {triton_env.venv})")
        server, base, config = start_triton(
            triton_env, workdir / "triton", models, knobs, timeout_s
        )
        peers.servers.append(server)
        peers.peers[TRITON].update({"argv": server.argv, "config": config})
        arms.insert(0, Arm(TRITON, base, server, False))
    if mlserver_env is not None:
        log(f"starting MLServer {MLSERVER_VERSION} ({mlserver_env.venv})")
        server, base, settings = start_mlserver(
            mlserver_env, workdir / "mlserver", models, knobs, timeout_s
        )
        peers.servers.append(server)
        peers.peers[MLSERVER].update({"argv": server.argv, "settings": settings})
        arms.insert(0, Arm(MLSERVER, base, server, False))
    peers.config["batching"] = {
        "static_knobs": knobs,
        "note": "the gateway's maximum batch counts rows, MLServer's and Triton's count "
        "requests (the same at one row per request); Triton's queue delay is the gateway's "
        "batch timeout, its instances the gateway's concurrency",
    }
    return arms


def _grpc_arms(peers: Peers, arms: list[Arm]) -> list[GrpcArm]:
    """The gRPC endpoints of both gateways and, when it runs, Triton's (first), each with the
    metric its server counts successful inferences in."""
    by_name = {a.name: a for a in arms}
    sample, labels = GATEWAY_COUNTER
    out = [
        GrpcArm(
            name,
            gateway_target(by_name[of].server),
            SuccessCounter(f"{by_name[of].base}/metrics", sample, labels),
            by_name[of].server,
        )
        for name, of in ((GATEWAY_GRPC, GATEWAY), (GATEWAY_STATIC_GRPC, GATEWAY_STATIC))
    ]
    if TRITON in by_name:
        config = peers.peers[TRITON]["config"]
        sample, labels = TRITON_COUNTER
        metrics = f"http://{config['host']}:{config['metrics_port']}/metrics"
        target = f"{config['host']}:{config['grpc_port']}"
        counter = SuccessCounter(metrics, sample, labels)
        out.insert(0, GrpcArm(TRITON_GRPC, target, counter, by_name[TRITON].server))
    return out


def _check(
    peers: Peers, arms: list[Arm], grpc_arms: list[GrpcArm], models: dict[str, Model]
) -> None:
    """Every arm answers what the runtime computes, at every row count (one row over gRPC),
    before any timing."""
    worst: dict[str, float] = {}
    for arm in arms:
        for model in models.values():
            for rows in peers.plan.rows_per_request:
                diff = reply_difference(model.url(arm.base), model, arm.request(model, rows))
                worst[arm.name] = max(worst.get(arm.name, 0.0), diff)
    for g in grpc_arms:
        for model in models.values():
            worst[g.name] = max(worst.get(g.name, 0.0), grpc_reply_difference(g, model))
    peers.config["reply_check_max_abs_diff"] = worst
    peers.log(f"every arm answers what the runtime computes (max abs diff {worst})")


def _measure(peers: Peers, arms: list[Arm], models: dict[str, Model]) -> None:
    """Every point of the project's client, clients in increasing numbers: each point's
    windows follow from how long the slowest arm's clients waited at the point before
    (``plan.windows``)."""
    plan = peers.plan
    for name in MODELS:
        for rows in plan.rows_per_request:
            slowest: float | None = None  # rows/s of the slowest arm at the last point
            for c in plan.concurrency:
                cycle_s = None if not slowest else c * rows / slowest
                p = measure_point(plan, arms, models[name], rows, c, cycle_s, peers.runs.append)
                peers.points.append(p)
                peers.log(report.point_line(p, "rows_per_s"))
                rates = [f["rows_per_s"]["median"] for f in p["arms"].values() if f["rows_per_s"]]
                slowest = min(rates) if rates else None


def _measure_wrk(peers: Peers, arms: list[Arm], models: dict[str, Model]) -> None:
    """The closed loops through wrk, one row per request, every JSON arm."""
    json_arms = [a for a in arms if a.name in JSON_ARMS]
    for name in MODELS:
        for c in peers.plan.wrk_concurrency:
            p = wrk_point(peers.plan, json_arms, models[name], c, peers.runs.append)
            peers.wrk_points.append(p)
            peers.log(report.point_line(p, "requests_per_s"))


def _measure_grpc(peers: Peers, arms: list[GrpcArm], models: dict[str, Model]) -> None:
    """The closed loops over gRPC through h2load, one row per request, every gRPC arm."""
    for name in MODELS:
        for c in peers.plan.grpc_concurrency:
            p = grpc_point(peers.plan, arms, models[name], c, peers.runs.append)
            peers.grpc_points.append(p)
            peers.log(report.point_line(p, "requests_per_s"))


def _measure_capacity(
    peers: Peers, arms: list[Arm], models: dict[str, Model], workdir: Path
) -> None:
    """Every JSON arm's capacity at the model's SLO, ``plan.capacity_repeats`` times,
    interleaved; each search starts from half the arm's rate through wrk at 32 connections
    (the most the plan measured, when it has no 32)."""
    json_arms = [a for a in arms if a.name in JSON_ARMS]
    for name in MODELS:
        for repeat in range(peers.plan.capacity_repeats):
            for arm in rotated(json_arms, repeat):
                closed_rps = report.wrk_rate(peers.wrk_points, name, arm.name)
                out = workdir / "open" / f"{name}-{arm.name}-{repeat}"
                found = arm_capacity(
                    peers.plan, arm.base, models[name], closed_rps, out, seed=repeat
                )
                row = {"figure": "peer_capacity", "model": name, "arm": arm.name, **found}
                peers.capacity.append({**row, "round": repeat})
                peers.log(f"{name} {arm.name} capacity {found['capacity_rps']} req/s")


def run(plan: Plan, out_dir: Path | None) -> Path:
    record = BenchRun(NAME, plan.quick, out_dir)
    peers = Peers(plan, record.log)
    with record.workdir() as workdir, contextlib.closing(peers):
        models = load_models(build_repository(workdir / "repo"))
        arms = _start_servers(peers, workdir, models)
        grpc_arms = _grpc_arms(peers, arms)
        _check(peers, arms, grpc_arms, models)
        _measure(peers, arms, models)
        _measure_wrk(peers, arms, models)
        _measure_grpc(peers, grpc_arms, models)
        _measure_capacity(peers, arms, models, workdir)
    summary = report.summarize(
        plan,
        peers.points,
        peers.wrk_points,
        peers.grpc_points,
        peers.capacity,
        peers.runs,
        peers.peers,
    )
    packages = {
        **record.machine.get("packages", {}),
        "mlserver": peers.peers[MLSERVER].get("version"),
        "nvidia-pytriton": peers.peers[TRITON].get("version"),
    }
    record.machine["packages"] = packages
    peers.config.update({"mlserver": peers.peers[MLSERVER], "triton": peers.peers[TRITON]})
    peers.config["wall_s"] = record.wall_s()
    report.print_tables(peers.points, peers.wrk_points, peers.grpc_points, summary)
    runs = [*peers.points, *peers.wrk_points, *peers.grpc_points, *peers.capacity, *peers.runs]
    return record.write(summary=summary, runs=runs, config=peers.config)


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir)
    return 0
