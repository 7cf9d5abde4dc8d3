"""The MQTT adapter's request flow: requests from ``<prefix>/infer/<model>/req/<device>``,
replies on the MQTT 5 Response Topic (Correlation Data echoed) or on
``<prefix>/infer/<model>/res/<device>``. The wire contract is docs/mqtt.md.

Delivery: QoS 1 with manual acknowledgement, a request acknowledged right behind its reply, on
the same connection and in the same corked write (``paho_seam``): the broker reads one TCP
stream in order and holds both or neither, so it redelivers (on the persistent session,
``session``) a request whose reply it never got and not one it answered. A request ends at its
reply's PUBACK, holding a slot until then. Each request taken is one ``_Delivery`` that ends
exactly once (``_end``): routed in paho's receive callback (through ``paho_seam``), then one
task decodes it at the shared edge, awaits its inference and hands the reply to paho.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, cast

import aiomqtt
import paho.mqtt.client as paho
from paho.mqtt.properties import Properties

from gateway.codecs import json_codec, oip
from gateway.core import ServingCore
from gateway.edge import Edge, Phase, error_document
from gateway.errors import (
    BadRequest,
    DuplicateRequestId,
    GatewayError,
    Overloaded,
    PayloadTooLarge,
    Undeliverable,
)
from gateway.mqtt.paho_seam import Message, install_fast_path
from gateway.mqtt.routes import Route, Router, dedupe_key, peek_id, unread_id
from gateway.mqtt.seen import MAX_REPLY_ATTEMPTS, Earlier, SeenRequests, digest
from gateway.mqtt.session import BrokerAddress, BrokerSession
from gateway.mqtt.wire import reply_properties, with_status
from gateway.settings.schema import MqttSettings
from gateway.types import InferenceRequest
from models.batching_rule import AnswerLag

log = logging.getLogger("gateway.mqtt")

TRANSPORT = "mqtt"


@dataclass(slots=True)
class _Delivery:
    """One request taken from the broker, from receipt until it ends: what its reply and its
    acknowledgement need (``mid``/``qos`` of the request, where the reply goes, the key under
    which it counts as seen for duplicate detection)."""

    connection: _Connection
    mid: int
    qos: int
    route: Route
    key: tuple[str, bytes] | None = None
    ended: bool = False
    refusal: bool = False  # an overflow refusal: holds no serving slot
    handed_at: float = 0.0  # when its QoS 1 reply went to paho (monotonic)
    acknowledged: bool = False  # the request's PUBACK went out (behind its reply)


@dataclass(slots=True)
class _Connection:
    """One broker connection's data path: the paho client under aiomqtt and the requests
    answered on it whose reply the broker has not acknowledged yet (by the reply's packet id)."""

    client: paho.Client
    awaiting_puback: dict[int, _Delivery] = field(default_factory=dict)
    alive: bool = True


class MqttAdapter:
    """Owns one broker connection (re-established with backoff) and the request handlers."""

    def __init__(
        self,
        *,
        service: ServingCore,
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
        self._limit = settings.receive_maximum
        self._reply_qos = settings.qos
        # Requests taken and not finished (inference running, or reply not yet acknowledged);
        # beyond Receive Maximum, arrivals wait in the backlog (a broker that does not enforce
        # the limit, or QoS 0) unacknowledged.
        self._in_flight = 0
        self._refusing = 0  # of those, overflow refusals awaiting their reply's PUBACK
        # Of those, answered and acknowledged, awaiting their reply's PUBACK: the broker may
        # send new requests for their places, so they are bounded apart (``_has_slot``).
        self._awaiting = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._backlog: deque[tuple[_Connection, Message]] = deque()
        self._backlog_limit = settings.max_backlog
        self._resume_scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._router = Router(settings, v5=self._v5)
        self._seen = SeenRequests(settings.dedupe_window_s)
        # Publish to PUBACK of recent replies (99th percentile): a request's answer must be
        # ready this much before its deadline, or its reply reaches the device late. (At the
        # 90th, admitted answers of a 3x overload ended 0.5-3% past the SLO at the device.)
        self._reply_leg = AnswerLag(quantile=0.99)
        self._connection: _Connection | None = None
        self._stopping = asyncio.Event()
        self._session = BrokerSession(
            settings=settings,
            address=address,
            v5=self._v5,
            request_filter=self.request_filter,
            handler=self,
            on_reconnect=service.metrics.mqtt_reconnects.inc,
        )
        service.metrics.watch_mqtt(
            f"{address.host}:{address.port}",
            connected=self.connected.is_set,
            in_flight=lambda: self._in_flight,
            backlog=lambda: self.backlog,
        )

    @property
    def in_flight(self) -> int:
        """Requests taken from the broker and not yet ended (answered and acknowledged, or
        released for redelivery)."""
        return self._in_flight

    @property
    def backlog(self) -> int:
        """Requests received beyond the in-flight limit, waiting to be taken."""
        return len(self._backlog)

    @property
    def reply_leg(self) -> AnswerLag:
        """Publish-to-PUBACK times of recent replies; ``high`` comes off each deadline."""
        return self._reply_leg

    @property
    def request_filter(self) -> str:
        return f"{self._prefix}/infer/+/req/+"

    @property
    def connected(self) -> asyncio.Event:
        """Set while connected and subscribed (readiness asks it)."""
        return self._session.connected

    @property
    def subscribed_topic(self) -> str | None:
        return self._session.subscribed_topic

    async def run(self) -> None:
        """Serve until ``shutdown``: the session connects, reconnects and calls back."""
        await self._session.run(self._stopping)

    # -- the session's callbacks (SessionHandler) ------------------------------------------

    def attach(self, client: aiomqtt.Client) -> None:
        inner = install_fast_path(
            client,
            v5=self._v5,
            on_message=self._on_message,
            on_reply_acked=self._reply_acked,
            loop=asyncio.get_running_loop(),
            max_unsent=self._settings.max_unsent_packets,
            on_read_paused=self._service.metrics.mqtt_read_pauses.inc,
        )
        self._connection = _Connection(inner)

    async def wait_idle(self, timeout_s: float) -> bool:
        """Whether every request taken has ended (answered and acknowledged, or released)
        within ``timeout_s``. A device can hold its reply before the gateway's bookkeeping of
        that reply's acknowledgement has run: wait on this, not on a count read at once."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def drain(self) -> None:
        self._backlog.clear()  # not acknowledged: the next session gets them
        await self.wait_idle(self._settings.drain_timeout_s)

    async def detach(self) -> None:
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
            self._seen.reply_lost(delivery.key)
            self._end(delivery, acknowledge=False)
        connection.awaiting_puback.clear()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self._settings.drain_timeout_s)

    async def shutdown(self) -> None:
        """Stop taking requests, answer those taken, disconnect."""
        self._stopping.set()

    # -- paho callbacks (event loop thread, through the seam) ------------------------------

    def _on_message(self, _client: paho.Client, _userdata: object, message: Message) -> None:
        connection = self._connection
        if connection is None or not connection.alive or self._stopping.is_set():
            return  # not acknowledged: the broker redelivers it to the next session
        if not self._has_slot():
            if not self._backlog_limit:
                self._refuse_overflow(connection, message)
                return
            # Full: the oldest waiting request is refused, and the newest served first
            # (``_resume``): under sustained overload a first-in-first-out backlog would serve
            # only requests that already waited out their deadlines in it.
            if len(self._backlog) >= self._backlog_limit:
                self._refuse_overflow(*self._backlog.popleft())
            self._backlog.append((connection, message))
            return
        self._take(connection, message)

    def _reply_acked(self, mid: int) -> bool:
        connection = self._connection
        delivery = connection.awaiting_puback.pop(mid, None) if connection is not None else None
        if delivery is None:
            return False
        self._reply_leg.observe(time.monotonic() - delivery.handed_at)
        self._end(delivery, acknowledge=True)
        return True

    # -- one request -----------------------------------------------------------------------

    def _take(self, connection: _Connection, message: Message) -> None:
        """Take a request from the broker: from here on it ends exactly once (``_end``):
        answered (with its inference or an error) and acknowledged, or, when its connection is
        gone, left unacknowledged for the broker to redeliver. One task per request does the
        rest, so a slow decode or inference never holds up the receive callback."""
        self._in_flight += 1
        self._idle.clear()
        try:
            route = self._router.route(message)
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
        Receive Maximum: MQTT 3.1.1, and Mosquitto 2.0 under a sustained flood): answered at
        once with a retryable error, never dropped in silence and never buffered without
        bound. The refusal holds no serving slot (under a flood, refusals would otherwise take
        every slot and nothing would be served) and goes out at QoS 0 (``_reply``)."""
        self._in_flight += 1
        self._idle.clear()
        try:
            route = self._router.route(message)
        except Exception:
            route = None
        if route is None:
            self._acknowledge(connection, message.mid, message.qos)
            self._finish()
            return
        delivery = _Delivery(connection, message.mid, message.qos, route, refusal=True)
        self._refusing += 1
        busy = Overloaded(
            f"the gateway has {self._in_flight - 1} MQTT requests in flight and "
            f"{len(self._backlog)} waiting; retry later",
            retry_after=1.0,
        )
        # Without Correlation Data (MQTT 3.1.1) the reply is matched by the request's id alone.
        request_id = peek_id(bytes(message.payload)) if route.correlation is None else None
        self._reply_error(delivery, self._edge.reject(busy, phase="decode"), request_id)

    async def _serve(self, delivery: _Delivery, message: Message) -> None:
        route = delivery.route
        try:
            phase: Phase = "decode"
            try:
                request, fmt = await self._decode(message, route)
                delivery.key = dedupe_key(route, request.id)
                # Hashed once, and only for a request that can be matched at all.
                payload = digest(bytes(message.payload)) if delivery.key is not None else b""
                earlier = self._seen.earlier(delivery.key, payload)
                if earlier is not None:
                    self._answer_repeat(delivery, earlier, request.id, payload)
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
                self._reply_error(delivery, err, unread_id(route, err, message))
                return
            if json_len is None:
                self._reply(delivery, with_status(reply), False, 200)
            else:  # the binary reply's JSON header carries the status too
                header = with_status(reply[:json_len])
                self._reply(delivery, oip.frame(header + reply[json_len:], len(header)), True, 200)
        except BaseException:
            # Cancelled (shutdown, connection lost) or a failure while replying: unanswered, so
            # the broker's redelivery must be answered rather than taken for a duplicate.
            self._end(delivery, acknowledge=False)
            raise

    async def _decode(
        self, message: Message, route: Route
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
        request.delivery_s = self._reply_leg.high
        # A binary request gets binary outputs unless it chose otherwise.
        if header_length is not None and not fmt.binary and request.outputs is None:
            fmt = oip.OutputFormat(binary_all=True)
        return request, fmt

    def _reply_error(self, delivery: _Delivery, err: GatewayError, request_id: str | None) -> None:
        doc = error_document(err, request_id)
        self._reply(delivery, json_codec.dumps(doc), False, err.status)

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
                # An overflow refusal goes at QoS 0: the broker's window for our QoS 1 replies
                # (its Receive Maximum) would otherwise hold the replies of served requests
                # behind a flood of refusals, each costing a PUBACK to process.
                qos=0 if delivery.refusal else self._reply_qos,
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
        if status >= 500:
            self._seen.forget(delivery.key)  # retryable: a retry is a new attempt, not a repeat
        else:
            self._seen.remember_reply(delivery.key, (body, binary, status))
        if self._reply_qos == 0 or delivery.refusal:
            self._end(delivery, acknowledge=True)
        else:
            delivery.handed_at = time.monotonic()
            connection.awaiting_puback[info.mid] = delivery
            # Behind the reply in paho's write queue: the broker gets both or neither.
            self._acknowledge(connection, delivery.mid, delivery.qos)
            delivery.acknowledged = True
            self._awaiting += 1

    def _answer_repeat(
        self, delivery: _Delivery, earlier: Earlier, request_id: str | None, payload: bytes
    ) -> None:
        """A request whose key was seen within the dedupe window: a redelivery (same payload)
        gets the first one's reply again, or none while that is still being answered; another
        request reusing the id is refused, so the device learns why it got no answer."""
        delivery.key = None  # the first delivery's key: not this one's to forget or remember
        self._service.metrics.mqtt_duplicates.inc()
        route = delivery.route
        if earlier.digest != payload:
            log.info(
                "MQTT: %s reused request id %r within %g s; refused",
                route.device,
                request_id or route.correlation,
                self._settings.dedupe_window_s,
            )
            reused = DuplicateRequestId(
                f"request id {request_id!r} (or its Correlation Data) was used by another "
                f"request of device {route.device!r} within {self._settings.dedupe_window_s:g} s; "
                "give each request its own"
            )
            self._reply_error(delivery, self._edge.reject(reused, phase="decode"), request_id)
        elif earlier.reply is not None:
            log.debug("MQTT: redelivery of %s from %s answered again", request_id, route.device)
            self._reply(delivery, *earlier.reply)
        else:
            self._end(delivery, acknowledge=True)  # the first delivery's reply is on its way

    def _end(self, delivery: _Delivery, *, acknowledge: bool) -> None:
        """The one way a request ends: acknowledged (answered), or not (the broker redelivers
        it, and then it must be answered again, not taken for a duplicate). Idempotent, so
        no path can free its in-flight slot twice."""
        if delivery.ended:
            return
        delivery.ended = True
        self._refusing -= delivery.refusal
        self._awaiting -= delivery.acknowledged
        if not acknowledge:  # a redelivery must be answered, not taken for a repeat
            self._seen.forget(delivery.key)
        elif not delivery.acknowledged:
            self._acknowledge(delivery.connection, delivery.mid, delivery.qos)
        self._finish()

    def _acknowledge(self, connection: _Connection, mid: int, qos: int) -> None:
        if qos > 0 and connection.alive:
            connection.client.ack(mid, qos)

    def _has_slot(self) -> bool:
        """Fewer than ``receive_maximum`` being served and as many replies awaiting their
        PUBACK: paho's window for our replies (``session._new_client``) holds them all."""
        serving = self._in_flight - self._refusing - self._awaiting
        return serving < self._limit and self._awaiting < self._limit

    def _finish(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()
        if self._backlog and not self._resume_scheduled:
            self._resume_scheduled = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._resume_scheduled = False
        while self._backlog and self._has_slot():
            connection, message = self._backlog.pop()
            if connection.alive and not self._stopping.is_set():
                self._take(connection, message)

    def _reply_lost_too_often(self, delivery: _Delivery) -> bool:
        """Answer a request whose replies kept taking the connection down with an error on the
        device's own reply topic (always publishable), once; True when it did."""
        route = delivery.route
        if not self._seen.give_up_on_reply(delivery.key):
            return False
        log.warning(
            "MQTT: the reply to a request from %s was lost with the connection %d times; "
            "answering on its default reply topic instead",
            route.device,
            MAX_REPLY_ATTEMPTS,
        )
        delivery.route = replace(
            route, reply_topic=f"{self._prefix}/infer/{route.model}/res/{route.device}"
        )
        err = Undeliverable(
            f"the reply to this request was refused by the broker {MAX_REPLY_ATTEMPTS} times "
            f"(the connection dropped each time); check its Response Topic and size"
        )
        self._reply_error(delivery, self._edge.reject(err, phase="infer"), None)
        return True


def _property(message: Message, name: str) -> Any:
    props = message.properties
    return getattr(props, name, None) if props is not None else None
