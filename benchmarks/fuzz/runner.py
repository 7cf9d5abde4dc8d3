"""The run: Mosquitto and ``iotgw serve`` as real processes, fuzzed cases sent on HTTP, MQTT and
gRPC at once with a bounded window per transport and a well-formed request from another device every
``good_every``-th send, then the final checks (readiness, a last batch of good requests on both
transports).

A gateway that exits, or that leaves a well-formed request unanswered past the timeout (wedged),
is counted, restarted (its broker session dropped, so the request that wedged it is not
redelivered) and the run goes on, up to ``max_restarts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks.common import ServerProcess, free_port, python_argv
from benchmarks.fuzz.cases import (
    Case,
    GrpcCase,
    HttpCase,
    MqttCase,
    good_grpc,
    good_http,
    good_mqtt,
)
from benchmarks.fuzz.generate import generate_chunk
from benchmarks.fuzz.judge import OK
from benchmarks.fuzz.report import Tally, describe
from benchmarks.fuzz.transports import DOWN, STUCK, MqttDevices, send_grpc, send_http

GATEWAY_ID = "fuzz-gateway"


@dataclass(frozen=True)
class Plan:
    payloads_per_transport: int
    chunk: int  # cases drawn per hypothesis run
    window: int  # requests outstanding per transport
    good_every: int  # one well-formed request per this many sends
    timeout_s: float  # a request without a reply after this long is stuck
    final_good: int  # well-formed requests per transport after the fuzzing
    max_restarts: int
    seed: int = 20240611


class Gateway:
    """``iotgw serve`` on a trimmed repository, restartable with the same ports and id."""

    def __init__(self, folder: Path, repo: Path, broker_port: int) -> None:
        self.folder, self.repo, self.broker_port = folder, repo, broker_port
        self.http_port = free_port()
        self.grpc_port = free_port()  # the same across restarts: the channel reconnects to it
        self.base = f"http://127.0.0.1:{self.http_port}"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.starts = 0
        self.process = self._start()

    def _start(self) -> ServerProcess:
        self.starts += 1
        argv = python_argv(
            "gateway.cli", "serve", "--model-repo", str(self.repo),
            "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
            "--max-body-bytes", str(256 * 1024),
            "--broker", f"mqtt://127.0.0.1:{self.broker_port}",
            "--mqtt-client-id", GATEWAY_ID, "--no-tuner", "--log-level", "INFO",
        )  # fmt: skip
        log = self.folder / f"gateway-{self.starts}.log"
        process = ServerProcess(argv, log_path=log)
        return process

    def alive(self) -> bool:
        return self.process.proc.poll() is None

    async def ready(self, timeout_s: float) -> None:
        """Until the HTTP side answers ready and the MQTT side has subscribed."""
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{self.base}/v2/health/ready") as resp:
                        if resp.status == 200 and "subscribed to" in _log_text(self.process):
                            return
                if not self.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway not ready:\n{self.process.log_text()[-3000:]}")
                await asyncio.sleep(0.1)

    async def restart(self) -> None:
        await asyncio.to_thread(self.process.stop, 5.0)
        await asyncio.to_thread(purge_session, self.broker_port, GATEWAY_ID)
        self.process = self._start()
        await self.ready(180)

    def stop(self) -> None:
        self.process.stop()


def _log_text(process: ServerProcess) -> str:
    return process.log_text()


def purge_session(port: int, client_id: str) -> None:
    """Connect once with the gateway's client id and a clean start: the broker drops the old
    session and the unacknowledged requests it would otherwise redeliver."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.connect("127.0.0.1", port, clean_start=True)
    client.loop_start()
    try:
        deadline = time.monotonic() + 10
        while not client.is_connected() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        client.disconnect()
        client.loop_stop()


