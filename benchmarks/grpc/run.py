"""The gRPC placement benchmark's arms, rounds and report (see the package docstring)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np

from benchmarks.common import (
    BenchRun,
    Repeated,
    ServerProcess,
    fmt_repeated,
    format_table,
    percentiles,
    print_summary,
    tree_cpu_seconds,
)
from benchmarks.judging import judge, pair_floor
from benchmarks.servers import start_gateway

MODEL = "sensor_mlp"
CONCURRENCY = 16
# Issue 33's target: gRPC at least as fast as the gateway's own HTTP JSON at 32 clients.
TARGET_CONCURRENCY = 32
ARMS = ("grpc_loop", "http_loop", "http_ingest1", "grpc_loop_c32", "http_json_loop_c32")
GRPC_VS_HTTP_JSON_TARGET = 1.0
START_TIMEOUT_S = 180.0
_INFER = "/inference.GRPCInferenceService/ModelInfer"
_TIMEOUT_US = 10_000_000  # the SLO is not what this measures


@dataclass(frozen=True)
class Plan:
    requests: int  # per arm and round
    rounds: int

    @staticmethod
    def make(quick: bool) -> Plan:
        return Plan(requests=200, rounds=1) if quick else Plan(requests=3000, rounds=5)


def _grpc_request(x: np.ndarray) -> bytes:
    from gateway.grpc.messages import message

    request = message("inference.ModelInferRequest")(model_name=MODEL)
    request.parameters["timeout"].int64_param = _TIMEOUT_US
    request.inputs.add(name="features", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.tobytes())
    return bytes(request.SerializeToString())


def _http_request(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": list(x.shape),
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"timeout": _TIMEOUT_US, "binary_data_output": True},
        }
    ).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def concurrency(arm: str) -> int:
    """Calls in flight for ``arm``: ``TARGET_CONCURRENCY`` for the ``_c32`` arms."""
    return TARGET_CONCURRENCY if arm.endswith("_c32") else CONCURRENCY


def _http_json_request(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """The same request as the Open Inference Protocol's JSON body, the reply JSON too."""
    body = {
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ],
        "parameters": {"timeout": _TIMEOUT_US},
    }
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


async def _closed_loop(
    count: int, call: Callable[[], Awaitable[bool]], clients: int
) -> dict[str, Any]:
    """``count`` calls, ``clients`` at a time; their latencies and failures."""
    latencies: list[float] = []
    failed = 0
    left = count

    async def worker() -> None:
        nonlocal left, failed
        while left > 0:
            left -= 1
            started = time.perf_counter()
            ok = await call()
            latencies.append(time.perf_counter() - started)
            failed += not ok

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {"elapsed_s": elapsed, "latencies_s": latencies, "failed": failed}


async def _run_grpc(target: str, count: int, body: bytes, clients: int) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        # Bytes in, bytes out: no client-side parsing in the measured loop.
        infer: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_INFER)

        async def call() -> bool:
            try:
                await infer(body, timeout=30)
            except grpc.aio.AioRpcError:
                return False
            return True

        await _closed_loop(clients, call, clients)  # warm: connections, the first batches
        return await _closed_loop(count, call, clients)


async def _run_http(
    base: str, count: int, request: tuple[bytes, dict[str, str]], clients: int
) -> dict[str, Any]:
    body, headers = request
    url = f"{base}/v2/models/{MODEL}/infer"
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def call() -> bool:
            async with session.post(url, data=body, headers=headers) as reply:
                await reply.read()
                return reply.status == 200

        await _closed_loop(clients, call, clients)
        return await _closed_loop(count, call, clients)


def _measure(arm: str, server: ServerProcess, where: str, plan: Plan, x: np.ndarray) -> dict:
    clients = concurrency(arm)
    cpu_before = tree_cpu_seconds(server.pid)
    if arm.startswith("grpc"):
        load = asyncio.run(_run_grpc(where, plan.requests, _grpc_request(x), clients))
    else:
        request = _http_json_request(x) if arm.startswith("http_json") else _http_request(x)
        load = asyncio.run(_run_http(where, plan.requests, request, clients))
    cpu = tree_cpu_seconds(server.pid) - cpu_before  # the warm-up's calls included
    lat = percentiles(load["latencies_s"])
    return {
        "arm": arm,
        "concurrency": clients,
        "requests": plan.requests,
        "rps": plan.requests / load["elapsed_s"],
        "p50_ms": lat["p50"] * 1e3,
        "p99_ms": lat["p99"] * 1e3,
        "failed": load["failed"],
        "cpu_ms_per_request": 1e3 * cpu / (plan.requests + clients),
    }


