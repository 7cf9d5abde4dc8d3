"""Where a request comes from and where its reply goes: the request topic parsed (cached,
bounded), the Response Topic checked against the device's trust rules (``gateway/mqtt/trust.py``),
and the key a request is known by for duplicate detection."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gateway.codecs import oip
from gateway.edge import OFFLOAD_BYTES
from gateway.errors import GatewayError
from gateway.mqtt.paho_seam import Message
from gateway.mqtt.refusals import RefusalLog
from gateway.mqtt.trust import DeviceTrust, ReplyNamespace
from gateway.settings.schema import MqttSettings

_ROUTE_CACHE_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request came from and where its reply goes.

    ``refusal`` is set when the request may not be served as sent (a Response Topic outside the
    device's reply namespace, a publisher identity that does not match the topic's device,
    gateway/mqtt/trust.py); ``reply_topic`` is then the device's own default reply topic. The
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


class Router:
    def __init__(
        self, settings: MqttSettings, *, v5: bool, refusals: RefusalLog | None = None
    ) -> None:
        self._prefix = settings.topic_prefix.rstrip("/")
        self._head = f"{self._prefix}/infer/"
        self._v5 = v5
        self._routes: dict[str, tuple[str, str] | None] = {}
        self._trust = DeviceTrust(
            namespace=ReplyNamespace(settings.response_topic_pattern, self._prefix),
            identity=settings.device_identity,
            identity_property=settings.identity_property,
        )
        self._refusals = refusals if refusals is not None else RefusalLog()

    def route(self, message: Message) -> Route | None:
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
        if refusal is not None:
            # Answered on the default topic only, never on the topic the device named: the
            # gateway cannot see the broker's ACL, and a topic outside the namespace may be
            # another device's reply topic (docs/mqtt.md, "Reply namespace").
            self._refusals.refused(device, refusal, default)
        reply = default if refusal is not None or not response_topic else response_topic
        return Route(model, device, reply, correlation, self._v5, refusal)

    def _parse_topic(self, topic: str) -> tuple[str, str] | None:
        if not topic.startswith(self._head):
            return None
        parts = topic[len(self._head) :].split("/")
        # No device: nobody to answer. No model (".../infer//req/<device>"): the device still
        # gets its 404, on ".../infer//res/<device>" (which its "+" subscription matches).
        if len(parts) != 3 or parts[1] != "req" or not parts[2]:
            return None
        if any("+" in p or "#" in p for p in parts):
            return None  # not a topic name (a broker never delivers one): no device to answer
        return parts[0], parts[2]


def dedupe_key(route: Route, request_id: str | None) -> tuple[str, bytes] | None:
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
    return route.device, kind + len(topic).to_bytes(2, "big") + topic + value


def unread_id(route: Route, err: GatewayError, message: Message) -> str | None:
    """The id of a request refused before its payload was read (an unknown model), when the
    device has no Correlation Data to match the reply by: without it an MQTT 3.1.1 device
    could match the refusal to none of its requests. Not looked for in large payloads."""
    if route.correlation is not None or err.request_id is not None:
        return None
    payload = bytes(message.payload)
    return peek_id(payload) if len(payload) < OFFLOAD_BYTES else None


def peek_id(payload: bytes) -> str | None:
    """The request's ``id`` when its JSON header reads (for refusals made without decoding)."""
    try:
        body, header_length = oip.unframe(payload)
        doc = json.loads(body if header_length is None else body[:header_length])
    except Exception:  # malformed in any way (RecursionError included): no id to give
        return None
    value = doc.get("id") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None
