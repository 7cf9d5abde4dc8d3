"""The ingest benchmark's plan, arms, rounds and report (see the package docstring)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clients import ClientProcesses
from benchmarks.common import (
    Repeated,
    fmt_repeated,
    format_table,
    machine_info,
    note_if_quick,
    percentiles,
    print_summary,
    source_commit,
    tree_cpu_seconds,
    usable_cores,
    write_results,
)
from benchmarks.loadgen import LoadJob, merge_load, run_http_job, split_job
from benchmarks.servers import start_gateway

MODELS = ("sensor_mlp", "vision_cnn")
CONCURRENCY = 32
CLIENT_PROCESSES = 2
START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Plan:
    quick: bool
    rounds: int
    duration_s: float
    warmup_s: float
    processes: tuple[int, ...]
    cores: tuple[int, ...]

    @classmethod
    def make(cls, quick: bool) -> Plan:
        cores = usable_cores()
        core_counts = (1,) if quick or cores == 1 else (1, cores)
        if quick:
            return cls(quick, 1, 2.0, 0.5, (0, 2), core_counts)
        return cls(quick, 5, 8.0, 2.0, (0, 1, 2), core_counts)


@dataclass(frozen=True)
class Arm:
    model: str
    cores: int
    processes: int

    @property
    def key(self) -> str:
        return f"{self.model}_c{self.cores}_ingest{self.processes}"


def _body(model: str) -> bytes:
    rng = np.random.default_rng(0)
    name, shape = ("features", (1, 32)) if model == "sensor_mlp" else ("image", (1, 32, 32, 3))
    data = rng.standard_normal(shape).astype(np.float32)
    doc = {
        "inputs": [
            {"name": name, "datatype": "FP32", "shape": list(shape), "data": data.ravel().tolist()}
        ],
        "parameters": {"timeout": 10_000_000},  # the SLO is not what this measures
    }
    return json.dumps(doc).encode()


def _measure(arm: Arm, plan: Plan, repo: Path, work: Path, clients: ClientProcesses) -> dict:
    prefix = ("taskset", "-c", ",".join(str(c) for c in range(arm.cores)))
    folder = work / arm.key
    folder.mkdir(parents=True, exist_ok=True)
    server, base = start_gateway(
        repo,
        folder,
        START_TIMEOUT_S,
        args=("--ingest-processes", str(arm.processes)),
        prefix=prefix,
        log_name=f"{arm.key}.log",
    )
    try:
        job = LoadJob(
            url=f"{base}/v2/models/{arm.model}/infer",
            body=_body(arm.model),
            header_length=0,
            rows_per_request=1,
            concurrency=CONCURRENCY,
            duration_s=plan.duration_s,
            max_requests=10**9,
            warmup_s=plan.warmup_s,
            timeout_s=30.0,
        )
        cpu_before = tree_cpu_seconds(server.pid)
        load = merge_load(clients.run(split_job(job, clients.count), timeout_s=300))
        cpu = tree_cpu_seconds(server.pid) - cpu_before  # warm-up included, as for every arm
    finally:
        server.stop()
    served = load["answered"] + load["answered_after_window"]
    lat = percentiles(load["latencies_s"])
    return {
        "arm": arm.key,
        "model": arm.model,
        "cores": arm.cores,
        "ingest_processes": arm.processes,
        "rps": load["answered"] / load["elapsed_s"],
        "p50_ms": lat["p50"] * 1e3,
        "p99_ms": lat["p99"] * 1e3,
        "lost": load["lost"],
        "errors": load["errors"],
        "cpu_ms_per_request": 1e3 * cpu / max(served, 1),
    }


def _summary(arms: list[Arm], runs: list[dict[str, Any]]) -> tuple[dict, list[list[str]]]:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by_arm.setdefault(r["arm"], []).append(r)
    summary: dict[str, Any] = {}
    rows = []
    for arm in arms:
        mine = by_arm[arm.key]
        base = by_arm[Arm(arm.model, arm.cores, 0).key]
        ratios = [m["rps"] / b["rps"] for m, b in zip(mine, base, strict=True) if b["rps"] > 0]
        rps = Repeated.of(m["rps"] for m in mine)
        if arm.processes:
            summary[f"{arm.key}_throughput_ratio"] = Repeated.of(ratios).median
        rows.append(
            [
                arm.model,
                str(arm.cores),
                str(arm.processes),
                fmt_repeated(rps),
                f"{Repeated.of(ratios).median:.2f}",
                f"{Repeated.of(m['p50_ms'] for m in mine).median:.1f}",
                f"{Repeated.of(m['p99_ms'] for m in mine).median:.1f}",
                f"{Repeated.of(m['cpu_ms_per_request'] for m in mine).median:.3f}",
                str(sum(m["lost"] for m in mine)),
            ]
        )
    for model in {a.model for a in arms}:
        for cores in {a.cores for a in arms}:
            best = max(
                (v, k)
                for k, v in summary.items()
                if k.startswith(f"{model}_c{cores}_") and k.endswith("_throughput_ratio")
            )
            summary[f"{model}_c{cores}_best_ingest_throughput_ratio"] = best[0]
    return summary, rows


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    from models.demo import FLOAT_DEMO_MODELS, ensure_demo_repository

    plan = Plan.make(quick)
    code = source_commit()  # the checkout every gateway of the run starts from
    arms = [Arm(m, c, p) for m in MODELS for c in plan.cores for p in plan.processes]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iotgw-bench-ingest-") as tmp:
        work = Path(tmp)
        repo = ensure_demo_repository(
            work / "repo", tuple(d for d in FLOAT_DEMO_MODELS if d.name in MODELS)
        )
        clients = ClientProcesses(CLIENT_PROCESSES, run_http_job, name="ingest-client")
        try:
            for round_no in range(plan.rounds):
                for arm in arms:
                    run = _measure(arm, plan, repo, work, clients)
                    run["round"] = round_no
                    runs.append(run)
                    print(f"round {round_no} {arm.key}: {run['rps']:.0f} req/s", flush=True)
        finally:
            clients.close()
    summary, rows = _summary(arms, runs)
    head = ["model", "cores", "ingest", "req/s", "vs 0", "p50 ms", "p99 ms", "CPU ms/req", "lost"]
    print(format_table(head, rows))
    print_summary(summary)
    note_if_quick(quick)
    write_results(
        "ingest",
        quick=quick,
        out_dir=out_dir,
        machine=machine_info(),
        summary=summary,
        runs=runs,
        config={
            "code": code,
            "models": list(MODELS),
            "concurrency": CONCURRENCY,
            "client_processes": CLIENT_PROCESSES,
            "rounds": plan.rounds,
            "duration_s": plan.duration_s,
            "cores": list(plan.cores),
            "ingest_processes": list(plan.processes),
            "body": "OIP JSON, one row",
            "cpu_pinning": "taskset on the gateway's process tree; clients unpinned",
            "pid": os.getpid(),
        },
    )
    return 0
