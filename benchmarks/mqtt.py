"""``iotgw bench mqtt``: the gateway's MQTT path against a bare MQTT echo through the same broker,
and against the gateway's own HTTP path, side by side in one run.

For QoS 0 and QoS 1, on the MLP (``sensor_mlp``), one binary-framed 1x32 FP32 request:

- **low load**: one device, one request at a time; p50/p95/p99 of send -> reply at the device,
  for a bare echo responder (publish -> responder -> reply: the limit) and for the gateway,
  interleaved in every round. Knobs ``batch_timeout_ms=0, max_batch_size=1``.
- **saturation**: a closed loop driven by ``processes`` load-client processes, each with its own
  connection and ``in_flight`` requests outstanding (a client sends its next request when the
  reply to its last one arrives). Throughput = requests answered inside the timed window per
  second; a request not answered within the timeout is lost and counted. Echo and gateway over
  MQTT, and the gateway over HTTP with **the same number of processes and the same concurrency**
  (aiohttp keep-alive connections, one per request in flight; also the HTTP bench's raw client,
  the HTTP path's best case), knobs
  ``batch_timeout_ms=1, max_batch_size=32`` for both paths. The MQTT / HTTP ratio is taken per
  round (runs next to each other) and its median quoted.

The MQTT load clients use paho-mqtt's callback API directly (one client per process, MQTT 5,
TCP_NODELAY): per request they cost the shared cores less than an asyncio client, so they do not
cap the figure they measure. The HTTP load clients are aiohttp, as a device fleet or a typical
caller would use. Both are spawned once and reused, and every window records the CPU the
gateway, the broker, the echo, the clients and everything else on the machine used meanwhile
(``cpu_cores``), so a run disturbed by other work shows it.

Mosquitto (``set_tcp_nodelay true``), the echo responder, the gateway and the load clients are
separate processes on 127.0.0.1; everything stops by itself (bounded in time and requests).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import VariableByteIntegers

from benchmarks.clients import ClientProcesses
from benchmarks.common import (
    MIN_FULL_RUNS,
    Repeated,
    ServerProcess,
    fmt_repeated,
    format_table,
    free_port,
    load_average,
    machine_busy_seconds,
    machine_info,
    percentiles,
    process_cpu_seconds,
    python_argv,
    write_results,
)
from gateway.mqtt import Message, parse_publish

MODEL = "sensor_mlp"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Plan:
    runs: int
    low_load_requests: int
    low_load_warmup_s: float
    saturation_s: float
    saturation_warmup_s: float
    processes: int  # load-client processes, the same for MQTT and HTTP
    in_flight: int  # requests outstanding per client process
    timeout_s: float  # a request without a reply after this long is lost


FULL = Plan(
    runs=MIN_FULL_RUNS,
    low_load_requests=400,
    low_load_warmup_s=0.5,
    saturation_s=4.0,
    saturation_warmup_s=1.0,
    processes=2,
    # Enough that the gateway's event loop, not the round trip through the broker, limits the
    # rate (16 left it partly idle over MQTT), and still well inside the model's 100 ms SLO.
    in_flight=32,
    timeout_s=10.0,
)
QUICK = Plan(
    runs=1,
    low_load_requests=30,
    low_load_warmup_s=0.1,
    saturation_s=0.8,
    saturation_warmup_s=0.2,
    processes=2,
    in_flight=4,
    timeout_s=10.0,
)


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


# -- paho clients (load clients and the echo responder) -----------------------------------------


class _Packed:
    """PUBLISH properties serialised here rather than by paho's ``Properties`` (tens of µs per
    message in a load client): paho only calls ``pack()`` on what it is given."""

    __slots__ = ("_packed",)

    def __init__(self, body: bytes) -> None:
        self._packed = VariableByteIntegers.encode(len(body)) + body

    def pack(self) -> bytes:
        return self._packed


def _string(data: bytes) -> bytes:
    """An MQTT string or binary datum: 2-byte big-endian length, then the bytes."""
    return struct.pack("!H", len(data)) + data


def _connect(client_id: str, port: int, subscribe: str, qos: int) -> paho.Client:
    """A connected, subscribed MQTT 5 paho client with Nagle off (driven by ``client.loop``)."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    client.max_inflight_messages_set(65535)  # the closed loop bounds what is in flight
    ready = {"connected": False, "subscribed": False}

    def on_connect(c: paho.Client, _u: object, _f: object, rc: Any, _p: object) -> None:
        if rc.is_failure:
            raise ConnectionError(f"{client_id}: connection refused: {rc}")
        ready["connected"] = True

    def on_subscribe(c: paho.Client, _u: object, _m: int, codes: list[Any], _p: object) -> None:
        if any(code.is_failure for code in codes):
            raise ConnectionError(f"{client_id}: subscription to {subscribe} refused: {codes}")
        ready["subscribed"] = True

    client.on_connect = on_connect
    client.on_subscribe = on_subscribe
    client.connect("127.0.0.1", port, keepalive=60, clean_start=True)
    sock = client.socket()
    assert isinstance(sock, socket.socket)
    # Nagle's algorithm holds small QoS 1 packets back 40-90 ms: off.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    deadline = time.monotonic() + 10
    while not ready["connected"]:
        _loop_or_raise(client, deadline)
    client.subscribe(subscribe, qos=qos)
    while not ready["subscribed"]:
        _loop_or_raise(client, deadline)
    return client


