"""Device processes for ``iotgw bench chaos``: MQTT devices that publish inference requests at
QoS 1 and keep a ledger of every request id they published and every reply they got.

Each device is one paho-mqtt client (its own connection, client id = device id) with a
persistent session (MQTT 5 ``clean_start=False`` and a Session Expiry Interval, MQTT 3.1.1
``clean_session=False``) and paho's own reconnect loop. A request published while the broker is
down stays in paho's outgoing store and is sent again after the reconnect; replies the broker
queued for the device meanwhile are delivered on the resumed session. Nothing here retries on
its own: what the ledger shows is what MQTT's QoS 1 delivered.

A device process runs one ``DeviceJob`` (``run_devices``) and returns its ledger: for every
request its send time and first reply (time, status, reason), plus duplicate and unmatched
replies. Times are ``time.monotonic()``, one clock for every process on the machine, so the
orchestrator can place requests against the moments it killed or restarted something.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks.chaos.netns import entered
from benchmarks.mqtt_clients import CORRELATION_DATA, RESPONSE_TOPIC, Packed, mqtt_string
from benchmarks.mqtt_clients import receive_with as read_replies_with_the_gateway_parser
from device_sim.mqtt_devices import reply_topic, request_topic
from device_sim.wire import BINARY_CONTENT_TYPE, OipBody, error_kind, parse_reply

SESSION_EXPIRY_S = 3600
CONTENT_TYPE = b"\x03"  # MQTT 5 property identifier
_CONNECT_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class DeviceJob:
    """One device process's share of a scenario's load."""

    port: int
    protocol: Literal["5", "3.1.1"]
    devices: tuple[str, ...]  # device ids, also the client ids
    model: str
    body: OipBody  # the request, without its id
    duration_s: float
    settle_s: float  # after the load: how long to wait for the last replies
    start_at: float  # time.monotonic() at which the load starts (the same for every process)
    rate: float = 0.0  # open loop: requests per second from this process (over its devices)
    in_flight: int = 0  # closed loop (rate 0): requests outstanding per device
    slo_s: float = 0.1  # the request's deadline, sent as deadline_unix_ms
    broker_host: str = "127.0.0.1"
    netns: str | None = None  # case f: the network namespace the devices run in


@dataclass(slots=True)
class _Ledger:
    """Every request one device published, and what came back for it."""

    sent_at: list[float] = field(default_factory=list)
    replied_at: list[float] = field(default_factory=list)  # NaN: no reply (yet)
    status: list[int] = field(default_factory=list)  # 0: no reply (yet)
    reason: dict[int, str] = field(default_factory=dict)  # error kind of non-200 replies
    index: dict[str, int] = field(default_factory=dict)  # request id -> position
    duplicates: int = 0
    unmatched: int = 0
    answered: int = 0


class Device:
    """One MQTT device: a paho client on its own network thread (``loop_start``)."""

    def __init__(self, job: DeviceJob, device_id: str) -> None:
        self.job = job
        self.device_id = device_id
        self.ledger = _Ledger()
        self.connects = 0
        self.sessions_lost = 0  # reconnects on which the broker had no session for us
        self._subscribed = threading.Event()
        self._topic = request_topic("iotgw", job.model, device_id)
        self._reply_topic = reply_topic("iotgw", job.model, device_id)
        self._seq = 0
        self._on_answer: Any = None  # closed loop: called after each first reply
        # The PUBLISH properties every request shares, serialised once: paho's ``Properties``
        # cost tens of µs per message, and the devices share the cores with the gateway.
        self._properties = (
            RESPONSE_TOPIC
            + mqtt_string(self._reply_topic.encode())
            + CONTENT_TYPE
            + mqtt_string(BINARY_CONTENT_TYPE.encode())
        )
        self.client = self._new_client()

    def _new_client(self) -> paho.Client:
        v5 = self.job.protocol == "5"
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.device_id,
            protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
            clean_session=None if v5 else False,
        )
        # No in-flight cap: a capped client parks publishes as "queued", and paho 2.2 stops
        # resending its store at the first queued one after a reconnect.
        client.max_inflight_messages_set(0)
        client.max_queued_messages_set(0)
        client.reconnect_delay_set(min_delay=1, max_delay=2)
        client.on_connect = self._on_connect
        client.on_subscribe = lambda *_: self._subscribed.set()
        client.on_message = self._on_message
        if v5:  # replies read by the gateway's own MQTT 5 parser, not paho's (same reason)
            read_replies_with_the_gateway_parser(client, self._on_message)
        return client

    def connect(self) -> None:
        props = None
        if self.job.protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY_S
        kwargs: dict[str, Any] = {"clean_start": False} if self.job.protocol == "5" else {}
        self.client.connect(
            self.job.broker_host, self.job.port, keepalive=30, properties=props, **kwargs
        )
        self.client.loop_start()
        if not self._subscribed.wait(_CONNECT_TIMEOUT_S):
            raise TimeoutError(f"{self.device_id}: not subscribed within {_CONNECT_TIMEOUT_S} s")

    def _on_connect(
        self, client: paho.Client, _u: object, flags: Any, reason: Any, _p: object
    ) -> None:
        if reason.is_failure:
            return  # paho's loop tries again
        sock = client.socket()
        if isinstance(sock, socket.socket):
            # Nagle's algorithm holds small QoS 1 packets back 40-90 ms: off, on every socket.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connects += 1
        if flags.session_present:
            return  # the subscription and the replies queued meanwhile are still there
        if self.connects > 1:
            self.sessions_lost += 1
        client.subscribe(self._reply_topic, qos=1)

    def publish(self) -> None:
        ledger = self.ledger
        rid = f"{self.device_id}-{self._seq}"
        self._seq += 1
        props: Any = None  # paho calls only ``pack()`` on it
        if self.job.protocol == "5":
            props = Packed(self._properties + CORRELATION_DATA + mqtt_string(rid.encode()))
        ledger.index[rid] = len(ledger.sent_at)
        ledger.replied_at.append(math.nan)
        ledger.status.append(0)
        ledger.sent_at.append(time.monotonic())
        # The model's SLO as an absolute deadline: the gateway then refuses (503 deadline) a
        # request that already waited it out in the broker's queue instead of answering late.
        deadline = round((time.time() + self.job.slo_s) * 1000)
        payload = self.job.body.mqtt(rid, deadline)
        # Disconnected, paho keeps the message in its store and sends it after reconnecting.
        self.client.publish(self._topic, payload, qos=1, properties=props)

    def _on_message(self, _c: paho.Client, _u: object, message: Any) -> None:
        """A reply: paho's ``MQTTMessage`` (MQTT 3.1.1) or the gateway parser's record."""
        now = time.monotonic()
        status_property = None
        correlation = None
        if message.properties is not None:
            correlation = getattr(message.properties, "CorrelationData", None)
            for key, value in getattr(message.properties, "UserProperty", []):
                if key == "status":
                    status_property = value
        reply = parse_reply(bytes(message.payload), status_property)
        rid = correlation.decode(errors="replace") if correlation else reply.id
        ledger = self.ledger
        i = ledger.index.get(rid) if rid is not None else None
        if i is None:
            ledger.unmatched += 1
            return
        if ledger.status[i]:
            ledger.duplicates += 1
            return
        ledger.replied_at[i] = now
        ledger.status[i] = reply.status or -1
        ledger.answered += 1
        if reply.status != 200:
            ledger.reason[i] = error_kind(reply.status, reply.reason)
        if self._on_answer is not None:
            self._on_answer(self)

    @property
    def outstanding(self) -> int:
        return len(self.ledger.sent_at) - self.ledger.answered

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _open_loop(devices: list[Device], job: DeviceJob) -> None:
    """``job.rate`` requests per second, devices in turn; a late schedule catches up at once
    (the offered rate is what the ledger's send times show)."""
    total = int(job.rate * job.duration_s)
    for i in range(total):
        _sleep_until(job.start_at + i / job.rate)
        devices[i % len(devices)].publish()


def _closed_loop(devices: list[Device], job: DeviceJob) -> None:
    """``job.in_flight`` requests outstanding per device: the next one leaves when a reply
    arrives (from the device's network thread), until the window ends."""
    end = job.start_at + job.duration_s

    def next_request(device: Device) -> None:
        if time.monotonic() < end:
            device.publish()

    _sleep_until(job.start_at)
    for device in devices:
        device._on_answer = next_request
        for _ in range(job.in_flight):
            device.publish()
    _sleep_until(end)


def run_devices(job: DeviceJob) -> dict[str, Any]:
    """Connect every device, run the load, wait up to ``settle_s`` for the last replies (ending
    as soon as every request has one), and return the merged ledger. With ``job.netns`` the
    devices' sockets and network threads live in that namespace; the process returns to its
    own afterwards (it serves the next case's job)."""
    with entered(job.netns):
        return _run_devices(job)


def _run_devices(job: DeviceJob) -> dict[str, Any]:
    devices = [Device(job, d) for d in job.devices]
    try:
        for device in devices:
            device.connect()
        if job.rate > 0:
            _open_loop(devices, job)
        else:
            _closed_loop(devices, job)
        load_end = time.monotonic()
        settle_end = load_end + job.settle_s
        while time.monotonic() < settle_end and any(d.outstanding for d in devices):
            time.sleep(0.05)
        time.sleep(0.5)  # a duplicate of the last replies would arrive by now
    finally:
        for device in devices:
            device.close()
    return _merged(devices, load_end)


def _merged(devices: list[Device], load_end: float) -> dict[str, Any]:
    sent_at: list[float] = []
    replied_at: list[float] = []
    status: list[int] = []
    reasons: dict[int, str] = {}
    for device in devices:
        ledger = device.ledger
        offset = len(sent_at)
        sent_at += ledger.sent_at
        replied_at += ledger.replied_at
        status += ledger.status
        reasons.update({offset + i: kind for i, kind in ledger.reason.items()})
    return {
        "sent_at": sent_at,
        "replied_at": [None if math.isnan(t) else t for t in replied_at],
        "status": status,
        "reasons": reasons,
        "duplicates": sum(d.ledger.duplicates for d in devices),
        "unmatched": sum(d.ledger.unmatched for d in devices),
        "reconnects": sum(max(0, d.connects - 1) for d in devices),
        "sessions_lost": sum(d.sessions_lost for d in devices),
        "load_end": load_end,
    }
