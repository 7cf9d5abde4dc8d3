"""MQTT adapter (aiomqtt on paho-mqtt): requests from ``<prefix>/infer/<model>/req/<device>``,
replies on the MQTT 5 Response Topic (Correlation Data echoed) or on
``<prefix>/infer/<model>/res/<device>``. The wire contract is docs/mqtt.md.

Delivery: QoS 1 with manual acknowledgement, so a request is acknowledged only after the broker
acknowledged its reply. The broker therefore sends at most Receive Maximum unacknowledged
requests at once (our in-flight bound), and redelivers what was not answered when the gateway
reconnects to its persistent session.

aiomqtt owns the connection's life (connect, subscribe, keepalive, disconnect, reconnect); the
per-message path runs on paho's callbacks in the event loop thread, without aiomqtt's message
queue and per-publish waits: a request is decoded and checked in the receive callback, one task
awaits its inference, the reply is handed to paho at once, and the request is acknowledged from
paho's PUBACK callback for that reply. Writes queued in one event-loop pass go out together.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import ssl
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast
from urllib.parse import urlsplit

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties, VariableByteIntegers

from gateway.codecs import oip
from gateway.edge import Edge, Phase, error_document
from gateway.errors import BadRequest, GatewayError, Overloaded, PayloadTooLarge, Undeliverable
from gateway.mqtt_trust import DeviceTrust, ReplyNamespace
from gateway.service import InferenceService
from gateway.settings import MqttSettings
from gateway.types import InferenceRequest

log = logging.getLogger("gateway.mqtt")

TRANSPORT = "mqtt"
BINARY_CONTENT_TYPE = "application/vnd.iotgw.oip+binary"
JSON_CONTENT_TYPE = "application/json"
_DEDUPE_ENTRIES = 20_000
# A request whose reply was published this many times, each time followed by the connection's
# loss before the broker acknowledged it, is answered with an error on the device's own reply
# topic instead: a reply the broker refuses (and drops the gateway for) must not bring the same
# request back after every reconnect, stalling every other device each time.
_MAX_REPLY_ATTEMPTS = 3
_ROUTE_CACHE_ENTRIES = 4096
_SHARED_NOT_SUPPORTED = 0x9E
_TCP_CORK: int | None = getattr(socket, "TCP_CORK", None)  # Linux


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, url: str) -> BrokerAddress:
        parts = urlsplit(url if "://" in url else f"mqtt://{url}")
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ValueError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        tls = parts.scheme in ("mqtts", "ssl")
        if not parts.hostname:
            raise ValueError(f"broker URL {url!r} has no host")
        return cls(parts.hostname, parts.port or (8883 if tls else 1883), tls)


@dataclass(frozen=True, slots=True)
class _Route:
    """Where a request came from and where its reply goes.

    ``refusal`` is set when the request may not be served as sent (a Response Topic outside the
    device's reply namespace, a publisher identity that does not match the topic's device,
    gateway/mqtt_trust.py); ``reply_topic`` is then the device's own default reply topic. The
    request path calls ``raise_if_refused`` before decoding, so the refusal is answered like any
    other ``GatewayError`` (a 403 error reply on ``reply_topic``) and acknowledged."""

    model: str
    device: str
    reply_topic: str
    correlation: bytes | None
    v5: bool
    refusal: GatewayError | None = None

    def raise_if_refused(self) -> None:
        if self.refusal is not None:
            raise self.refusal


@dataclass(slots=True)
class _Delivery:
    """One request taken from the broker, from receipt until it ends: what its reply and its
    acknowledgement need (``mid``/``qos`` of the request, where the reply goes, the key under
    which it counts as seen for duplicate detection)."""

    connection: _Connection
    mid: int
    qos: int
    route: _Route
    key: tuple[str, bytes] | None = None
    ended: bool = False


@dataclass(slots=True)
class _Connection:
    """One broker connection's data path: the paho client under aiomqtt and the requests
    answered on it whose reply the broker has not acknowledged yet (by the reply's packet id)."""

    client: paho.Client
    awaiting_puback: dict[int, _Delivery] = field(default_factory=dict)
    alive: bool = True


class RequestProperties:
    """The properties of an incoming request, as attributes named like paho's ``Properties``
    (absent when the request did not carry them)."""

    __slots__ = (
        "ContentType",
        "CorrelationData",
        "MessageExpiryInterval",
        "PayloadFormatIndicator",
        "ResponseTopic",
        "SubscriptionIdentifier",
        "UserProperty",
    )
    ContentType: str
    CorrelationData: bytes
    MessageExpiryInterval: int
    PayloadFormatIndicator: int
    ResponseTopic: str
    SubscriptionIdentifier: list[int]
    UserProperty: list[tuple[str, str]]


@dataclass(slots=True)
class ReceivedPublish:
    """An incoming PUBLISH with the fields the adapter reads from paho's ``MQTTMessage``."""

    topic: str
    payload: bytes
    qos: int
    mid: int
    properties: RequestProperties


Message = paho.MQTTMessage | ReceivedPublish


def parse_publish(header: int, data: bytes) -> ReceivedPublish | None:
    """An MQTT 5 PUBLISH (fixed header byte, then the rest of the packet), or None when it is
    not a plain QoS 0/1 request this parser knows (paho's decoder then takes it)."""
    qos = (header >> 1) & 0x03
    if qos == 2:
        return None
    (topic_len,) = _U16.unpack_from(data, 0)
    pos = 2 + topic_len
    if topic_len == 0:
        return None  # a topic alias: paho resolves those
    topic = data[2:pos].decode()
    mid = 0
    if qos:
        (mid,) = _U16.unpack_from(data, pos)
        pos += 2
    length, pos = _varint(data, pos)
    end = pos + length
    if end > len(data):
        raise ValueError("properties run past the packet")
    props = RequestProperties()
    while pos < end:
        ident = data[pos]
        pos += 1
        if ident in (3, 8, 9):  # Content Type, Response Topic (UTF-8), Correlation Data
            (n,) = _U16.unpack_from(data, pos)
            value = data[pos + 2 : pos + 2 + n]
            pos += 2 + n
            if ident == 9:
                props.CorrelationData = value
            elif ident == 8:
                props.ResponseTopic = value.decode()
            else:
                props.ContentType = value.decode()
        elif ident == 2:  # Message Expiry Interval
            (props.MessageExpiryInterval,) = _U32.unpack_from(data, pos)
            pos += 4
        elif ident == 1:  # Payload Format Indicator
            props.PayloadFormatIndicator = data[pos]
            pos += 1
        elif ident == 38:  # User Property (a string pair; may repeat)
            (n,) = _U16.unpack_from(data, pos)
            key = data[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            (n,) = _U16.unpack_from(data, pos)
            value_text = data[pos + 2 : pos + 2 + n].decode()
            pos += 2 + n
            pairs = getattr(props, "UserProperty", None) or []
            pairs.append((key, value_text))
            props.UserProperty = pairs
        elif ident == 11:  # Subscription Identifier (may repeat)
            number, pos = _varint(data, pos)
            ids = getattr(props, "SubscriptionIdentifier", None) or []
            ids.append(number)
            props.SubscriptionIdentifier = ids
        else:
            return None
    if pos != end:
        raise ValueError("properties overrun their length")
    return ReceivedPublish(topic, data[end:], qos, mid, props)


_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An MQTT Variable Byte Integer at ``pos``: (value, position after it)."""
    value = shift = 0
    for _ in range(4):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("malformed variable byte integer")


class _PackedProperties:
    """MQTT 5 reply properties serialised once: paho only calls ``pack()`` on the properties of
    a PUBLISH it sends, and building a paho ``Properties`` per reply costs tens of µs."""

    __slots__ = ("_packed",)

    def __init__(self, packed: bytes) -> None:
        self._packed = packed

    def pack(self) -> bytes:
        return self._packed


def _utf8(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("!H", len(data)) + data


_REPLY_PROPERTY_PARTS: dict[tuple[bool, int], tuple[bytes, bytes]] = {}


def reply_properties(binary: bool, status: int, correlation: bytes | None) -> _PackedProperties:
    """Content Type, Correlation Data and the ``status`` user property of a reply, in the
    byte order paho's ``Properties.pack`` would produce (identifier order)."""
    parts = _REPLY_PROPERTY_PARTS.get((binary, status))
    if parts is None:
        content_type = BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE
        parts = (b"\x03" + _utf8(content_type), b"\x26" + _utf8("status") + _utf8(str(status)))
        _REPLY_PROPERTY_PARTS[(binary, status)] = parts
    head, user = parts
    body = head + (b"\x09" + _utf8(correlation) if correlation is not None else b"") + user
    return _PackedProperties(VariableByteIntegers.encode(len(body)) + body)


class MqttAdapter:
    """Owns one broker connection (re-established with backoff) and the request handlers."""

    def __init__(
        self,
        *,
        service: InferenceService,
        settings: MqttSettings,
        address: BrokerAddress,
        protocol: str,
        edge: Edge,
    ) -> None:
        self._service = service
        self._edge = edge.for_transport(TRANSPORT)
        self._settings = settings
        self._address = address
        self._v5 = protocol == "5"
        self._prefix = settings.topic_prefix.rstrip("/")
        self._head = f"{self._prefix}/infer/"
        self._limit = settings.receive_maximum
        self._reply_qos = settings.qos
        # Requests taken and not finished (inference running, or reply not yet acknowledged);
        # beyond Receive Maximum, arrivals wait in the backlog (a broker that does not enforce
        # the limit, or QoS 0) unacknowledged.
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._backlog: deque[tuple[_Connection, Message]] = deque()
        self._backlog_limit = settings.max_backlog
        self._resume_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._routes: dict[str, tuple[str, str] | None] = {}
        self._trust = DeviceTrust(
            namespace=ReplyNamespace(settings.response_topic_pattern, self._prefix),
            identity=settings.device_identity,
            identity_property=settings.identity_property,
        )
        # (device, reply topic + correlation or id) -> monotonic time first seen: redeliveries
        # are answered once.
        self._seen: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        # key -> replies lost with their connection before the broker acknowledged them.
        self._reply_attempts: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._connection: _Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connected = asyncio.Event()
        self._stopping = asyncio.Event()
        self.subscribed_topic: str | None = None
        service.metrics.watch_mqtt(
            f"{address.host}:{address.port}",
            connected=self.connected.is_set,
            in_flight=lambda: self._in_flight,
            backlog=lambda: len(self._backlog),
        )

    @property
    def in_flight(self) -> int:
        """Requests taken from the broker and not yet ended (answered and acknowledged, or
        released for redelivery)."""
        return self._in_flight

    @property
    def request_filter(self) -> str:
        return f"{self._prefix}/infer/+/req/+"

    async def run(self) -> None:
        """Connect, serve, and reconnect with exponential backoff until ``shutdown``."""
        self._loop = asyncio.get_running_loop()
        delay = self._settings.reconnect_min_s
        while not self._stopping.is_set():
            try:
                client, connection = self._client()
                async with client:
                    delay = self._settings.reconnect_min_s
                    await self._subscribe(client)
                    self.connected.set()
                    log.info(
                        "MQTT: connected to %s:%d (MQTT %s), subscribed to %s",
                        self._address.host,
                        self._address.port,
                        "5" if self._v5 else "3.1.1",
                        self.subscribed_topic,
                    )
                    if await self._serve_until_stopped(client, connection):
                        return
            except aiomqtt.MqttError as exc:
                log.warning(
                    "MQTT: connection to %s:%d lost or refused (%s); retrying in %.1f s",
                    self._address.host,
                    self._address.port,
                    exc,
                    delay,
                )
            except Exception:
                # Anything else is a bug or a bad setting; HTTP keeps serving meanwhile.
                log.exception("MQTT: adapter failed; retrying in %.1f s", delay)
            finally:
                # Readiness turns 503 at once, not after the taken requests finished.
                self.connected.clear()
                await self._connection_closed()
            with contextlib.suppress(TimeoutError):  # jitter spreads replicas' reconnects
                await asyncio.wait_for(self._stopping.wait(), delay * (0.5 + random.random()))
            delay = min(delay * 2, self._settings.reconnect_max_s)
            if not self._stopping.is_set():
                self._service.metrics.mqtt_reconnects.inc()

    async def _serve_until_stopped(self, client: aiomqtt.Client, connection: _Connection) -> bool:
        """Serve until the connection fails (raises) or ``shutdown`` (returns True after
        answering every request already taken, so none waits for a redelivery)."""
        # Requests arrive through the paho callbacks; aiomqtt's message stream stays empty and
        # only tells us when the connection is gone.
        watcher = asyncio.create_task(_until_disconnected(client), name="mqtt-watch")
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({watcher, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if self._stopping.is_set() and not watcher.done():
                self._backlog.clear()  # not acknowledged: the next session gets them
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), self._settings.drain_timeout_s)
                return True
        finally:
            stopping.cancel()
            if not watcher.done():
                watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher  # re-raises the connection error, if that is why it ended
        return True

    async def _connection_closed(self) -> None:
        """Forget the requests of a connection that is gone: the broker redelivers those not
        acknowledged, and each must then be answered again rather than taken as a duplicate.
        The inferences still running finish first, so that none of them can race its own
        redelivery on the next connection."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        connection.alive = False
        self._backlog.clear()
        for delivery in list(connection.awaiting_puback.values()):
            self._count_lost_reply(delivery.key)
            self._end(delivery, acknowledge=False)
        connection.awaiting_puback.clear()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._settings.drain_timeout_s)

    async def shutdown(self) -> None:
        """Stop taking requests, answer those taken, disconnect."""
        self._stopping.set()

    def _client(self) -> tuple[aiomqtt.Client, _Connection]:
        s = self._settings
        properties: Properties | None = None
        if self._v5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = s.session_expiry_s
            properties.ReceiveMaximum = s.receive_maximum
            # The broker never sends us a packet above this (it drops it instead): what a
            # device can make the gateway read into memory. Twice the payload limit, so a
            # payload over the limit by less than that still gets its 413 error reply.
            properties.MaximumPacketSize = 2 * s.max_payload_bytes + 65536
        tls_context: ssl.SSLContext | None = None
        if self._address.tls:
            tls_context = ssl.create_default_context(cafile=s.ca_file)
            if s.cert_file is not None:
                tls_context.load_cert_chain(s.cert_file, s.key_file)
        # MQTT 5 spells a persistent session as clean_start=False (clean_session is 3.1.1's).
        v5_session: dict[str, Any] = {"clean_start": False} if self._v5 else {}
        client = aiomqtt.Client(
            self._address.host,
            self._address.port,
            identifier=s.client_id,
            username=s.username,
            password=s.password.get_secret_value() if s.password else None,
            protocol=aiomqtt.ProtocolVersion.V5 if self._v5 else aiomqtt.ProtocolVersion.V311,
            # A persistent session: requests published while we reconnect wait for us.
            clean_session=None if self._v5 else False,
            **v5_session,
            properties=properties,
            keepalive=s.keepalive_s,
            tls_context=tls_context,
            tls_insecure=s.tls_insecure if self._address.tls else None,
            # Replies in flight: one per request taken, and those are bounded by the limit.
            max_inflight_messages=max(20, s.receive_maximum),
            # Nagle's algorithm holds small QoS 1 packets back 40-90 ms: off.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        inner: paho.Client = client._client
        # aiomqtt has no manual-ack option of its own; paho's is the documented way to ack a
        # QoS 1 message after it was processed rather than on receipt.
        inner.manual_ack_set(True)
        connection = _Connection(inner)
        # Installed before connecting: a persistent session's backlog arrives right after the
        # CONNACK, before aiomqtt hands the client over.
        inner.on_message = self._on_message
        if self._v5:
            # An instance attribute: paho's packet dispatch calls ``self._handle_publish()``.
            inner._handle_publish = self._publish_reader(inner)  # type: ignore[method-assign]
        inner.on_publish = self._puback_handler(connection, inner.on_publish)
        inner.on_socket_register_write = self._coalesced_writes(
            inner, inner.on_socket_register_write
        )
        self._connection = connection
        return client, connection

    async def _subscribe(self, client: aiomqtt.Client) -> None:
        s = self._settings
        plain = self.request_filter
        want_shared = s.shared_subscription == "on" or (
            s.shared_subscription == "auto" and self._v5
        )
        if want_shared:
            shared = f"$share/{s.share_group}/{plain}"
            granted = await client.subscribe(shared, qos=s.qos)
            codes = [getattr(c, "value", c) for c in granted]
            if all(c in (0, 1, 2) for c in codes):
                self.subscribed_topic = shared
                return
            if s.shared_subscription == "on" or _SHARED_NOT_SUPPORTED not in codes:
                raise aiomqtt.MqttError(f"subscription to {shared} refused: {codes}")
            log.info("MQTT: broker has no shared subscriptions; subscribing plainly")
        granted = await client.subscribe(plain, qos=s.qos)
        codes = [getattr(c, "value", c) for c in granted]
        if not all(c in (0, 1, 2) for c in codes):
            raise aiomqtt.MqttError(f"subscription to {plain} refused: {codes}")
        self.subscribed_topic = plain

    # -- paho callbacks (event loop thread) ------------------------------------------------

    def _on_message(self, _client: paho.Client, _userdata: object, message: Message) -> None:
        connection = self._connection
        if connection is None or not connection.alive or self._stopping.is_set():
            return  # not acknowledged: the broker redelivers it to the next session
        if self._in_flight >= self._limit:
            if len(self._backlog) < self._backlog_limit:
                self._backlog.append((connection, message))
            else:
                self._refuse_overflow(connection, message)
            return
        self._take(connection, message)

    def _publish_reader(self, client: paho.Client) -> Callable[[], paho.MQTTErrorCode]:
        """paho decodes an incoming MQTT 5 PUBLISH's properties through ``Properties`` objects
        (tens of µs per request) and wraps it in an ``MQTTMessage`` with a lock; requests are
        decoded here instead into a plain record. Anything unusual (QoS 2, a topic alias, a
        property a request does not carry, a malformed packet) goes to paho's own code."""
        paho_reader = client._handle_publish

        def handle_publish() -> paho.MQTTErrorCode:
            packet = client._in_packet
            try:
                message = parse_publish(packet["command"], bytes(packet["packet"]))
            except (ValueError, IndexError, struct.error, UnicodeDecodeError):
                message = None
            if message is None:
                return paho_reader()
            self._on_message(client, None, message)
            return paho.MQTT_ERR_SUCCESS

        return handle_publish

    def _puback_handler(
        self, connection: _Connection, aiomqtt_on_publish: Callable[..., None] | None
    ) -> Callable[..., None]:
        def on_publish(
            client: paho.Client, userdata: object, mid: int, reason: Any, props: Any
        ) -> None:
            delivery = connection.awaiting_puback.pop(mid, None)
            if delivery is None:
                if aiomqtt_on_publish is not None:  # a publish of aiomqtt's own
                    aiomqtt_on_publish(client, userdata, mid, reason, props)
                return
            self._end(delivery, acknowledge=True)

        return on_publish

    def _coalesced_writes(
        self, client: paho.Client, aiomqtt_register: Callable[..., None] | None
    ) -> Callable[..., None]:
        """paho asks for a write after every packet it queues; aiomqtt answers with a
        thread-safe wake-up and an epoll writer each time. Here, on the loop thread, the first
        request of an event-loop pass schedules one ``loop_write`` that sends everything queued
        by then (replies and acks together); only a full socket buffer falls back to
        aiomqtt's writer."""
        loop = self._loop
        assert loop is not None and aiomqtt_register is not None
        loop_thread = threading.get_ident()
        scheduled = False

        def flush() -> None:
            nonlocal scheduled
            scheduled = False
            sock = client.socket()
            # paho sends packet by packet, and with Nagle off each send is a segment the
            # broker wakes up for: corked, a batch's replies (or acks) leave as few segments.
            cork = _TCP_CORK is not None and isinstance(sock, socket.socket)
            cork = cork and len(getattr(client, "_out_packet", ())) > 1
            try:
                if cork:
                    sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1)  # type: ignore[union-attr]
                client.loop_write()
            except Exception as exc:  # aiomqtt's writer reports a broken connection
                log.debug("MQTT: write failed: %s", exc)
            finally:
                if cork:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 0)  # type: ignore[union-attr]
            sock = client.socket()
            if client.want_write() and sock is not None:
                aiomqtt_register(client, None, sock)

        def register(c: paho.Client, userdata: object, sock: Any) -> None:
            nonlocal scheduled
            if threading.get_ident() != loop_thread:
                aiomqtt_register(c, userdata, sock)
            elif not scheduled:
                scheduled = True
                loop.call_soon(flush)

        return register

    # -- one request -----------------------------------------------------------------------

    def _take(self, connection: _Connection, message: Message) -> None:
        """Take a request from the broker: from here on it ends exactly once (``_end``):
        answered (with its inference or an error) and acknowledged, or, when its connection is
        gone, left unacknowledged for the broker to redeliver. One task per request does the
        rest, so a slow decode or inference never holds up the receive callback."""
        self._in_flight += 1
        self._idle.clear()
        try:
            route = self._route(message)
        except Exception as exc:  # a topic or property nobody can answer to
            log.debug("MQTT: request on %r cannot be routed: %s", message.topic, exc)
            route = None
        if route is None:  # not a request topic of ours: nothing to answer, only acknowledge
            self._acknowledge(connection, message.mid, message.qos)
            self._finish()
            return
        delivery = _Delivery(connection, message.mid, message.qos, route)
        task = asyncio.get_running_loop().create_task(self._serve(delivery, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refuse_overflow(self, connection: _Connection, message: Message) -> None:
        """Beyond the in-flight limit and a full backlog (a broker that does not enforce
        Receive Maximum, e.g. MQTT 3.1.1): answered at once with a retryable error, never
        dropped in silence and never buffered without bound."""
        self._in_flight += 1
        self._idle.clear()
        try:
            route = self._route(message)
        except Exception:
            route = None
        if route is None:
            self._acknowledge(connection, message.mid, message.qos)
            self._finish()
            return
        delivery = _Delivery(connection, message.mid, message.qos, route)
        busy = Overloaded(
            f"the gateway has {self._in_flight - 1} MQTT requests in flight and "
            f"{len(self._backlog)} waiting; retry later",
            retry_after=1.0,
        )
        self._reply_error(delivery, busy, None)

    async def _serve(self, delivery: _Delivery, message: Message) -> None:
        route = delivery.route
        try:
            phase: Phase = "decode"
            try:
                request, fmt = await self._decode(message, route)
                delivery.key = self._dedupe_key(route, request.id)
                if delivery.key is not None and self._is_duplicate(delivery.key, time.monotonic()):
                    log.debug("MQTT: duplicate of %s from %s ignored", request.id, route.device)
                    delivery.key = None  # the first delivery's key: not ours to forget
                    self._service.metrics.mqtt_duplicates.inc()
                    self._end(delivery, acknowledge=True)  # answered by the first delivery
                    return
                if self._reply_lost_too_often(delivery):
                    return
                phase = "infer"
                response = await self._service.infer(request, transport=TRANSPORT)
                reply, json_len = oip.encode_response(response, fmt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # RecursionError and MemoryError included
                err = self._edge.reject(exc, phase=phase, model=route.model)
                self._reply_error(delivery, err, None)
                return
            if json_len is None:
                self._reply(delivery, _with_status(reply), False, 200)
            else:
                self._reply(delivery, oip.frame(reply, json_len), True, 200)
        except BaseException:
            # Cancelled (shutdown, connection lost) or a failure while replying: unanswered, so
            # the broker's redelivery must be answered rather than taken for a duplicate.
            self._end(delivery, acknowledge=False)
            raise

    async def _decode(
        self, message: Message, route: _Route
    ) -> tuple[InferenceRequest, oip.OutputFormat]:
        route.raise_if_refused()  # answered as 403 on the device's own reply topic
        payload = message.payload
        limit = self._settings.max_payload_bytes
        if len(payload) > limit:
            raise PayloadTooLarge(f"payload of {len(payload)} bytes exceeds the limit of {limit}")
        body, header_length = oip.unframe(bytes(payload))  # paho hands over bytes: no copy
        request, fmt = await self._edge.decode_oip(
            body, model=route.model, version=None, header_length=header_length
        )
        if route.correlation is None and request.id is None:
            raise BadRequest(
                "a request without Correlation Data (e.g. MQTT 3.1.1) needs an 'id' to "
                "correlate the reply"
            )
        if request.timeout_s is None:
            expiry = _property(message, "MessageExpiryInterval")
            if expiry:
                request.timeout_s = float(expiry)
        # A binary request gets binary outputs unless it chose otherwise.
        if header_length is not None and not fmt.binary and request.outputs is None:
            fmt = oip.OutputFormat(binary_all=True)
        return request, fmt

    def _reply_error(self, delivery: _Delivery, err: GatewayError, request_id: str | None) -> None:
        doc = error_document(err, request_id)
        self._reply(delivery, json.dumps(doc).encode(), False, err.status)

    def _reply(self, delivery: _Delivery, body: bytes, binary: bool, status: int) -> None:
        """Hand the reply to paho; the request is acknowledged once the broker has the reply
        (its PUBACK at QoS 1; at QoS 0 the request's PUBACK follows the reply on the wire)."""
        connection, route = delivery.connection, delivery.route
        if not connection.alive:
            self._end(delivery, acknowledge=False)
            return
        properties = reply_properties(binary, status, route.correlation) if route.v5 else None
        try:
            info = connection.client.publish(
                route.reply_topic,
                body,
                qos=self._reply_qos,
                properties=cast(Properties | None, properties),
            )
        except ValueError as exc:  # e.g. a Response Topic with wildcards: never answerable
            log.warning("MQTT: reply to %s cannot be published: %s", route.device, exc)
            self._end(delivery, acknowledge=True)
            return
        if info.rc != paho.MQTT_ERR_SUCCESS:
            log.warning(
                "MQTT: reply to %s not published (%s); the broker will redeliver",
                route.device,
                paho.error_string(info.rc),
            )
            self._end(delivery, acknowledge=False)
            return
        if self._reply_qos == 0:
            self._end(delivery, acknowledge=True)
        else:
            connection.awaiting_puback[info.mid] = delivery

    def _end(self, delivery: _Delivery, *, acknowledge: bool) -> None:
        """The one way a request ends: acknowledged (answered), or not (the broker redelivers
        it, and then it must be answered again, not taken for a duplicate). Idempotent, so
        no path can free its in-flight slot twice."""
        if delivery.ended:
            return
        delivery.ended = True
        if acknowledge:
            self._acknowledge(delivery.connection, delivery.mid, delivery.qos)
        else:
            self._forget(delivery.key)
        self._finish()

    def _acknowledge(self, connection: _Connection, mid: int, qos: int) -> None:
        if qos > 0 and connection.alive:
            connection.client.ack(mid, qos)

    def _finish(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
        if self._backlog and not self._resume_scheduled:
            self._resume_scheduled = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._resume_scheduled = False
        while self._backlog and self._in_flight < self._limit:
            connection, message = self._backlog.popleft()
            if connection.alive and not self._stopping.is_set():
                self._take(connection, message)

    def _count_lost_reply(self, key: tuple[str, bytes] | None) -> None:
        if key is None:
            return
        self._reply_attempts[key] = self._reply_attempts.pop(key, 0) + 1
        while len(self._reply_attempts) > _DEDUPE_ENTRIES:  # bounded: oldest forgotten
            self._reply_attempts.popitem(last=False)

    def _reply_lost_too_often(self, delivery: _Delivery) -> bool:
        """Answer a request whose replies kept taking the connection down with an error on the
        device's own reply topic (always publishable), once; True when it did."""
        key, route = delivery.key, delivery.route
        if key is None or self._reply_attempts.get(key, 0) < _MAX_REPLY_ATTEMPTS:
            return False
        del self._reply_attempts[key]
        log.warning(
            "MQTT: the reply to a request from %s was lost with the connection %d times; "
            "answering on its default reply topic instead",
            route.device,
            _MAX_REPLY_ATTEMPTS,
        )
        delivery.route = replace(
            route, reply_topic=f"{self._prefix}/infer/{route.model}/res/{route.device}"
        )
        err = Undeliverable(
            f"the reply to this request was refused by the broker {_MAX_REPLY_ATTEMPTS} times "
            f"(the connection dropped each time); check its Response Topic and size"
        )
        self._reply_error(delivery, self._edge.reject(err, phase="infer"), None)
        return True

    def _forget(self, key: tuple[str, bytes] | None) -> None:
        if key is not None:
            self._seen.pop(key, None)  # let the redelivery be answered

    def _route(self, message: Message) -> _Route | None:
        topic: str = message.topic
        if topic in self._routes:
            parsed = self._routes[topic]
        else:
            parsed = self._parse_topic(topic)
            if len(self._routes) >= _ROUTE_CACHE_ENTRIES:
                self._routes.clear()  # devices come and go: keep the cache bounded
            self._routes[topic] = parsed
        if parsed is None:
            return None
        model, device = parsed
        props = message.properties
        response_topic = getattr(props, "ResponseTopic", None) if props is not None else None
        correlation = getattr(props, "CorrelationData", None) if props is not None else None
        user_properties = getattr(props, "UserProperty", None) if props is not None else None
        refusal = self._trust.refusal(model, device, response_topic, user_properties)
        default = f"{self._prefix}/infer/{model}/res/{device}"
        reply = default if refusal is not None or not response_topic else response_topic
        return _Route(model, device, reply, correlation, self._v5, refusal)

    def _parse_topic(self, topic: str) -> tuple[str, str] | None:
        if not topic.startswith(self._head):
            return None
        parts = topic[len(self._head) :].split("/")
        if len(parts) != 3 or parts[1] != "req" or not parts[0] or not parts[2]:
            return None
        if any("+" in p or "#" in p for p in parts):
            return None  # not a topic name (a broker never delivers one): no device to answer
        return parts[0], parts[2]

    @staticmethod
    def _dedupe_key(route: _Route, request_id: str | None) -> tuple[str, bytes] | None:
        """(device, kind + reply topic + correlation or id): a device's ids are its own, so
        another device reusing them (on its own topic, or on this one without an ACL that
        stops it) is a different request unless it also names this device's reply topic. The
        reply topic is length-prefixed (MQTT caps it at 65535 bytes) so no two keys collide."""
        if route.correlation is not None:
            kind, value = b"c", route.correlation
        elif request_id is not None:
            kind, value = b"i", request_id.encode()
        else:
            return None
        topic = route.reply_topic.encode()
        return route.device, kind + _U16.pack(len(topic)) + topic + value

    def _is_duplicate(self, key: tuple[str, bytes], now: float) -> bool:
        while self._seen:
            oldest_key, seen_at = next(iter(self._seen.items()))
            if len(self._seen) < _DEDUPE_ENTRIES and now - seen_at < self._settings.dedupe_window_s:
                break
            del self._seen[oldest_key]
        if key in self._seen:
            return True
        self._seen[key] = now
        return False


async def _until_disconnected(client: aiomqtt.Client) -> None:
    async for _ in client.messages:
        pass
    raise aiomqtt.MqttError("message stream ended")


def _property(message: Message, name: str) -> Any:
    props = message.properties
    return getattr(props, name, None) if props is not None else None


def _with_status(reply: bytes) -> bytes:
    # Replies carry their status in the body too, for MQTT 3.1.1 devices (no user properties).
    return reply[:-1] + b',"status":200}'
