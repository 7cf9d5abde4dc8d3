"""Run a plan: connect the devices, send every request at its planned time, measure, summarize.

Everything shares one event loop: a dispatcher sleeps until each planned time and starts that
request as a task (open loop: it never waits for earlier replies), each device's replies are read
by one task per connection, and a progress task prints one line per second. The run is bounded:
the plan is finite and short enough (``max_requests``, ``max_duration_s``), every request gives up
after ``timeout_s``, and at most ``max_in_flight`` requests wait at once (more are counted
``not_sent`` rather than queued without bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO, TypeVar

import aiohttp
import numpy as np

from device_sim.endpoints import BrokerAddress, http_host, require_loopback
from device_sim.http_devices import HttpDevice
from device_sim.ledger import Ledger, Result
from device_sim.mqtt_devices import MqttDevice, MqttLink, MqttOptions, MqttVersion
from device_sim.mqtt_version import VersionChoice, negotiate_version
from device_sim.payloads import Framing, PayloadPool, RecordedPayloads, build_pool
from device_sim.plan import Plan, plan_from_scenario, plan_from_trace
from device_sim.scenario import Scenario
from device_sim.tensors import DataFile, ModelInputs, fetch_metadata, load_metadata_file
from device_sim.trace import check_topic_level, read_trace
from device_sim.wire import RequestBody

Transport = Literal["mqtt", "mqtt5", "mqtt311", "http"]
_VERSION_CHOICE: dict[Transport, VersionChoice] = {"mqtt": "auto", "mqtt5": "5", "mqtt311": "3.1.1"}
_T = TypeVar("_T", bound=AbstractAsyncContextManager[Any])


@dataclass(frozen=True, slots=True)
class SimOptions:
    """How a simulation runs. Exactly one of ``scenario`` and ``trace`` gives the load."""

    transport: Transport = "mqtt"
    """mqtt (MQTT 5 when the broker accepts it, else 3.1.1), mqtt5 (Response Topic +
    Correlation Data), mqtt311 (res topic + id) or http (OIP)."""
    broker: str = "mqtt://127.0.0.1:1883"
    """Broker URL for the MQTT transports: mqtt[s]://[user[:password]@]host[:port]."""
    http_url: str | None = None
    """Gateway base URL: where HTTP devices send, and where model metadata is fetched from."""
    prefix: str = "iotgw"
    """MQTT topic prefix."""
    qos: int = 1
    """MQTT QoS of requests and of the reply subscription."""
    devices: int = 10
    """Number of virtual devices (scenario runs; a trace brings its own devices)."""
    device_prefix: str = "dev"
    """Device ids are <device_prefix><n>, zero-padded."""
    connections: int | None = None
    """MQTT connections the devices share; None gives every device its own connection."""
    models: tuple[str, ...] = ()
    """Models requests go to (uniformly at random), unless a phase names its own."""
    metadata_files: tuple[Path, ...] = ()
    """JSON files with model metadata (GET /v2/models/{m} answers) for MQTT-only setups."""
    data_files: tuple[DataFile, ...] = ()
    """Rows of .npy files to send as a model input instead of random tensors."""
    binary: bool = False
    """Binary tensor framing instead of JSON."""
    batch: int = 1
    """Rows per request (the batch dimension of every input)."""
    deadline_ms: float | None = None
    """Sets the request's "timeout" parameter (the gateway's deadline for it)."""
    scenario: Scenario | None = None
    trace: Path | None = None
    speed: float = 1.0
    """Trace replay speed: 2.0 replays twice as fast."""
    seed: int = 0
    """Seeds arrival times, device/model assignment and generated payloads."""
    timeout_s: float = 5.0
    """A request without a reply after this long is lost."""
    slo_ms: float | None = None
    """Latency objective the summary counts violations against."""
    max_requests: int = 1_000_000
    max_duration_s: float = 3600.0
    max_in_flight: int = 10_000
    allow_remote: bool = False
    """Allow non-loopback broker/gateway addresses."""
    connect_concurrency: int = 64
    """Connections opened at once (avoids a SYN storm against the broker)."""
    connect_timeout_s: float = 10.0
    """How long an MQTT connection waits for the broker's CONNACK."""


