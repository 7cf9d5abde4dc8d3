"""The MQTT load client the benchmarks share: paho-mqtt's callback API driven directly (one
client per process, MQTT 5, TCP_NODELAY), a closed loop bounded in requests and in time. Per
request it costs the shared cores less than an asyncio client, so it does not cap the figure
it measures: incoming PUBLISHes are read by the gateway's own parser, outgoing properties are
packed once (``Packed``).

``run_load_job`` is the job runner of a client process (``benchmarks.clients``) that drives
either an ``MqttJob`` or the HTTP load generator's ``LoadJob``.
"""

from __future__ import annotations

import itertools
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import VariableByteIntegers

from benchmarks.common import machine_busy_seconds, process_cpu_seconds
from benchmarks.loadgen import LoadJob, run_http_job
from gateway.mqtt.paho_seam import Message
from gateway.mqtt.wire import parse_publish

# MQTT 5 property identifiers written here.
RESPONSE_TOPIC = b"\x08"
CORRELATION_DATA = b"\x09"


class Packed:
    """PUBLISH properties serialised here rather than by paho's ``Properties`` (tens of µs per
    message in a load client): paho only calls ``pack()`` on what it is given."""

    __slots__ = ("_packed",)

    def __init__(self, body: bytes) -> None:
        self._packed = VariableByteIntegers.encode(len(body)) + body

    def pack(self) -> bytes:
        return self._packed


def mqtt_string(data: bytes) -> bytes:
    """An MQTT string or binary datum: 2-byte big-endian length, then the bytes."""
    return struct.pack("!H", len(data)) + data


def connect(client_id: str, port: int, subscribe: str, qos: int) -> paho.Client:
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


def receive_with(client: paho.Client, on_message: Callable[..., None]) -> None:
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


# -- the closed loop ---------------------------------------------------------------------------


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


@dataclass(slots=True)
class _ClosedLoop:
    """One paho client keeping ``job.concurrency`` requests in flight, and what it counted."""

    job: MqttJob
    client: paho.Client
    request_topics: list[str]
    response_topic: bytes  # the Response Topic property, packed
    sent: dict[bytes, tuple[float, bool, int]] = field(default_factory=dict)
    latencies: list[list[float]] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    counts: dict[str, int] = field(default_factory=lambda: {"ok": 0, "late": 0, "unexpected": 0})
    seq: Any = field(default_factory=itertools.count)
    phase: _Phase = field(default_factory=lambda: _Phase(record=False, until=0.0))

    def send(self) -> None:
        n = next(self.seq)
        key = b"%d" % n
        which = n % len(self.request_topics)  # several topics: alternated request by request
        props: Any = Packed(self.response_topic + CORRELATION_DATA + mqtt_string(key))
        self.phase.issued += 1
        # correlation -> (sent at, recorded, topic)
        self.sent[key] = (time.perf_counter(), self.phase.record, which)
        topic = self.request_topics[which]
        self.client.publish(topic, self.job.payload, qos=self.job.qos, properties=props)

    def on_message(self, c: paho.Client, _u: object, message: Message) -> None:
        now = time.perf_counter()
        props = message.properties
        entry = self.sent.pop(props.CorrelationData, None)  # type: ignore[union-attr]
        if entry is None:
            self.counts["unexpected"] += 1  # a duplicate, or a reply to an earlier run
            return
        t0, recorded, which = entry
        status = dict(getattr(props, "UserProperty", None) or ()).get("status", "200")
        if status != "200":
            self.errors[f"status {status}"] += 1
        elif recorded and now <= self.phase.until:
            self.counts["ok"] += 1
            self.latencies[which].append(now - t0)
        elif recorded:
            self.counts["late"] += 1  # answered, but after the window closed
        if now < self.phase.until and self.phase.issued < self.phase.max_requests:
            self.send()  # closed loop: the next request as soon as this one is answered

    def drive(self, until: float, drain_s: float) -> None:
        """Keep ``concurrency`` requests in flight until ``until``, then wait for replies."""
        clock = time.perf_counter
        self.phase.until, self.phase.issued = until, 0
        for _ in range(min(self.job.concurrency, self.phase.max_requests)):
            self.send()
        while clock() < until and (self.sent or self.phase.issued < self.phase.max_requests):
            self.client.loop(min(0.05, max(until - clock(), 0.0)))
        self.drain(drain_s)

    def drain(self, seconds: float) -> None:
        """Wait up to ``seconds`` for the replies still out."""
        drain_until = time.perf_counter() + seconds
        while self.sent and time.perf_counter() < drain_until:
            self.client.loop(0.05)