def _receive_with(client: paho.Client, on_message: Callable[..., None]) -> None:
    """Deliver incoming MQTT 5 PUBLISHes to ``on_message`` through the gateway's request
    parser instead of paho's ``Properties`` decoding (tens of µs per message): the clients and
    the echo then cost the shared cores what the gateway's receive path costs, not more.
    Anything that parser does not take still goes through paho."""
    paho_reader = client._handle_publish

    def handle_publish() -> paho.MQTTErrorCode:
        packet = client._in_packet
        message = parse_publish(packet["command"], bytes(packet["packet"]))
        if message is None:
            return paho_reader()
        on_message(client, None, message)
        if message.qos == 1:
            return client._send_puback(message.mid)
        return paho.MQTT_ERR_SUCCESS

    client._handle_publish = handle_publish  # type: ignore[method-assign]
    client.on_message = on_message


def _loop_or_raise(client: paho.Client, deadline: float) -> None:
    rc = client.loop(0.05)
    if rc != paho.MQTT_ERR_SUCCESS:
        raise ConnectionError(f"MQTT connection failed: {paho.error_string(rc)}")
    if time.monotonic() > deadline:
        raise TimeoutError("MQTT connection not ready in 10 s")


def serve_echo(port: int) -> None:
    """The bare echo (its own process): every request is published back on its Response Topic
    with its Correlation Data, at its QoS, from the receive callback (no waiting on acks)."""
    client = _connect("bench-echo", port, "echo/req/+", 1)

    def on_message(c: paho.Client, _u: object, message: Message) -> None:
        props = message.properties
        c.publish(
            props.ResponseTopic,  # type: ignore[union-attr]
            message.payload,
            qos=message.qos,
            # Pre-packed bytes where paho wants Properties: it only calls pack() (see _Packed).
            properties=_Packed(b"\x09" + _string(props.CorrelationData)),  # type: ignore[union-attr,arg-type]
        )

    _receive_with(client, on_message)
    print("echo ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    client.loop_forever()


@dataclass(frozen=True, slots=True)
class MqttJob:
    """One load client's share of a closed-loop run over MQTT."""

    port: int
    topics: tuple[str, ...]  # request topics, used in turn; the client id is the device id
    client_id: str
    qos: int
    payload: bytes
    concurrency: int
    duration_s: float
    max_requests: int
    warmup_s: float
    timeout_s: float
    start_at: float | None = None  # time.time() at which every client process starts timing
    watch: tuple[tuple[str, int], ...] = ()  # (name, pid) whose CPU to read over the window


@dataclass(slots=True)
class _Phase:
    record: bool
    until: float
    issued: int = 0
    max_requests: int = 1 << 62


def run_mqtt_load(job: MqttJob) -> dict[str, Any]:
    """``job.concurrency`` requests always in flight from one paho client, for ``duration_s`` or
    ``max_requests``, after a warm-up. Latency is send -> reply received, per request. A reply
    with a status other than 200 is an error; a request without reply by the timeout is lost."""
    clock = time.perf_counter
    # Under the device's own reply namespace, the only Response Topics the gateway serves.
    reply_topic = f"iotgw/infer/bench/res/{job.client_id}"
    request_topics = [f"{topic}/{job.client_id}" for topic in job.topics]
    response_topic = b"\x08" + _string(reply_topic.encode())
    client = _connect(job.client_id, job.port, reply_topic, job.qos)
    sent: dict[bytes, tuple[float, bool, int]] = {}  # correlation -> (sent, recorded, topic)
    latencies: list[list[float]] = [[] for _ in job.topics]
    errors: Counter[str] = Counter()
    counts = {"ok": 0, "late": 0, "unexpected": 0}
    seq = itertools.count()
    phase = _Phase(record=False, until=0.0)

    def send() -> None:
        n = next(seq)
        key = b"%d" % n
        which = n % len(request_topics)  # several topics: alternated request by request
        props: Any = _Packed(response_topic + b"\x09" + _string(key))  # see _Packed
        phase.issued += 1
        sent[key] = (clock(), phase.record, which)
        client.publish(request_topics[which], job.payload, qos=job.qos, properties=props)

    def on_message(c: paho.Client, _u: object, message: Message) -> None:
        now = clock()
        props = message.properties
        entry = sent.pop(props.CorrelationData, None)  # type: ignore[union-attr]
        if entry is None:
            counts["unexpected"] += 1  # a duplicate, or a reply to an earlier run
            return
        t0, recorded, which = entry
        status = dict(getattr(props, "UserProperty", None) or ()).get("status", "200")
        if status != "200":
            errors[f"status {status}"] += 1
        elif recorded and now <= phase.until:
            counts["ok"] += 1
            latencies[which].append(now - t0)
        elif recorded:
            counts["late"] += 1  # answered, but after the window closed
        if now < phase.until and phase.issued < phase.max_requests:
            send()  # closed loop: the next request as soon as this one is answered

    def drive(until: float, drain_s: float) -> None:
        """Keep ``concurrency`` requests in flight until ``until``, then wait for replies."""
        phase.until, phase.issued = until, 0
        for _ in range(min(job.concurrency, phase.max_requests)):
            send()
        while clock() < until and (sent or phase.issued < phase.max_requests):
            client.loop(min(0.05, max(until - clock(), 0.0)))
        drain_until = clock() + drain_s
        while sent and clock() < drain_until:
            client.loop(0.05)

    _receive_with(client, on_message)
    try:
        if job.warmup_s > 0:
            drive(clock() + job.warmup_s, job.timeout_s)
            sent.clear()  # a warm-up request never answered does not count
        errors.clear()
        counts["unexpected"] = 0
        if job.start_at is not None:
            time.sleep(max(0.0, job.start_at - time.time()))
        phase.record, phase.max_requests = True, job.max_requests
        cpu0 = _cpu_reading(job.watch)
        start = clock()
        drive(start + job.duration_s, 0.0)
        end = clock()
        cpu1 = _cpu_reading(job.watch)
        drain_until = clock() + job.timeout_s
        while sent and clock() < drain_until:
            client.loop(0.05)
        lost_by_topic = [0] * len(job.topics)
        for _, recorded, which in sent.values():
            lost_by_topic[which] += recorded
    finally:
        client.disconnect()
    # Stopped by the request bound (low load): the window ends at the last answer.
    elapsed = (end - start) if phase.issued >= job.max_requests else job.duration_s
    return {
        "issued": phase.issued,
        "answered": counts["ok"],
        "answered_after_window": counts["late"],
        "lost": sum(lost_by_topic),
        "lost_by_topic": lost_by_topic,
        "errors": dict(errors),
        "unexpected_replies": counts["unexpected"],
        "elapsed_s": elapsed,
        "rps": counts["ok"] / max(elapsed, 1e-9),
        "latencies_s": [x for part in latencies for x in part],
        "latencies_by_topic_s": latencies,
        "cpu": _cpu_delta(cpu0, cpu1, end - start),
    }


def _cpu_reading(watch: Sequence[tuple[str, int]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {name: process_cpu_seconds(pid) for name, pid in watch}
    out["machine"] = machine_busy_seconds()
    out["client"] = time.process_time()
    return out


def _cpu_delta(
    a: dict[str, float | None], b: dict[str, float | None], wall_s: float
) -> dict[str, float | None]:
    """Cores used over the window by each watched process, this client, the whole machine."""
    out: dict[str, float | None] = {}
    for name, before in a.items():
        after = b.get(name)
        out[name] = None if before is None or after is None else (after - before) / wall_s
    return out


# -- load-client processes ---------------------------------------------------------------------


def run_job(job: Any) -> dict[str, Any]:
    """A load-client process's job runner (``benchmarks.clients``): an MQTT load, or the HTTP
    bench's aiohttp closed loop for the same clients over HTTP."""
    if isinstance(job, MqttJob):
        return run_mqtt_load(job)
    from benchmarks.http import run_http_job

    return run_http_job(job)


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


def _merge(results: Sequence[dict[str, Any]], rate_key: str) -> dict[str, Any]:
    """One figure from the shares of several client processes timed over the same window."""
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    first = results[0]
    if "cpu" in first:
        cpu = dict(first["cpu"])  # process and machine readings: one window, one reading
    else:  # the HTTP bench's record
        cpu = {"gateway": first["server_cpu_cores"], "machine": first["machine_busy_cores"]}
    wall = [r.get("client_wall_s") or r["elapsed_s"] for r in results]
    clients = [
        r["cpu"]["client"] if "cpu" in r else r["client_cpu_s"] / w
        for r, w in zip(results, wall, strict=True)
    ]
    cpu["clients"] = sum(c for c in clients if c is not None)
    cpu.pop("client", None)
    if cpu.get("machine") is not None:
        ours = sum(v for k, v in cpu.items() if k != "machine" and v is not None)
        cpu["others"] = max(0.0, cpu["machine"] - ours)
    answered = sum(r["answered"] for r in results)
    latencies = np.array([x for r in results for x in r["latencies_s"]]) * 1e3
    return {
        "rps": sum(r[rate_key] for r in results),
        "answered": answered,
        "answered_after_window": sum(r["answered_after_window"] for r in results),
        # The HTTP bench counts a reply with an error status as lost too; here, as on MQTT,
        # lost means no answer at all, and error replies are counted apart.
        "lost": sum(r["lost"] for r in results)
        - sum(n for kind, n in errors.items() if kind.startswith("HTTP ")),
        "errors": dict(errors),
        "processes": len(results),
        **percentiles(latencies),
        "cpu_cores": {k: (None if v is None else round(v, 3)) for k, v in cpu.items()},
    }


def run(plan: Plan, out_dir: Path | None, quick: bool) -> Path:
    from benchmarks.http import LoadJob
    from models.demo import ensure_demo_repository

    frame, body, header_length = request_payload(np.random.default_rng(0), "bench")
    runs: list[dict[str, Any]] = []
    results: dict[str, list[dict[str, Any]]] = {}
    machine = machine_info()
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
                "--no-tuner",  # the gateway's fixed configuration is what is compared
                "--cache-dir",
                str(folder),
                "--no-tuner",  # the knobs compared are the ones set here, not the tuner's
            ),
            log_path=folder / "gateway.log",
        )
        with (
            broker,
            echo,
            gateway,
            ClientProcesses(plan.processes, run_job, name="bench-mqtt-client") as clients,
        ):
            echo.wait_for_log("echo ready", 30)
            gateway.wait_for_log("MQTT: connected", 180)
            url = f"http://127.0.0.1:{http_port}"
            targets = {
                "echo": ("echo/req", echo.pid),
                "gateway": (f"iotgw/infer/{MODEL}/req", gateway.pid),
            }
            names = itertools.count()
            budget = plan.timeout_s * 3 + 120

            def record(key: str, res: dict[str, Any], **fields: Any) -> None:
                results.setdefault(key, []).append(res)
                runs.append({**fields, **res})

            def mqtt_jobs(target: str, qos: int, n: int, **kw: Any) -> list[MqttJob]:
                topic, pid = targets[target]
                return [
                    MqttJob(
                        port=port,
                        topics=(topic,),
                        client_id=f"bench-{target}-{next(names)}",
                        qos=qos,
                        payload=frame,
                        timeout_s=plan.timeout_s,
                        watch=((target, pid), ("broker", broker.pid)),
                        **kw,
                    )
                    for _ in range(n)
                ]

            # Low load: no batching wait, one request at a time, echo and gateway in turn
            # request by request, so that whatever else the machine does meanwhile falls on
            # both alike.
            _put_knobs(url, {"batch_timeout_ms": 0, "max_batch_size": 1})
            for r in range(plan.runs):
                for qos in (0, 1):
                    job = MqttJob(
                        port=port,
                        topics=tuple(topic for topic, _ in targets.values()),
                        client_id=f"bench-low-{next(names)}",
                        qos=qos,
                        payload=frame,
                        concurrency=1,
                        duration_s=plan.timeout_s * 10,
                        max_requests=plan.low_load_requests * len(targets),
                        warmup_s=plan.low_load_warmup_s,
                        timeout_s=plan.timeout_s,
                    )
                    (out,) = clients.run([job], budget * 10)
                    for i, target in enumerate(targets):
                        lat = out["latencies_by_topic_s"][i]
                        res = {
                            "answered": len(lat),
                            "lost": out["lost_by_topic"][i],
                            "errors": out["errors"],  # the pair's (none expected)
                            **percentiles(np.array(lat) * 1e3),
                        }
                        record(
                            f"low/{target}/qos{qos}",
                            res,
                            phase="low_load",
                            target=target,
                            qos=qos,
                            run=r,
                        )

            # Saturation: batches fill up while a batch computes.
            _put_knobs(url, {"batch_timeout_ms": 1, "max_batch_size": 32})
            bound = 1_000_000
            for r in range(plan.runs):
                for qos in (0, 1):
                    for target in targets:
                        start_at = time.time() + plan.saturation_warmup_s + 1.0
                        jobs = mqtt_jobs(
                            target,
                            qos,
                            plan.processes,
                            concurrency=plan.in_flight,
                            duration_s=plan.saturation_s,
                            max_requests=bound,
                            warmup_s=plan.saturation_warmup_s,
                            start_at=start_at,
                        )
                        res = _merge(clients.run(jobs, budget), "rps")
                        record(
                            f"sat/{target}/qos{qos}",
                            res,
                            phase="saturation",
                            target=target,
                            qos=qos,
                            run=r,
                        )
                # HTTP with the same processes and concurrency: aiohttp keep-alive (the
                # headline), and the HTTP bench's minimal raw client, which costs the shared
                # cores less per request than any MQTT client here (the HTTP path's best case).
                for client, key in (("aiohttp", "gateway-http"), ("raw", "gateway-http-raw")):
                    http_job = LoadJob(
                        url=f"{url}/v2/models/{MODEL}/infer",
                        body=body,
                        header_length=header_length,
                        rows_per_request=1,
                        concurrency=plan.in_flight,
                        duration_s=plan.saturation_s,
                        max_requests=bound,
                        warmup_s=plan.saturation_warmup_s,
                        timeout_s=plan.timeout_s,
                        start_at=time.time() + plan.saturation_warmup_s + 1.0,
                        server_pid=gateway.pid,
                        client=client,
                    )
                    res = _merge(clients.run([http_job] * plan.processes, budget), "rows_per_s")
                    record(f"sat/{key}", res, phase="saturation", target=key, run=r)
    machine["load_average_at_end"] = load_average()
    return _report(plan, quick, out_dir, machine, results, runs)


def _per_round(a: list[dict[str, Any]], b: list[dict[str, Any]], fn: Any) -> Repeated:
    return Repeated.of(fn(x, y) for x, y in zip(a, b, strict=True))


def _cpu_us_per_request(res: dict[str, Any], who: str) -> float | None:
    cores = res["cpu_cores"].get(who)
    return None if cores is None or not res["rps"] else cores / res["rps"] * 1e6


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _report(
    plan: Plan,
    quick: bool,
    out_dir: Path | None,
    machine: dict[str, Any],
    results: dict[str, list[dict[str, Any]]],
    runs: list[dict[str, Any]],
) -> Path:
    summary: dict[str, Any] = {}
    rows = []
    for qos in (0, 1):
        low_e, low_g = results[f"low/echo/qos{qos}"], results[f"low/gateway/qos{qos}"]
        sat_e, sat_g = results[f"sat/echo/qos{qos}"], results[f"sat/gateway/qos{qos}"]
        p50 = _per_round(low_g, low_e, lambda g, e: g["p50"] - e["p50"])
        p99 = _per_round(low_g, low_e, lambda g, e: g["p99"] - e["p99"])
        ratio = _per_round(sat_g, sat_e, lambda g, e: g["rps"] / e["rps"])
        summary[f"qos{qos}_p50_overhead_ms"] = round(p50.median, 3)
        summary[f"qos{qos}_p99_overhead_ms"] = round(p99.median, 3)
        summary[f"qos{qos}_gateway_vs_echo_throughput_ratio"] = round(ratio.median, 4)
        summary[f"mqtt_qos{qos}_rps"] = round(Repeated.of(x["rps"] for x in sat_g).median, 1)
        summary[f"echo_qos{qos}_rps"] = round(Repeated.of(x["rps"] for x in sat_e).median, 1)
        rows.append(
            [f"QoS {qos}"]
            + [
                fmt_repeated(Repeated.of(x[field] for x in part))
                for field, part in (
                    ("p50", low_e),
                    ("p50", low_g),
                    ("p99", low_e),
                    ("p99", low_g),
                    ("rps", sat_e),
                    ("rps", sat_g),
                )
            ]
        )
    http = results["sat/gateway-http"]
    for qos in (0, 1):
        ratio = _per_round(results[f"sat/gateway/qos{qos}"], http, lambda m, h: m["rps"] / h["rps"])
        key = "mqtt_vs_http_throughput_ratio" if qos == 1 else "mqtt_qos0_vs_http_throughput_ratio"
        summary[key] = round(ratio.median, 4)
    http_rps = Repeated.of(x["rps"] for x in http)
    summary["http_rps"] = round(http_rps.median, 1)
    raw = results["sat/gateway-http-raw"]
    summary["http_raw_client_rps"] = round(Repeated.of(x["rps"] for x in raw).median, 1)
    summary["mqtt_vs_http_raw_client_throughput_ratio"] = round(
        _per_round(results["sat/gateway/qos1"], raw, lambda m, h: m["rps"] / h["rps"]).median, 4
    )
    # What the gateway process spends per answered request on each path (its CPU over the
    # window / answered per second): other load on the machine moves this much less than rates.
    summary["gateway_cpu_us_per_request_mqtt_qos1"] = _round(
        _median([_cpu_us_per_request(x, "gateway") for x in results["sat/gateway/qos1"]]), 1
    )
    summary["gateway_cpu_us_per_request_http"] = _round(
        _median([_cpu_us_per_request(x, "gateway") for x in http]), 1
    )
    summary["gateway_cpu_per_request_mqtt_qos1_vs_http"] = _round(
        _median(
            [
                (_cpu_us_per_request(m, "gateway") or math.nan)
                / (_cpu_us_per_request(h, "gateway") or math.nan)
                for m, h in zip(results["sat/gateway/qos1"], http, strict=True)
            ]
        ),
        3,
    )
    for name, part in (("mqtt_qos1", results["sat/gateway/qos1"]), ("http", http)):
        summary[f"clients_cpu_us_per_request_{name}"] = _round(
            _median([_cpu_us_per_request(x, "clients") for x in part]), 1
        )
    summary["broker_cpu_us_per_request_mqtt_qos1"] = _round(
        _median([_cpu_us_per_request(x, "broker") for x in results["sat/gateway/qos1"]]), 1
    )
    sat_runs = [r for r in runs if r["phase"] == "saturation"]
    summary["others_cpu_cores_during_saturation"] = _round(
        _median([r["cpu_cores"].get("others") for r in sat_runs]), 2
    )
    summary["lost"] = sum(int(r.get("lost", 0)) for r in runs)
    summary["errors"] = sum(sum(r.get("errors", {}).values()) for r in runs)
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
        f"HTTP (binary, aiohttp) req/s at saturation: {fmt_repeated(http_rps)}; "
        f"MQTT QoS 1 / HTTP = {summary['mqtt_vs_http_throughput_ratio']} "
        f"(QoS 0: {summary['mqtt_qos0_vs_http_throughput_ratio']}), "
        f"{plan.processes} client processes x {plan.in_flight} in flight each"
    )
    print(
        f"HTTP with the raw client: {summary['http_raw_client_rps']} req/s; MQTT QoS 1 / HTTP "
        f"(raw client) = {summary['mqtt_vs_http_raw_client_throughput_ratio']}"
    )
    print(
        "gateway CPU per request: MQTT QoS 1 "
        f"{summary['gateway_cpu_us_per_request_mqtt_qos1']} us, HTTP "
        f"{summary['gateway_cpu_us_per_request_http']} us; broker "
        f"{summary['broker_cpu_us_per_request_mqtt_qos1']} us; other work on the machine used "
        f"{summary['others_cpu_cores_during_saturation']} cores (median over saturation windows)"
    )
    print(f"lost requests: {summary['lost']}, error replies: {summary['errors']}")
    path = write_results(
        "mqtt",
        quick=quick,
        out_dir=out_dir,
        machine=machine,
        summary=summary,
        runs=runs,
        config={
            "model": MODEL,
            "payload": "binary frame, 1x32 FP32 (the same JSON header and tensor over HTTP)",
            "plan": plan.__dict__,
            "broker": "mosquitto, set_tcp_nodelay true",
            "gateway": (
                "iotgw serve --broker (MQTT 5, QoS of the run), --receive-maximum 256, --no-tuner"
            ),
            "low_load_knobs": {"batch_timeout_ms": 0, "max_batch_size": 1},
            "saturation_knobs": {"batch_timeout_ms": 1, "max_batch_size": 32},
            "method": (
                "Low load: one paho client process, one request at a time, echo and gateway "
                "interleaved per round; overheads are per-round gateway minus echo, median. "
                f"Saturation: {plan.processes} load-client processes with {plan.in_flight} "
                "requests in flight each (closed loop, started together after a warm-up), the "
                "same for every target: MQTT via one paho-mqtt MQTT 5 client per process "
                "(TCP_NODELAY), HTTP via one aiohttp session per process with as many "
                "keep-alive connections as requests in flight (headline), and again with the "
                "HTTP bench's raw asyncio client (the HTTP path's best case). Throughput = "
                "requests answered "
                "with status 200 inside the window / window; unanswered after the timeout = "
                "lost. Ratios per round (runs next to each other), median over rounds. "
                "cpu_cores: cores used over each window by the server processes, the clients, "
                "and the rest of the machine (others)."
            ),
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
        serve_echo(args.serve_echo)
        return 0
    return main(quick=args.quick, out_dir=args.out)


if __name__ == "__main__":
    sys.exit(_cli())