@dataclass(slots=True)
class RunResult:
    plan: Plan
    ledger: Ledger
    elapsed_s: float
    run_info: dict[str, Any] = field(default_factory=dict)


class Device(Protocol):
    device_id: str

    async def request(
        self, model: str, body: RequestBody, request_id: str, timeout_s: float
    ) -> Result: ...


def build_plan(options: SimOptions, rng: np.random.Generator) -> Plan:
    if (options.scenario is None) == (options.trace is None):
        raise ValueError("give exactly one of a scenario (arrival process) and a trace")
    if options.trace is not None:
        return plan_from_trace(
            read_trace(options.trace),
            speed=options.speed,
            max_requests=options.max_requests,
            max_duration_s=options.max_duration_s,
        )
    assert options.scenario is not None
    width = len(str(max(options.devices - 1, 0)))
    devices = [
        check_topic_level(f"{options.device_prefix}{i:0{width}d}", "device id")
        for i in range(options.devices)
    ]
    for m in options.models:
        check_topic_level(m, "model")
    return plan_from_scenario(
        options.scenario,
        rng,
        devices,
        list(options.models),
        max_requests=options.max_requests,
        max_duration_s=options.max_duration_s,
    )


async def _model_specs(options: SimOptions, models: Sequence[str]) -> dict[str, ModelInputs]:
    specs: dict[str, ModelInputs] = {}
    for path in options.metadata_files:
        specs.update(load_metadata_file(path))
    missing = [m for m in models if m not in specs]
    if missing and options.http_url:
        async with aiohttp.ClientSession() as session:
            for m in missing:
                specs[m] = await fetch_metadata(session, options.http_url, m)
    return specs


async def build_bodies(
    options: SimOptions, plan: Plan, rng: np.random.Generator
) -> list[RequestBody]:
    """The body of every planned request, in plan order (references into small pools)."""
    needs_generated = {
        plan.models[m]
        for i, m in enumerate(plan.model.tolist())
        if not plan.payloads or plan.payloads[i] is None
    }
    specs = await _model_specs(options, sorted(needs_generated))
    framing = Framing(
        binary=options.binary,
        batch=options.batch,
        timeout_us=round(options.deadline_ms * 1000) if options.deadline_ms is not None else None,
    )
    pools: dict[str, PayloadPool] = {
        m: build_pool(
            m, specs.get(m), [d for d in options.data_files if d.model == m], framing, rng
        )
        for m in sorted(needs_generated)
    }
    recorded = RecordedPayloads(options.trace.parent) if options.trace else None
    bodies: list[RequestBody] = []
    for i, m in enumerate(plan.model.tolist()):
        ref = plan.payloads[i] if plan.payloads else None
        if ref is not None and recorded is not None:
            bodies.append(recorded.body(ref))
        else:
            bodies.append(pools[plan.models[m]].body(i))
    return bodies


@contextlib.asynccontextmanager
async def open_all(contexts: list[_T], concurrency: int) -> AsyncIterator[list[_T]]:
    """Enter many async context managers concurrently (at most ``concurrency`` at once), and exit
    the entered ones concurrently, whatever happens in between."""
    entered: list[_T] = []
    gate = asyncio.Semaphore(concurrency)

    async def enter(cm: _T) -> None:
        async with gate:
            await cm.__aenter__()
            entered.append(cm)

    try:
        try:
            async with asyncio.TaskGroup() as tg:
                for cm in contexts:
                    tg.create_task(enter(cm))
        except ExceptionGroup as group:
            # The first refused connection is the run's failure: report it, not the wrapper.
            raise group.exceptions[0] from None
        yield contexts
    finally:
        async with asyncio.TaskGroup() as tg:
            for cm in entered:
                tg.create_task(cm.__aexit__(None, None, None))


def mqtt_options(options: SimOptions, version: MqttVersion = "5") -> MqttOptions:
    return MqttOptions(
        broker=BrokerAddress.parse(options.broker),
        version=version,
        qos=options.qos,
        prefix=options.prefix,
        connect_timeout_s=options.connect_timeout_s,
    )