def _summary(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[list[str]]]:
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in ARMS}
    summary: dict[str, Any] = {}
    rows = []
    for arm, mine in by_arm.items():
        rps = Repeated.of(r["rps"] for r in mine)
        cpu = Repeated.of(r["cpu_ms_per_request"] for r in mine)
        summary[f"{arm}_rps"] = rps.median
        summary[f"{arm}_cpu_ms_per_request"] = cpu.median
        rows.append(
            [
                arm,
                fmt_repeated(rps),
                f"{Repeated.of(r['p50_ms'] for r in mine).median:.2f}",
                f"{Repeated.of(r['p99_ms'] for r in mine).median:.2f}",
                fmt_repeated(cpu),
                str(sum(r["failed"] for r in mine)),
            ]
        )
    pairs = zip(by_arm["http_ingest1"], by_arm["http_loop"], strict=True)
    summary["ingest_hop_throughput_ratio"] = Repeated.of(
        i["rps"] / h["rps"] for i, h in pairs
    ).median
    pairs = zip(by_arm["grpc_loop"], by_arm["http_loop"], strict=True)
    summary["grpc_vs_http_binary_throughput_ratio"] = Repeated.of(
        g["rps"] / h["rps"] for g, h in pairs
    ).median
    pairs = zip(by_arm["grpc_loop_c32"], by_arm["http_json_loop_c32"], strict=True)
    ratio = Repeated.of(g["rps"] / h["rps"] for g, h in pairs).median
    # The floor: each arm's throughput in consecutive rounds, the larger of the two arms'.
    floors = [
        pair_floor([r["rps"] for r in by_arm[a]]) for a in ("grpc_loop_c32", "http_json_loop_c32")
    ]
    floor = None if None in floors else max(f for f in floors if f is not None)
    key = "grpc_vs_http_json_throughput_ratio_c32"
    summary[key] = ratio
    summary[f"{key}_noise_floor"] = floor
    summary[f"{key}_judged"] = judge(ratio, GRPC_VS_HTTP_JSON_TARGET, floor, at_least=True)
    return summary, rows


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    from models.demo import FLOAT_DEMO_MODELS, ensure_demo_repository

    run = BenchRun("grpc", quick, out_dir)
    plan = Plan.make(quick)
    x = np.random.default_rng(0).standard_normal((1, 32)).astype(np.float32)
    runs: list[dict[str, Any]] = []
    with run.workdir() as work:
        repo = ensure_demo_repository(
            work / "repo", tuple(d for d in FLOAT_DEMO_MODELS if d.name == MODEL)
        )
        for folder in ("loop", "ingest"):
            (work / folder).mkdir()
        loop_gw, loop_base = start_gateway(repo, work / "loop", START_TIMEOUT_S)
        ingest_gw, ingest_base = start_gateway(
            repo, work / "ingest", START_TIMEOUT_S, args=("--ingest-processes", "1")
        )
        try:
            port = loop_gw.wait_for_log(r"gRPC listening on grpc://[^:]+:(\d+)", 10)[1]
            where = {
                "grpc_loop": (loop_gw, f"127.0.0.1:{port}"),
                "http_loop": (loop_gw, loop_base),
                "http_ingest1": (ingest_gw, ingest_base),
                "grpc_loop_c32": (loop_gw, f"127.0.0.1:{port}"),
                "http_json_loop_c32": (loop_gw, loop_base),
            }
            for round_no in range(plan.rounds):
                for arm in ARMS:
                    server, address = where[arm]
                    result = _measure(arm, server, address, plan, x)
                    result["round"] = round_no
                    runs.append(result)
                    run.log(f"round {round_no} {arm}: {result['rps']:.0f} req/s")
        finally:
            loop_gw.stop()
            ingest_gw.stop()
    summary, rows = _summary(runs)
    head = ["arm", "req/s", "p50 ms", "p99 ms", "CPU ms/req", "failed"]
    print(format_table(head, rows))
    print_summary(summary)
    config = {
        "model": MODEL,
        "concurrency": {arm: concurrency(arm) for arm in ARMS},
        "grpc_vs_http_json_target": GRPC_VS_HTTP_JSON_TARGET,
        **plan.__dict__,
    }
    run.write(summary=summary, runs=runs, config=config)
    return 0
