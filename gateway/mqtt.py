"""MQTT adapter (aiomqtt on paho-mqtt): requests from ``<prefix>/infer/<model>/req/<device>``,
replies on the MQTT 5 Response Topic (Correlation Data echoed) or on
``<prefix>/infer/<model>/res/<device>``. The wire contract is docs/mqtt.md.

Delivery: QoS 1 with manual acknowledgement, so a request is acknowledged only after its reply
was published. The broker therefore sends at most Receive Maximum unacknowledged requests at once
(our in-flight bound), and redelivers what was not answered when the gateway reconnects to its
persistent session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import socket
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gateway.codecs import oip
from gateway.errors import BadRequest, GatewayError, PayloadTooLarge
from gateway.service import InferenceService
from gateway.settings import MqttSettings
from gateway.types import InferenceRequest

log = logging.getLogger("gateway.mqtt")

TRANSPORT = "mqtt"
BINARY_CONTENT_TYPE = "application/vnd.iotgw.oip+binary"
JSON_CONTENT_TYPE = "application/json"
_DEDUPE_ENTRIES = 20_000
_SHARED_NOT_SUPPORTED = 0x9E


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
    model: str
    device: str
    reply_topic: str
    correlation: bytes | None
    v5: bool


class MqttAdapter:
    """Owns one broker connection (re-established with backoff) and the request handlers."""

    def __init__(
        self,
        *,
        service: InferenceService,
        settings: MqttSettings,
        address: BrokerAddress,
        protocol: str,
    ) -> None:
        self._service = service
        self._settings = settings
        self._address = address
        self._v5 = protocol == "5"
        self._prefix = settings.topic_prefix.rstrip("/")
        self._slots = asyncio.Semaphore(settings.receive_maximum)
        self._handlers: set[asyncio.Task[None]] = set()
        # (device, correlation or id) -> monotonic time first seen: redeliveries are answered once.
        self._seen: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        self.connected = asyncio.Event()
        self._stopping = asyncio.Event()
        self.subscribed_topic: str | None = None

    @property
    def request_filter(self) -> str:
        return f"{self._prefix}/infer/+/req/+"

    async def run(self) -> None:
        """Connect, serve, and reconnect with exponential backoff until ``shutdown``."""
        delay = self._settings.reconnect_min_s
        while not self._stopping.is_set():
            try:
                async with self._client() as client:
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
                    if await self._serve_until_stopped(client):
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
            self.connected.clear()
            with contextlib.suppress(TimeoutError):  # jitter spreads replicas' reconnects
                await asyncio.wait_for(self._stopping.wait(), delay * (0.5 + random.random()))
            delay = min(delay * 2, self._settings.reconnect_max_s)

    async def _serve_until_stopped(self, client: aiomqtt.Client) -> bool:
        """Read requests until the connection fails (raises) or ``shutdown`` (returns True after
        answering every request already taken, so none waits for a redelivery)."""
        reader = asyncio.create_task(self._read(client), name="mqtt-read")
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader  # re-raises the connection error, if that is why it ended
        if self._handlers:
            await asyncio.wait(set(self._handlers), timeout=self._settings.drain_timeout_s)
        return True

    async def _read(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            # Backpressure: with Receive Maximum requests being handled, stop reading.
            await self._slots.acquire()
            task = asyncio.create_task(self._handle(client, message))
            self._handlers.add(task)
            task.add_done_callback(self._handler_done)
        raise aiomqtt.MqttError("message stream ended")

    async def shutdown(self) -> None:
        """Stop taking requests, answer those taken, disconnect."""
        self._stopping.set()

    def _handler_done(self, task: asyncio.Task[None]) -> None:
        self._handlers.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("MQTT handler failed", exc_info=task.exception())

    def _client(self) -> aiomqtt.Client:
        s = self._settings
        properties: Properties | None = None
        if self._v5:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = s.session_expiry_s
            properties.ReceiveMaximum = s.receive_maximum
        tls_context: ssl.SSLContext | None = None
        if self._address.tls:
            tls_context = ssl.create_default_context(cafile=s.ca_file)
            if s.cert_file is not None:
                tls_context.load_cert_chain(s.cert_file, s.key_file)
        client = aiomqtt.Client(
            self._address.host,
            self._address.port,
            identifier=s.client_id,
            username=s.username,
            password=s.password.get_secret_value() if s.password else None,
            protocol=aiomqtt.ProtocolVersion.V5 if self._v5 else aiomqtt.ProtocolVersion.V311,
            # A persistent session: requests published while we reconnect wait for us.
            clean_session=None if self._v5 else False,
            **({"clean_start": False} if self._v5 else {}),
            properties=properties,
            keepalive=s.keepalive_s,
            tls_context=tls_context,
            tls_insecure=s.tls_insecure if self._address.tls else None,
            max_inflight_messages=max(20, s.receive_maximum),
            # Nagle's algorithm holds small QoS 1 packets back 40-90 ms: off.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        # aiomqtt has no manual-ack option of its own; paho's is the documented way to ack a
        # QoS 1 message after it was processed rather than on receipt.
        client._client.manual_ack_set(True)
        return client

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

    # -- one request -----------------------------------------------------------------------

    async def _handle(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        started = time.monotonic()
        route = self._route(message)
        key: tuple[str, bytes] | None = None
        published = False
        try:
            if route is None:
                return  # not a request topic of ours: nothing to answer, only acknowledge
            payload = message.payload if isinstance(message.payload, bytes) else b""
            limit = self._settings.max_payload_bytes
            if len(payload) > limit:
                raise PayloadTooLarge(
                    f"payload of {len(payload)} bytes exceeds the limit of {limit}"
                )
            request, fmt = self._decode(message, route, payload)
            key = self._dedupe_key(route, request.id)
            if key is not None and self._is_duplicate(key, started):
                log.debug("MQTT: duplicate of %s from %s ignored", key[1], route.device)
                published = True  # answered (or being answered) by the first delivery
                return
            response = await self._service.infer(request, transport=TRANSPORT)
            reply, json_len = oip.encode_response(response, fmt)
            if json_len is None:
                await self._publish(client, route, _with_status(reply), False, status=200)
            else:
                await self._publish(client, route, oip.frame(reply, json_len), True, status=200)
            published = True
        except GatewayError as exc:
            if route is not None:
                # The id, when the payload could be read that far, lets MQTT 3.1.1 devices
                # match the error to their request.
                request_id = None if exc.status == 413 else _peek_id(message.payload)
                await self._publish_error(client, route, exc, request_id)
                published = True
        except aiomqtt.MqttError as exc:
            log.warning(
                "MQTT: reply to %s not published (%s); the broker will redeliver",
                route.device if route else "?",
                exc,
            )
        finally:
            if key is not None and not published:
                self._seen.pop(key, None)  # let the redelivery be answered
            if published or route is None:
                self._ack(client, message)

    def _decode(
        self, message: aiomqtt.Message, route: _Route, payload: bytes
    ) -> tuple[InferenceRequest, oip.OutputFormat]:
        body, header_length = oip.unframe(payload)
        request, fmt = oip.decode_request(
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

    async def _publish(
        self, client: aiomqtt.Client, route: _Route, body: bytes, binary: bool, *, status: int
    ) -> None:
        properties: Properties | None = None
        if route.v5:
            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType = BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE
            properties.UserProperty = [("status", str(status))]
            if route.correlation is not None:
                properties.CorrelationData = route.correlation
        await client.publish(route.reply_topic, body, qos=self._settings.qos, properties=properties)

    async def _publish_error(
        self, client: aiomqtt.Client, route: _Route, exc: GatewayError, request_id: str | None
    ) -> None:
        doc: dict[str, Any] = {"status": exc.status, "reason": exc.reason, "error": exc.message}
        if request_id is not None:
            doc["id"] = request_id
        if exc.retry_after is not None:
            doc["retry_after_s"] = round(exc.retry_after, 3)
        try:
            await self._publish(client, route, json.dumps(doc).encode(), False, status=exc.status)
        except aiomqtt.MqttError as pub_exc:
            log.warning("MQTT: error reply to %s not published: %s", route.device, pub_exc)
            raise

    def _ack(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        if message.qos > 0:
            client._client.ack(message.mid, message.qos)

    def _route(self, message: aiomqtt.Message) -> _Route | None:
        topic = message.topic.value
        head = f"{self._prefix}/infer/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head) :].split("/")
        if len(parts) != 3 or parts[1] != "req" or not parts[0] or not parts[2]:
            return None
        model, device = parts[0], parts[2]
        response_topic = _property(message, "ResponseTopic")
        correlation = _property(message, "CorrelationData")
        reply = response_topic or f"{self._prefix}/infer/{model}/res/{device}"
        return _Route(model, device, reply, correlation, self._v5)

    @staticmethod
    def _dedupe_key(route: _Route, request_id: str | None) -> tuple[str, bytes] | None:
        if route.correlation is not None:
            return route.device, b"c:" + route.correlation
        if request_id is not None:
            return route.device, b"i:" + request_id.encode()
        return None

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


def _property(message: aiomqtt.Message, name: str) -> Any:
    props = message.properties
    return getattr(props, name, None) if props is not None else None


def _peek_id(payload: object) -> str | None:
    """The request ``id`` if the payload's JSON header can be read, for error replies."""
    if not isinstance(payload, bytes):
        return None
    try:
        body, header_length = oip.unframe(payload)
        doc = json.loads(body if header_length is None else body[:header_length])
    except (BadRequest, ValueError):
        return None
    value = doc.get("id") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def _with_status(reply: bytes) -> bytes:
    # Replies carry their status in the body too, for MQTT 3.1.1 devices (no user properties).
    return reply[:-1] + b',"status":200}'