async def chunks(plan: Plan, transport: str) -> AsyncGenerator[list[Case], None]:
    """The transport's cases chunk by chunk, the next one drawn while this one is sent."""
    loop = asyncio.get_running_loop()
    count = -(-plan.payloads_per_transport // plan.chunk)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:

        def draw(i: int) -> asyncio.Future[list[Case]]:
            size = min(plan.chunk, plan.payloads_per_transport - i * plan.chunk)
            return loop.run_in_executor(pool, generate_chunk, plan.seed, transport, i, size)

        ahead = draw(0)
        for i in range(count):
            current = await ahead
            if i + 1 < count:
                ahead = draw(i + 1)
            yield current


class FuzzRun:
    """Sends every case and well-formed request, watches the gateway, restarts it when it died
    or wedged, and keeps the tallies."""

    def __init__(
        self,
        plan: Plan,
        gateway: Gateway,
        devices: MqttDevices,
        session: aiohttp.ClientSession,
        channel: grpc.aio.Channel,
    ) -> None:
        self.plan, self.gateway, self.devices, self.session = plan, gateway, devices, session
        self.channel = channel
        self.tallies = {"http": Tally(), "mqtt": Tally(), "grpc": Tally()}
        self.seq = itertools.count(1)
        self.rng = np.random.default_rng(plan.seed)
        self.running = asyncio.Event()
        self.running.set()
        self.in_flight = 0
        self.idle = asyncio.Event()  # set while nothing is in flight
        self.idle.set()
        self.recent: deque[tuple[str, Case]] = deque(maxlen=6)
        self.restarts: list[dict[str, Any]] = []
        self.gateway_exits = 0
        # Transports given up on after max_restarts (the same defect keeps wedging the gateway):
        # the other goes on, and the cases not sent are reported as such.
        self.aborted: dict[str, str] = {}

    async def send(self, transport: str, case: Case) -> tuple[str, str]:
        n = next(self.seq)
        if isinstance(case, HttpCase):
            return await send_http(self.session, self.gateway.base, case, self.plan.timeout_s)
        if isinstance(case, GrpcCase):
            return await send_grpc(self.channel, case, self.plan.timeout_s)
        assert isinstance(case, MqttCase)
        return await self.devices.send(case, n, self.plan.timeout_s)

    async def _one(self, transport: str, case: Case, good: bool, window: asyncio.Semaphore) -> None:
        self.in_flight += 1
        self.idle.clear()
        try:
            self.recent.append((transport, case))
            outcome, why = await self.send(transport, case)
            self.tallies[transport].record(case, good, outcome, why)
            if good and outcome in (STUCK, DOWN):
                # A well-formed request left unanswered: the gateway is wedged (or gone).
                recovery = self.recover((transport,), f"{transport}: {why}")
                asyncio.get_running_loop().create_task(recovery)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()
            window.release()

    async def drive(self, transport: str) -> None:
        goods: dict[str, Callable[[np.random.Generator, int], Case]] = {
            "http": good_http,
            "mqtt": good_mqtt,
            "grpc": good_grpc,
        }
        good = goods[transport]
        window = asyncio.Semaphore(self.plan.window)
        sent = 0
        async with (
            contextlib.aclosing(chunks(self.plan, transport)) as stream,
            asyncio.TaskGroup() as group,
        ):
            async for chunk in stream:
                for case in chunk:
                    batch = [(case, False)]
                    if sent % self.plan.good_every == 0:
                        batch.insert(0, (good(self.rng, sent), True))
                    sent += 1
                    for item, is_good in batch:
                        await self.running.wait()
                        if transport in self.aborted:
                            return
                        await window.acquire()
                        group.create_task(self._one(transport, item, is_good, window))

    async def watch(self) -> None:
        """A gateway process that exits is a crash: counted, then restarted."""
        while True:
            await asyncio.sleep(0.2)
            if not self.gateway.alive() and self.running.is_set():
                self.gateway_exits += 1
                code = self.gateway.process.proc.returncode
                await self.recover(("http", "mqtt", "grpc"), f"gateway exited with {code}")

    async def recover(self, transports: tuple[str, ...], why: str) -> None:
        if not self.running.is_set():
            return  # already recovering
        self.running.clear()
        event = {
            "why": why,
            "after_sends": sum(t.payloads + t.good_sent for t in self.tallies.values()),
            "recent_cases": [{"transport": t, **describe(c)} for t, c in self.recent],
            "log_tail": self.gateway.process.log_text()[-2000:],
        }
        self.restarts.append(event)
        print(f"gateway restart {len(self.restarts)}: {why}", flush=True)
        await self.idle.wait()  # each request in flight ends by its own timeout
        if len(self.restarts) > self.plan.max_restarts:
            for transport in transports:
                self.aborted[transport] = f"more than {self.plan.max_restarts} restarts: {why}"
        await self.gateway.restart()
        self.running.set()

    async def final_checks(self) -> dict[str, Any]:
        async with self.session.get(f"{self.gateway.base}/v2/health/ready") as resp:
            ready = resp.status == 200
        cases: list[tuple[str, Case]] = []
        for k in range(self.plan.final_good):
            cases += [("http", good_http(self.rng, k)), ("mqtt", good_mqtt(self.rng, k))]
            cases.append(("grpc", good_grpc(self.rng, k)))
        outcomes = await asyncio.gather(*(self.send(t, c) for t, c in cases))
        answered = sum(outcome == OK for outcome, _ in outcomes)
        failures = [why for outcome, why in outcomes if outcome != OK][:5]
        return {
            "final_ready": ready,
            "final_good_sent": len(cases),
            "final_good_answered": answered,
            "final_failures": failures,
        }


async def fuzz(plan: Plan, gateway: Gateway, broker_port: int) -> tuple[FuzzRun, dict[str, Any]]:
    await gateway.ready(180)
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=plan.window)) as session,
        MqttDevices(broker_port).connected() as devices,
        grpc.aio.insecure_channel(gateway.grpc_target) as channel,
    ):
        run = FuzzRun(plan, gateway, devices, session, channel)
        watcher = asyncio.create_task(run.watch())
        try:
            await asyncio.gather(run.drive("http"), run.drive("mqtt"), run.drive("grpc"))
            fuzz_s = time.monotonic() - started
            while not (run.running.is_set() and run.idle.is_set()):  # a restart may be on
                await run.running.wait()
                await run.idle.wait()
            final = await run.final_checks()
        finally:
            watcher.cancel()
        return run, {
            "fuzz_s": round(fuzz_s, 1),
            "payloads_per_s": round(
                sum(t.payloads + t.good_sent for t in run.tallies.values()) / fuzz_s, 1
            ),
            "gateway_exits": run.gateway_exits,
            "aborted": run.aborted,
            "unmatched_mqtt_replies": devices.late_replies,
            "restarts": run.restarts,
            **final,
        }
