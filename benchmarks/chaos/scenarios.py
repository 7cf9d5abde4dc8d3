"""The cases of ``iotgw bench chaos``: each drives QoS 1 load from device processes while a
timeline kills, stops or restarts processes, then returns the devices' ledgers and the moments
things broke. Accounting (answered / errors / lost) is ``benchmarks.chaos.report``'s."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from benchmarks.chaos.devices import DeviceJob
from benchmarks.chaos.gateway_side import gateway_side, since
from benchmarks.chaos.grpc_clients import GrpcJob
from benchmarks.chaos.stack import MODEL, Gateway, Mosquitto, embedded_broker_kind, rss_bytes
from benchmarks.clients import ClientProcesses
from device_sim.wire import OipBody, encode_request

Action = tuple[float, str, Callable[[], object]]  # (fraction of the load window, name, do it)


@dataclass(frozen=True)
class Plan:
    rate: float  # requests per second in cases a-c (all device processes together)
    duration_s: float  # load window of cases a-c
    settle_s: float  # after the load, longest wait for the last replies
    devices_per_process: int
    ramp_in_flight: tuple[int, ...]  # closed-loop steps (per device) measuring capacity
    ramp_step_s: float
    overload_factor: float
    overload_s: float
    soak_s: float
    soak_rate: float
    rss_every_s: float
    grpc_rate: float  # gRPC calls per second beside the devices in cases a and c


FULL = Plan(200, 60, 30, 4, (1, 4, 16), 4, 3.0, 30, 1800, 200, 10, 50)
QUICK = Plan(60, 12, 20, 2, (2, 8), 2, 3.0, 8, 0, 0, 10, 20)


@dataclass
class Case:
    """What one case hands to the report."""

    name: str
    ledgers: list[dict[str, Any]]
    events: list[dict[str, Any]]
    config: dict[str, Any]
    grpc_ledgers: list[dict[str, Any]] = field(default_factory=list)  # cases a and c


def request_tensors(rng: np.random.Generator, model: str = MODEL) -> dict[str, np.ndarray]:
    """Batch-1 FP32 inputs for the demo model ``model``."""
    from models.demo import FLOAT_DEMO_MODELS

    (spec,) = {m.spec for m in FLOAT_DEMO_MODELS if m.name == model}
    return {i.name: rng.standard_normal((1, *i.shape)).astype(np.float32) for i in spec.inputs}


def request_body(rng: np.random.Generator, model: str = MODEL) -> OipBody:
    """One binary-framed batch-1 FP32 request for the demo model ``model``; each device stamps
    the model's SLO on it as an absolute deadline (``deadline_unix_ms``) when it publishes."""
    return encode_request(request_tensors(rng, model), binary=True)