async def resolve_transport(options: SimOptions) -> Transport:
    """``mqtt5`` or ``mqtt311`` as the broker allows (docs: device_sim/mqtt_version.py);
    ``http`` as it is."""
    if options.transport == "http":
        return "http"
    version = await negotiate_version(
        mqtt_options(options),
        _VERSION_CHOICE[options.transport],
        option_for_311="--transport mqtt311",
    )
    return "mqtt5" if version == "5" else "mqtt311"


def transport_line(run: dict[str, Any]) -> str:
    """What carried the requests, from a summary's ``run``: ``MQTT 5 via mqtt://127.0.0.1:1883
    (QoS 1, JSON; replies on each request's Response Topic)`` or ``HTTP to http://...``. Said
    outright because ``--http-url`` alone does not make a run HTTP: it is also where an MQTT
    run reads the models' metadata."""
    framing = "binary" if run.get("framing") == "binary" else "JSON"
    if run["transport"] == "http":
        return f"HTTP to {run['target']} ({framing})"
    if run["transport"] == "mqtt5":
        version, replies = "MQTT 5", "replies on each request's Response Topic"
    else:
        version, replies = "MQTT 3.1.1", "replies on <prefix>/infer/<model>/res/<device>"
    return f"{version} via {run['target']} (QoS {run['qos']}, {framing}; {replies})"


def start_line(plan: Plan, run: dict[str, Any], metadata_from: str | None) -> str:
    """The line a run prints before its first request: how much, to what, over what."""
    metadata = f"; model metadata from {metadata_from}" if metadata_from else ""
    return (
        f"iotgw sim run: {len(plan):,} requests from {len(plan.devices)} devices to "
        f"{', '.join(plan.models)} over {transport_line(run)}{metadata}"
    )


def _devices(
    options: SimOptions,
    transport: Transport,
    plan: Plan,
    on_unmatched: Callable[[str | None], None],
) -> tuple[list[MqttLink] | list[HttpDevice], list[Device]]:
    """(connections to open, devices in plan order) for a resolved ``transport``."""
    if transport == "http":
        assert options.http_url is not None
        http = [HttpDevice(d, options.http_url) for d in plan.devices]
        return http, list(http)
    link_options = mqtt_options(options, "5" if transport == "mqtt5" else "3.1.1")
    tag = secrets.token_hex(3)
    n_links = options.connections or len(plan.devices)
    n_links = max(1, min(n_links, len(plan.devices)))
    groups = [list(plan.devices[k::n_links]) for k in range(n_links)]
    links = [
        MqttLink(
            link_options,
            # Unique per run: two simulators on one broker must not take over each other's
            # sessions (a broker disconnects the older client with the same id).
            f"sim-{tag}-{group[0] if len(group) == 1 else f'conn{k}'}",
            group,
            on_unmatched,
        )
        for k, group in enumerate(groups)
    ]
    link_of = {d: links[k] for k, group in enumerate(groups) for d in group}
    return links, [MqttDevice(d, link_of[d]) for d in plan.devices]


class _Progress:
    """One line per second: totals, the last second's send rate and latency percentiles."""

    def __init__(self, ledger: Ledger, stream: TextIO) -> None:
        self.ledger = ledger
        self.stream = stream

    async def run(self, origin: float) -> None:
        last_sent = 0
        tick = 1
        while True:
            await asyncio.sleep(max(0.0, origin + tick - time.perf_counter()))
            self.line(tick, self.ledger.counters.sent - last_sent)
            last_sent = self.ledger.counters.sent
            tick += 1

    def line(self, t: int, sent_last_s: int) -> None:
        c = self.ledger.counters
        recent = self.ledger.take_recent()
        if recent:
            p50, p99 = np.percentile(recent, [50, 99]) * 1000
            latency = f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms"
        else:
            latency = "no replies"
        print(
            f"[{t:5d}s] sent {c.sent:7d} ({sent_last_s:5d}/s)  ok {c.ok:7d}  err {c.errors:5d}  "
            f"lost {c.lost:5d}  in flight {c.in_flight:5d}  | last 1 s: {latency}",
            file=self.stream,
            flush=True,
        )


