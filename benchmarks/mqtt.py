"""``iotgw bench mqtt``: the gateway's MQTT path against a bare MQTT echo through the same broker.

Side by side in one run, for QoS 0 and QoS 1, on the MLP (``sensor_mlp``):

- low load: one device, one request at a time; p50 and p99 of send -> reply at the device, for a
  bare echo responder (publish -> responder -> reply, the limit) and for the gateway;
- saturation: a closed loop of many requests in flight; answered requests/s, echo vs gateway;
- the HTTP path at saturation for the same model and payload, for the MQTT / HTTP ratio.

Mosquitto (``set_tcp_nodelay true``), the echo responder and the gateway are separate processes;
the devices run in this process. Everything talks to 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import struct
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import numpy as np
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks.common import (
    MIN_FULL_RUNS,
    Repeated,
    ServerProcess,
    fmt_repeated,
    format_table,
    free_port,
    machine_info,
    percentiles,
    python_argv,
    write_results,
)

MODEL = "sensor_mlp"
NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Plan:
    runs: int
    low_load_requests: int
    saturation_s: float
    in_flight: int
    warmup_requests: int


FULL = Plan(
    runs=MIN_FULL_RUNS, low_load_requests=300, saturation_s=5.0, in_flight=32, warmup_requests=200
)
QUICK = Plan(runs=1, low_load_requests=30, saturation_s=1.0, in_flight=8, warmup_requests=20)


def request_payload(rng: np.random.Generator, rid: str) -> tuple[bytes, bytes, int]:
    """The MLP request as an MQTT binary frame, and as an HTTP body + JSON header length."""
    x = rng.standard_normal((1, 32)).astype("<f4")
    header = json.dumps(
        {
            "id": rid,
            "inputs": [
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": [1, 32],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    body = header + x.tobytes()
    return b"OIPB" + struct.pack("<I", len(header)) + body, body, len(header)


# -- the bare echo responder (its own process) -------------------------------------------------


async def _serve_echo(port: int) -> None:
    async with aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier="bench-echo",
        protocol=aiomqtt.ProtocolVersion.V5,
        socket_options=NODELAY,
    ) as client:
        await client.subscribe("echo/req/+", qos=1)
        print("echo ready", flush=True)
        async for message in client.messages:
            props = Properties(PacketTypes.PUBLISH)
            props.CorrelationData = message.properties.CorrelationData  # type: ignore[union-attr]
            await client.publish(
                message.properties.ResponseTopic,  # type: ignore[union-attr]
                message.payload,
                qos=message.qos,
                properties=props,
            )


# -- devices -----------------------------------------------------------------------------------


class MqttDevice:
    """One MQTT 5 device connection with many requests in flight, matched by Correlation Data."""

    def __init__(self, client: aiomqtt.Client, name: str, request_topic: str, qos: int) -> None:
        self.client = client
        self.name = name
        self.request_topic = request_topic
        self.qos = qos
        self.reply_topic = f"bench/res/{name}"
        self._waiting: dict[bytes, asyncio.Future[float]] = {}
        self._seq = 0

    async def read(self) -> None:
        async for message in self.client.messages:
            key = message.properties.CorrelationData  # type: ignore[union-attr]
            future = self._waiting.pop(key, None)
            if future is not None and not future.done():
                future.set_result(time.perf_counter())

    async def call(self, payload: bytes, timeout_s: float = 10.0) -> float | None:
        """Send one request; the latency in seconds, or None when no reply came (lost)."""
        self._seq += 1
        key = f"{self.name}-{self._seq}".encode()
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.reply_topic
        props.CorrelationData = key
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        sent = time.perf_counter()
        await self.client.publish(self.request_topic, payload, qos=self.qos, properties=props)
        try:
            return await asyncio.wait_for(future, timeout_s) - sent
        except TimeoutError:
            self._waiting.pop(key, None)
            return None


async def _with_device(port: int, request_topic: str, qos: int, work: Any) -> Any:
    name = f"bench-dev-{time.monotonic_ns()}"
    async with aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=name,
        protocol=aiomqtt.ProtocolVersion.V5,
        socket_options=NODELAY,
        max_inflight_messages=1000,
    ) as client:
        dev = MqttDevice(client, name, request_topic, qos)
        await client.subscribe(dev.reply_topic, qos=qos)
        reader = asyncio.create_task(dev.read())
        try:
            return await work(dev)
        finally:
            reader.cancel()


async def low_load(
    port: int, topic: str, qos: int, n: int, payloads: list[bytes]
) -> dict[str, Any]:
    async def work(dev: MqttDevice) -> list[float | None]:
        return [await dev.call(payloads[i % len(payloads)]) for i in range(n)]

    lat = await _with_device(port, topic, qos, work)
    ok = [x for x in lat if x is not None]
    return {**percentiles(np.array(ok) * 1e3), "lost": len(lat) - len(ok)}


async def saturation(
    port: int, topic: str, qos: int, seconds: float, in_flight: int, payloads: list[bytes]
) -> dict[str, Any]:
    async def work(dev: MqttDevice) -> dict[str, Any]:
        done = lost = 0
        end = time.perf_counter() + seconds

        async def loop(i: int) -> None:
            nonlocal done, lost
            while time.perf_counter() < end:
                if await dev.call(payloads[i % len(payloads)]) is None:
                    lost += 1
                else:
                    done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(in_flight)))
        return {"rps": done / (time.perf_counter() - start), "answered": done, "lost": lost}

    return await _with_device(port, topic, qos, work)


async def http_saturation(
    url: str, seconds: float, in_flight: int, bodies: list[tuple[bytes, int]]
) -> dict[str, Any]:
    done = failed = 0
    end = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def loop(i: int) -> None:
            nonlocal done, failed
            body, length = bodies[i % len(bodies)]
            headers = {HEADER_LENGTH: str(length), "Content-Type": "application/octet-stream"}
            while time.perf_counter() < end:
                async with session.post(
                    f"{url}/v2/models/{MODEL}/infer", data=body, headers=headers
                ) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                    else:
                        failed += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(in_flight)))
        return {"rps": done / (time.perf_counter() - start), "answered": done, "failed": failed}


# -- the run -----------------------------------------------------------------------------------


def _mosquitto(folder: Path) -> tuple[ServerProcess, int]:
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    port = free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\nallow_anonymous true\nset_tcp_nodelay true\n"
        "max_queued_messages 100000\nmax_inflight_messages 1000\n"
        "persistence false\n"
    )
    server = ServerProcess([binary, "-c", str(conf)], log_path=folder / "mosquitto.log")
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _put_knobs(url: str, knobs: dict[str, Any]) -> None:
    req = urllib.request.Request(
        f"{url}/admin/models/{MODEL}/versions/1/knobs",
        data=json.dumps(knobs).encode(),
        method="PUT",
    )
    urllib.request.urlopen(req, timeout=60).read()


def run(plan: Plan, out_dir: Path | None, quick: bool) -> Path:
    from models.demo import ensure_demo_repository

    rng = np.random.default_rng(0)
    frames, bodies = [], []
    for i in range(64):
        frame, body, length = request_payload(rng, f"r{i}")
        frames.append(frame)
        bodies.append((body, length))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iotgw-bench-mqtt-") as tmp:
        folder = Path(tmp)
        repo = ensure_demo_repository(folder / "repo")
        broker, port = _mosquitto(folder)
        echo = ServerProcess(
            python_argv("benchmarks.mqtt", "--serve-echo", str(port)), log_path=folder / "echo.log"
        )
        http_port = free_port()
        gateway = ServerProcess(
            python_argv(
                "gateway.cli",
                "serve",
                "--model-repo",
                str(repo),
                "--http-port",
                str(http_port),
                "--broker",
                f"mqtt://127.0.0.1:{port}",
                "--mqtt-client-id",
                "bench-gateway",
                "--receive-maximum",
                "256",
                "--cache-dir",
                str(folder),
            ),
            log_path=folder / "gateway.log",
        )
        with broker, echo, gateway:
            echo.wait_for_log("echo ready", 30)
            gateway.wait_for_log("MQTT: connected", 180)
            url = f"http://127.0.0.1:{http_port}"
            targets = {"echo": "echo/req/bench", "gateway": f"iotgw/infer/{MODEL}/req/bench"}
            results: dict[str, dict[str, list[dict[str, Any]]]] = {}

            async def measure() -> None:
                for qos in (0, 1):
                    for topic in targets.values():
                        await low_load(port, topic, qos, plan.warmup_requests, frames)
                # Low load: no batching wait, one session, all threads on one request.
                _put_knobs(url, {"batch_timeout_ms": 0, "max_batch_size": 1})
                for r in range(plan.runs):
                    for qos in (0, 1):
                        for target, topic in targets.items():  # interleaved: same conditions
                            res = await low_load(port, topic, qos, plan.low_load_requests, frames)
                            results.setdefault(f"low/{target}/qos{qos}", {}).setdefault(
                                "runs", []
                            ).append(res)
                            runs.append(
                                {"phase": "low_load", "target": target, "qos": qos, "run": r, **res}
                            )
                # Saturation: batches fill up while a batch computes.
                _put_knobs(url, {"batch_timeout_ms": 1, "max_batch_size": 32})
                for r in range(plan.runs):
                    for qos in (0, 1):
                        for target, topic in targets.items():
                            res = await saturation(
                                port, topic, qos, plan.saturation_s, plan.in_flight, frames
                            )
                            results.setdefault(f"sat/{target}/qos{qos}", {}).setdefault(
                                "runs", []
                            ).append(res)
                            runs.append(
                                {
                                    "phase": "saturation",
                                    "target": target,
                                    "qos": qos,
                                    "run": r,
                                    **res,
                                }
                            )
                    res = await http_saturation(url, plan.saturation_s, plan.in_flight, bodies)
                    results.setdefault("sat/http", {}).setdefault("runs", []).append(res)
                    runs.append({"phase": "saturation", "target": "gateway-http", "run": r, **res})

            asyncio.run(measure())

    def rep(key: str, field: str) -> Repeated:
        return Repeated.of(x[field] for x in results[key]["runs"])

    summary: dict[str, Any] = {}
    rows = []
    for qos in (0, 1):
        echo_p50, gw_p50 = rep(f"low/echo/qos{qos}", "p50"), rep(f"low/gateway/qos{qos}", "p50")
        echo_p99, gw_p99 = rep(f"low/echo/qos{qos}", "p99"), rep(f"low/gateway/qos{qos}", "p99")
        echo_rps, gw_rps = rep(f"sat/echo/qos{qos}", "rps"), rep(f"sat/gateway/qos{qos}", "rps")
        summary[f"qos{qos}_p50_overhead_ms"] = round(gw_p50.median - echo_p50.median, 3)
        summary[f"qos{qos}_p99_overhead_ms"] = round(gw_p99.median - echo_p99.median, 3)
        summary[f"qos{qos}_gateway_vs_echo_throughput_ratio"] = round(
            gw_rps.median / echo_rps.median, 4
        )
        rows.append(
            [
                f"QoS {qos}",
                fmt_repeated(echo_p50),
                fmt_repeated(gw_p50),
                fmt_repeated(echo_p99),
                fmt_repeated(gw_p99),
                fmt_repeated(echo_rps),
                fmt_repeated(gw_rps),
            ]
        )
    http_rps = rep("sat/http", "rps")
    mqtt_rps = rep("sat/gateway/qos1", "rps")
    summary["mqtt_vs_http_throughput_ratio"] = round(mqtt_rps.median / http_rps.median, 4)
    summary["http_rps"] = round(http_rps.median, 1)
    summary["mqtt_qos1_rps"] = round(mqtt_rps.median, 1)
    summary["lost"] = sum(int(r.get("lost", 0)) for r in runs)
    summary["runs_per_figure"] = plan.runs
    print(
        format_table(
            [
                "",
                "echo p50 ms",
                "gateway p50 ms",
                "echo p99 ms",
                "gateway p99 ms",
                "echo req/s",
                "gateway req/s",
            ],
            rows,
        )
    )
    print(
        f"HTTP (binary) req/s at saturation: {fmt_repeated(http_rps)}; "
        f"MQTT QoS 1 / HTTP = {summary['mqtt_vs_http_throughput_ratio']}"
    )
    path = write_results(
        "mqtt",
        quick=quick,
        out_dir=out_dir,
        machine=machine_info(),
        summary=summary,
        runs=runs,
        config={
            "model": MODEL,
            "payload": "binary frame, 1x32 FP32",
            "plan": plan.__dict__,
            "broker": "mosquitto, set_tcp_nodelay true",
            "low_load_knobs": {"batch_timeout_ms": 0, "max_batch_size": 1},
            "saturation_knobs": {"batch_timeout_ms": 1, "max_batch_size": 32},
        },
    )
    print(f"results: {path}")
    return path


def main(quick: bool = False, out_dir: Path | None = None) -> int:
    run(QUICK if quick else FULL, out_dir, quick)
    return 0


def _cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.mqtt", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_echo:
        asyncio.run(_serve_echo(args.serve_echo))
        return 0
    return main(quick=args.quick, out_dir=args.out)


if __name__ == "__main__":
    sys.exit(_cli())