def _open_loop(job: MqttJob) -> _ClosedLoop:
    # Under the device's own reply namespace, the only Response Topics the gateway serves.
    reply_topic = f"iotgw/infer/bench/res/{job.client_id}"
    loop = _ClosedLoop(
        job=job,
        client=connect(job.client_id, job.port, reply_topic, job.qos),
        request_topics=[f"{topic}/{job.client_id}" for topic in job.topics],
        response_topic=RESPONSE_TOPIC + mqtt_string(reply_topic.encode()),
        latencies=[[] for _ in job.topics],
    )
    receive_with(loop.client, loop.on_message)
    return loop


def _warm_up(loop: _ClosedLoop) -> None:
    job = loop.job
    if job.warmup_s > 0:
        loop.drive(time.perf_counter() + job.warmup_s, job.timeout_s)
        loop.sent.clear()  # a warm-up request never answered does not count
    loop.errors.clear()
    loop.counts["unexpected"] = 0
    if job.start_at is not None:
        time.sleep(max(0.0, job.start_at - time.time()))


def run_mqtt_load(job: MqttJob) -> dict[str, Any]:
    """``job.concurrency`` requests always in flight from one paho client, for ``duration_s`` or
    ``max_requests``, after a warm-up. Latency is send -> reply received, per request. A reply
    with a status other than 200 is an error; a request without reply by the timeout is lost."""
    loop = _open_loop(job)
    try:
        _warm_up(loop)
        loop.phase.record, loop.phase.max_requests = True, job.max_requests
        cpu0 = cpu_reading(job.watch)
        start = time.perf_counter()
        loop.drive(start + job.duration_s, 0.0)
        end = time.perf_counter()
        cpu1 = cpu_reading(job.watch)
        loop.drain(job.timeout_s)
        lost_by_topic = [0] * len(job.topics)
        for _, recorded, which in loop.sent.values():
            lost_by_topic[which] += recorded
    finally:
        loop.client.disconnect()
    # Stopped by the request bound (low load): the window ends at the last answer.
    elapsed = (end - start) if loop.phase.issued >= job.max_requests else job.duration_s
    return {
        "issued": loop.phase.issued,
        "answered": loop.counts["ok"],
        "answered_after_window": loop.counts["late"],
        "lost": sum(lost_by_topic),
        "lost_by_topic": lost_by_topic,
        "errors": dict(loop.errors),
        "unexpected_replies": loop.counts["unexpected"],
        "elapsed_s": elapsed,
        "rps": loop.counts["ok"] / max(elapsed, 1e-9),
        "latencies_s": [x for part in loop.latencies for x in part],
        "latencies_by_topic_s": loop.latencies,
        "cpu": cpu_delta(cpu0, cpu1, end - start),
    }


def cpu_reading(watch: Sequence[tuple[str, int]]) -> dict[str, float | None]:
    """CPU seconds so far of each watched process, of the whole machine and of this client."""
    out: dict[str, float | None] = {name: process_cpu_seconds(pid) for name, pid in watch}
    out["machine"] = machine_busy_seconds()
    out["client"] = time.process_time()
    return out


def cpu_delta(
    a: dict[str, float | None], b: dict[str, float | None], wall_s: float
) -> dict[str, float | None]:
    """Cores used over the window by each watched process, this client, the whole machine."""
    out: dict[str, float | None] = {}
    for name, before in a.items():
        after = b.get(name)
        out[name] = None if before is None or after is None else (after - before) / wall_s
    return out


def run_load_job(job: MqttJob | LoadJob) -> dict[str, Any]:
    """A load-client process's job runner (``benchmarks.clients``): an MQTT load, or the HTTP
    load generator's closed loop for the same clients over HTTP."""
    if isinstance(job, MqttJob):
        return run_mqtt_load(job)
    return run_http_job(job)