async def run_plan(
    plan: Plan,
    bodies: list[RequestBody],
    devices: list[Device],
    ledger: Ledger,
    *,
    timeout_s: float,
    max_in_flight: int,
    request_tag: str,
    progress: TextIO | None = None,
) -> float:
    """Send every planned request at its time, recording into ``ledger``; return the elapsed
    seconds (the last planned send plus the wait for the last reply or timeout)."""
    times = plan.times.tolist()
    device_of = plan.device.tolist()
    model_of = [plan.models[m] for m in plan.model.tolist()]

    async def one(i: int) -> None:
        result = await devices[device_of[i]].request(
            model_of[i], bodies[i], f"{request_tag}-{i}", timeout_s
        )
        ledger.record(i, result)

    origin = ledger.origin = time.perf_counter()
    progress_task = None
    if progress is not None:
        progress_task = asyncio.create_task(_Progress(ledger, progress).run(origin))
    try:
        async with asyncio.TaskGroup() as tg:
            for i, t in enumerate(times):
                # Absolute times, so sleep overshoot never accumulates into drift; when behind,
                # the late requests go out at once.
                delay = origin + t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if ledger.counters.in_flight >= max_in_flight:
                    ledger.refuse(i, "client_in_flight_limit")
                    continue
                ledger.sending()
                tg.create_task(one(i))
    finally:
        if progress_task is not None:
            progress_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress_task
    return time.perf_counter() - origin


def _source(options: SimOptions) -> dict[str, str | None]:
    """``source``: arrival (command-line process), scenario or trace; ``source_file``."""
    if options.trace is not None:
        return {"source": "trace", "source_file": str(options.trace)}
    assert options.scenario is not None
    if options.scenario.source in ("arrival", "scenario"):
        return {"source": options.scenario.source, "source_file": None}
    return {"source": "scenario", "source_file": options.scenario.source}


def request_index(request_tag: str, rid: str | None) -> int | None:
    """The plan index in a request id ``<tag>-<i>`` of this run, else None."""
    if rid is None or not rid.startswith(request_tag + "-"):
        return None
    tail = rid[len(request_tag) + 1 :]
    return int(tail) if tail.isdigit() else None


async def simulate(options: SimOptions, progress: TextIO | None = sys.stderr) -> RunResult:
    """Plan, connect, run and measure; the caller summarizes and writes the outputs."""
    if options.transport == "http" and not options.http_url:
        raise ValueError("the http transport needs --http-url")
    if not options.allow_remote:
        if options.transport != "http":
            await require_loopback(BrokerAddress.parse(options.broker).host)
        if options.http_url:
            await require_loopback(http_host(options.http_url))
    schedule_seed, payload_seed = np.random.SeedSequence(options.seed).spawn(2)
    # Separate streams: changing payload options never changes the arrival schedule.
    plan = build_plan(options, np.random.default_rng(schedule_seed))
    bodies = await build_bodies(options, plan, np.random.default_rng(payload_seed))
    request_tag = secrets.token_hex(4)  # ids unique across runs, so no dedupe window hides one
    ledger = Ledger(len(plan), origin=time.perf_counter())

    def on_unmatched(rid: str | None) -> None:
        ledger.unexpected_reply(request_index(request_tag, rid))

    transport = await resolve_transport(options)
    connections, devices = _devices(options, transport, plan, on_unmatched)
    run_info = {
        "transport": transport,
        # The broker without its credentials, or the gateway's base URL.
        "target": options.http_url
        if transport == "http"
        else str(BrokerAddress.parse(options.broker)),
        "qos": options.qos if transport != "http" else None,
        "framing": "binary" if options.binary else "json",
        "devices": len(plan.devices),
        "connections": len(connections),
        "models": list(plan.models),
        "seed": options.seed,
        "timeout_s": options.timeout_s,
        **_source(options),
        "speed": options.speed if options.trace else None,
    }
    if progress is not None:
        metadata_from = options.http_url if transport != "http" else None
        print(start_line(plan, run_info, metadata_from), file=progress, flush=True)
    links: list[AbstractAsyncContextManager[Any]] = list(connections)
    async with open_all(links, options.connect_concurrency):
        elapsed = await run_plan(
            plan,
            bodies,
            devices,
            ledger,
            timeout_s=options.timeout_s,
            max_in_flight=options.max_in_flight,
            request_tag=request_tag,
            progress=progress,
        )
    return RunResult(plan, ledger, elapsed, run_info)