class Load:
    """Device processes (spawned once, reused by every case) and the way a case drives them."""

    def __init__(
        self,
        clients: ClientProcesses,
        plan: Plan,
        body: OipBody,
        *,
        slo_s: float,
        model: str = MODEL,
        grpc_clients: ClientProcesses | None = None,
    ) -> None:
        self.clients = clients
        self.grpc_clients = grpc_clients
        self.plan = plan
        self.body = body
        self.slo_s = slo_s
        self.model = model
        self._names = iter(range(1 << 30))

    def jobs(
        self,
        port: int,
        *,
        duration_s: float,
        rate: float = 0.0,
        in_flight: int = 0,
        protocol: Literal["5", "3.1.1"] = "5",
        settle_s: float | None = None,
        broker_host: str = "127.0.0.1",
        netns: str | None = None,
    ) -> list[DeviceJob]:
        n = self.clients.count
        start_at = time.monotonic() + 2.0 + self.plan.devices_per_process * 0.1  # connect first
        run = next(self._names)
        return [
            DeviceJob(
                port=port,
                protocol=protocol,
                devices=tuple(f"chaos-{run}-{p}-{d}" for d in range(self.plan.devices_per_process)),
                model=self.model,
                body=self.body,
                duration_s=duration_s,
                settle_s=self.plan.settle_s if settle_s is None else settle_s,
                start_at=start_at,
                rate=rate / n,
                in_flight=in_flight,
                slo_s=self.slo_s,
                broker_host=broker_host,
                netns=netns,
            )
            for p in range(n)
        ]

    def grpc_job(self, gateways: list[Gateway], like: DeviceJob) -> GrpcJob | None:
        """gRPC calls at ``plan.grpc_rate`` to ``gateways`` over ``like``'s load window and
        settle period (None without gRPC client processes)."""
        if self.grpc_clients is None or self.plan.grpc_rate <= 0:
            return None
        ((name, tensor),) = request_tensors(np.random.default_rng(0), self.model).items()
        return GrpcJob(
            targets=tuple(g.grpc_address for g in gateways),
            model=self.model,
            input_name=name,
            shape=tuple(tensor.shape),
            tensor=np.ascontiguousarray(tensor, dtype="<f4").tobytes(),
            rate=self.plan.grpc_rate,
            duration_s=like.duration_s,
            settle_s=like.settle_s,
            start_at=like.start_at,
            slo_s=self.slo_s,
        )

    def run(
        self, jobs: list[DeviceJob], actions: list[Action] | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Run ``jobs`` on the device processes while the timeline's actions happen at their
        fraction of the load window; returns the ledgers and what happened when."""
        ledgers, events, _ = self.run_with_grpc(jobs, actions, None)
        return ledgers, events

    def run_with_grpc(
        self, jobs: list[DeviceJob], actions: list[Action] | None, grpc_job: GrpcJob | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """``run``, with ``grpc_job`` on the gRPC client process beside the devices; returns
        the gRPC clients' ledgers too."""
        job = jobs[0]
        budget = job.duration_s + job.settle_s + 300
        with ThreadPoolExecutor(2, thread_name_prefix="chaos-load") as pool:
            ledgers: Future[list[dict[str, Any]]] = pool.submit(self.clients.run, jobs, budget)
            grpc_ledgers: Future[list[dict[str, Any]]] | None = None
            if grpc_job is not None and self.grpc_clients is not None:
                grpc_ledgers = pool.submit(self.grpc_clients.run, [grpc_job], budget)
            events = _play(actions or [], job.start_at, job.duration_s, ledgers)
            grpc = [] if grpc_ledgers is None else grpc_ledgers.result()
            return ledgers.result(), events, grpc


def _play(
    actions: list[Action], start_at: float, duration_s: float, load: Future[Any]
) -> list[dict[str, Any]]:
    events = []
    for fraction, name, act in sorted(actions, key=lambda a: a[0]):
        delay = start_at + fraction * duration_s - time.monotonic()
        if delay > 0 and load.done():
            break  # the devices failed: their error is raised by the caller
        if delay > 0:
            time.sleep(delay)
        at = time.monotonic()
        act()
        events.append({"event": name, "at": at, "took_s": round(time.monotonic() - at, 3)})
    return events


def _restart(gateway: Gateway, sig: int) -> Callable[[], None]:
    def act() -> None:
        gateway.kill(sig)
        gateway.start()

    return act


def gateway_kills(load: Load, repo: Path, folder: Path) -> Case:
    """(a) One gateway SIGKILLed twice under QoS 1 load, restarted each time at once with the
    same client id: what it had taken unacknowledged is redelivered to its next session. gRPC
    clients call it meanwhile (``benchmarks.chaos.grpc_clients``)."""
    plan = load.plan
    with Mosquitto(folder / "a") as broker:
        gateway = Gateway(repo, folder, client_id="chaos-a", broker=broker.url)
        gateway.start()
        try:
            jobs = load.jobs(broker.port, duration_s=plan.duration_s, rate=plan.rate)
            actions: list[Action] = [
                (0.25, "gateway SIGKILL + restart", _restart(gateway, signal.SIGKILL)),
                (0.6, "gateway SIGKILL + restart", _restart(gateway, signal.SIGKILL)),
            ]
            grpc_job = load.grpc_job([gateway], jobs[0])
            ledgers, events, grpc = load.run_with_grpc(jobs, actions, grpc_job)
        finally:
            gateway.stop()
    config = {"rate": plan.rate, "broker": "mosquitto", "grpc_rate": _rate(grpc_job)}
    return Case("a_gateway_sigkill", ledgers, events, config, grpc)


def broker_restart(load: Load, repo: Path, folder: Path) -> Case:
    """(b) Mosquitto stopped with SIGTERM and started again (same port, same store) under load;
    devices and gateway resume their persistent sessions."""
    plan = load.plan
    with Mosquitto(folder / "b") as broker:
        gateway = Gateway(repo, folder, client_id="chaos-b", broker=broker.url)
        gateway.start()
        try:
            jobs = load.jobs(broker.port, duration_s=plan.duration_s, rate=plan.rate)
            ledgers, events = load.run(jobs, [(0.4, "broker SIGTERM + restart", broker.restart)])
        finally:
            gateway.stop()
    return Case("b_broker_restart", ledgers, events, {"rate": plan.rate, "broker": "mosquitto"})


def replicas(load: Load, repo: Path, folder: Path) -> Case:
    """(c) Three replicas on one shared subscription: one SIGKILLed, one SIGTERMed (it
    drains), the third serving throughout; both come back later with their client ids. gRPC
    clients call all three through one round-robin channel meanwhile."""
    plan = load.plan
    with Mosquitto(folder / "c") as broker:
        gateways = [
            Gateway(repo, folder, client_id=f"chaos-c{i}", broker=broker.url) for i in range(3)
        ]
        try:
            for gateway in gateways:
                gateway.start()
            killed, termed, _ = gateways
            jobs = load.jobs(broker.port, duration_s=plan.duration_s, rate=plan.rate)
            actions: list[Action] = [
                (0.25, "replica 0 SIGKILL", lambda: killed.kill(signal.SIGKILL)),
                (0.4, "replica 1 SIGTERM", lambda: termed.kill(signal.SIGTERM)),
                (0.7, "replica 0 restart", killed.start),
                (0.75, "replica 1 restart", termed.start),
            ]
            grpc_job = load.grpc_job(gateways, jobs[0])
            ledgers, events, grpc = load.run_with_grpc(jobs, actions, grpc_job)
        finally:
            for gateway in gateways:
                gateway.stop()
    config = {"rate": plan.rate, "replicas": 3, "grpc_rate": _rate(grpc_job)}
    return Case("c_replicas", ledgers, events, config, grpc)


def _rate(job: GrpcJob | None) -> float | None:
    return None if job is None else job.rate


def capacity(load: Load, port: int, protocol: Literal["5", "3.1.1"]) -> tuple[float, list[Any]]:
    """Closed-loop ramp: the best rate of 200 replies over the steps (replies per second)."""
    best, steps = 0.0, []
    for in_flight in load.plan.ramp_in_flight:
        jobs = load.jobs(
            port,
            duration_s=load.plan.ramp_step_s,
            in_flight=in_flight,
            protocol=protocol,
            settle_s=10,
        )
        ledgers, _ = load.run(jobs)
        ok = sum(
            1
            for ledger in ledgers
            for s, t in zip(ledger["status"], ledger["replied_at"], strict=True)
            if s == 200 and t is not None and t <= jobs[0].start_at + jobs[0].duration_s
        )
        rate = ok / load.plan.ramp_step_s
        steps.append({"in_flight_per_device": in_flight, "ok_per_s": round(rate, 1)})
        best = max(best, rate)
    return best, steps


def overload(load: Load, repo: Path, folder: Path, *, embedded: bool) -> Case:
    """(d) Capacity measured by a closed-loop ramp, then ``overload_factor`` times it for
    ``overload_s``: on Mosquitto, or on ``iotgw serve``'s embedded default broker."""
    plan = load.plan
    name = "d_overload_embedded" if embedded else "d_overload_mosquitto"
    broker: Mosquitto | None = None if embedded else Mosquitto(folder / name)
    from benchmarks.common import free_port

    embedded_port = free_port()
    extra = ("--mqtt-port", str(embedded_port)) if embedded else ()
    gateway = Gateway(
        repo,
        folder,
        client_id=f"chaos-{name}",
        broker=None if broker is None else broker.url,
        extra=extra,
    )
    try:
        log = gateway.start()
        kind = embedded_broker_kind(log) if embedded else "mosquitto (MQTT 5)"
        protocol: Literal["5", "3.1.1"] = "5" if "MQTT 5" in kind else "3.1.1"
        port = embedded_port if broker is None else broker.port
        best, steps = capacity(load, port, protocol)
        rate = max(best, 1.0) * plan.overload_factor
        jobs = load.jobs(port, duration_s=plan.overload_s, rate=rate, protocol=protocol)
        before = gateway_side(gateway.metrics(), load.model)
        ledgers, events = load.run(jobs)
        after = gateway_side(gateway.metrics(), load.model)
    finally:
        gateway.stop()
        if broker is not None:
            broker.stop()
    config = {
        "model": load.model,
        "slo_ms": round(load.slo_s * 1000.0, 3),
        "broker": kind,
        # Mosquitto's warning when a client's queue is full and it starts dropping (silently
        # for the publisher): the requests the device ledger then finds lost.
        "broker_drop_warnings": _drop_warnings(folder / name)
        + _drop_warnings(folder / f"cache-chaos-{name}"),
        "protocol": protocol,
        "capacity_ok_per_s": round(best, 1),
        "ramp": steps,
        "offered_rate_target": round(rate, 1),
        "gateway_side": since(before, after),
    }
    return Case(name, ledgers, events, config)


def _drop_warnings(folder: Path) -> int:
    return sum(
        log.read_text(errors="replace").count("are being dropped") for log in folder.rglob("*.log")
    )


def soak(load: Load, repo: Path, folder: Path) -> Case:
    """(e) ``soak_s`` of QoS 1 load on one gateway, its RSS read every ``rss_every_s``."""
    plan = load.plan
    samples: list[tuple[float, int]] = []
    stop = threading.Event()
    with Mosquitto(folder / "e") as broker:
        gateway = Gateway(repo, folder, client_id="chaos-e", broker=broker.url)
        gateway.start()

        def sample() -> None:
            while not stop.wait(plan.rss_every_s):
                rss = rss_bytes(gateway.pid)
                if rss is not None:
                    samples.append((time.monotonic(), rss))

        sampler = threading.Thread(target=sample, name="chaos-rss", daemon=True)
        try:
            jobs = load.jobs(broker.port, duration_s=plan.soak_s, rate=plan.soak_rate)
            sampler.start()
            ledgers, events = load.run(jobs)
        finally:
            stop.set()
            gateway.stop()
    start = jobs[0].start_at
    rss = [{"t_s": round(t - start, 1), "rss_bytes": b} for t, b in samples]
    return Case("e_soak", ledgers, events, {"rate": plan.soak_rate, "rss": rss})
